/* A program with the common SIGCHLD handler -- reap every child that has changed state, without
 * blocking -- and two threads allocating.  memtrace's world-stop helper is a clone that inherits the
 * handler; before round 26 the handler ran in it on the SIGCHLD each stopped thread sends its tracer,
 * and its waitpid took the stop reports the helper waited for: no thread held, no stop clear.
 * Prints "ready" once the threads run. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile g_sink;
static volatile long g_reaped;

static void
on_chld (int sig)
{
  int status;
  (void) sig;
  while (waitpid (-1, &status, WNOHANG) > 0)
    g_reaped++;
}

__attribute__ ((noinline)) static void
reaper_alloc (unsigned long i)
{
  void * p = malloc (32 + (i & 255));
  g_sink = p;
  free (p);
}

static void *
worker (void * arg)
{
  (void) arg;
  for (unsigned long i = 0;; i++)
  {
    reaper_alloc (i);
    usleep (300);
  }
  return NULL;
}

int
main (void)
{
  struct sigaction sa;
  memset (&sa, 0, sizeof (sa));
  sa.sa_handler = on_chld;
  sa.sa_flags = SA_RESTART;
  sigaction (SIGCHLD, &sa, NULL);
  pthread_t t;
  for (int k = 0; k < 2; k++)
    pthread_create (&t, NULL, worker, NULL);
  printf ("ready\n");
  fflush (stdout);
  for (;;)
    pause ();
}
