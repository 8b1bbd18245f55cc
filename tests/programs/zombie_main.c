/* A process whose main thread has called pthread_exit: it stays a zombie while two threads allocate
 * on (a server's common shape).  It cannot be seized, runs nothing, yet tgkill(0) reaches it: a
 * world stop that counted it as a thread that would not stop was never clear for such a process.
 * Prints "ready" once the threads run, just before the main thread exits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *volatile g_sink;

__attribute__ ((noinline)) static void
worker_alloc (unsigned long i)
{
  void * p = malloc (48 + (i & 127));
  g_sink = p;
  free (p);
}

static void *
worker (void * arg)
{
  (void) arg;
  for (unsigned long i = 0;; i++)
  {
    worker_alloc (i);
    usleep (500);
  }
  return NULL;
}

int
main (void)
{
  pthread_t t;
  for (int k = 0; k < 2; k++)
    pthread_create (&t, NULL, worker, NULL);
  usleep (20000);
  printf ("ready\n");
  fflush (stdout);
  pthread_exit (NULL);
}
