/* The main thread allocates in a loop (glibc's main arena) while another thread holds that arena's
 * lock for as long as the reader of stderr wants: malloc_stats() prints each arena's figures with
 * its lock held, and stderr is a pipe filled first (nobody reads it until the test does).  Each
 * malloc of the main thread meanwhile waits inside glibc's malloc -- under memtrace's hook, a
 * return address into memtrace's code on its stack, for seconds.
 * stdin "go\n": start blocking; prints "blocking" (stdout) just before malloc_stats; then, once
 * the main thread has allocated again after the lock came free, "free <n>" with its count. */
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile long g_allocs;
static void *volatile g_sink;

static void *
blocker (void * arg)
{
  char buf[4096];
  (void) arg;
  memset (buf, 'x', sizeof (buf));
  int flags = fcntl (2, F_GETFL);
  fcntl (2, F_SETFL, flags | O_NONBLOCK);
  while (write (2, buf, sizeof (buf)) > 0)
    ;
  fcntl (2, F_SETFL, flags);
  printf ("blocking\n");
  fflush (stdout);
  malloc_stats ();        /* the main arena's lock held while stderr blocks */
  return NULL;
}

int
main (void)
{
  char line[16];
  setvbuf (stdout, NULL, _IOLBF, 0);
  printf ("ready\n");
  if (fgets (line, sizeof (line), stdin) == NULL)
    return 1;
  pthread_t t;
  pthread_create (&t, NULL, blocker, NULL);
  for (;;)
  {
    void * p = malloc (64 + (g_allocs & 63));
    g_sink = p;
    free (p);
    g_allocs++;
    usleep (1000);
  }
}
