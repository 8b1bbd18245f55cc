/* glibc's thread arenas crowd the live table: each thread's arena is a heap of 64 MiB on a 64 MiB
 * boundary whose first megabytes are all small blocks, so the dense stretches of several threads
 * land on the same buckets at the windows' offsets (cmodule/core.c, mt_live_alt).  T threads each
 * keep N blocks of 24 B; all hold them at once (a barrier), then free them.  Usage: crowded_arenas T N */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_barrier_t all_held;
static long n_blocks;

__attribute__ ((noinline)) static void **
hold_crowded (long n)
{
  void ** v = malloc ((size_t) n * sizeof *v);
  for (long i = 0; i < n; i++)
    v[i] = malloc (24);
  return v;
}

static void *
work (void * arg)
{
  void ** v = hold_crowded (n_blocks);
  pthread_barrier_wait (&all_held);
  pthread_barrier_wait (&all_held);
  for (long i = 0; i < n_blocks; i++)
    free (v[i]);
  free (v);
  return arg;
}

int
main (int argc, char ** argv)
{
  int t = argc > 1 ? atoi (argv[1]) : 8;
  pthread_t th[64];
  n_blocks = argc > 2 ? atol (argv[2]) : 300000;
  if (t < 1 || t > 64)
    return 2;
  pthread_barrier_init (&all_held, NULL, (unsigned) t + 1);
  for (int i = 0; i < t; i++)
    pthread_create (&th[i], NULL, work, NULL);
  pthread_barrier_wait (&all_held);      /* every block of every thread is live here */
  pthread_barrier_wait (&all_held);
  for (int i = 0; i < t; i++)
    pthread_join (th[i], NULL);
  puts ("ok");
  return 0;
}
