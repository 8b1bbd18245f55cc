/* Process shapes that once made every world stop unclear; two threads allocate in each.
 *   zombie  the main thread calls pthread_exit 20 ms in, and stays a zombie while the others run (a
 *           server's common shape): it cannot be seized and runs nothing, yet tgkill(0) reaches it
 *           -- counted as a thread that would not stop, no stop of such a process was clear;
 *   reaper  the common SIGCHLD handler (reap every child that has changed state, without
 *           blocking): memtrace's world-stop helper, a clone, inherited it, and on the SIGCHLD each
 *           stopped thread sends its tracer the handler's waitpid took the stop reports the helper
 *           waited for.
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
shape_alloc (unsigned long i)
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
    shape_alloc (i);
    usleep (300);
  }
  return NULL;
}

int
main (int argc, char ** argv)
{
  int zombie = argc > 1 && strcmp (argv[1], "zombie") == 0;
  if (!zombie)
  {
    struct sigaction sa;
    memset (&sa, 0, sizeof (sa));
    sa.sa_handler = on_chld;
    sa.sa_flags = SA_RESTART;
    sigaction (SIGCHLD, &sa, NULL);
  }
  pthread_t t;
  for (int k = 0; k < 2; k++)
    pthread_create (&t, NULL, worker, NULL);
  usleep (20000);
  printf ("ready\n");
  fflush (stdout);
  if (zombie)
    pthread_exit (NULL);
  for (;;)
    pause ();
}
