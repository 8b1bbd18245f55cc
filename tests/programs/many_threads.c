/* T threads (argv[1], default 2000) alive at once, each making K malloc(64)/free pairs (argv[2],
 * default 10) from thread_allocs, then one malloc(100) it keeps (leaked on purpose), after every
 * thread has started (a barrier) and before any ends (a second barrier).  Small stacks, so that
 * thousands of threads fit.  Prints "threads T" when all are joined. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static long n_pairs = 10;
static void *volatile sink;
static pthread_barrier_t started, finished;

__attribute__((noinline)) void thread_allocs(void) {
  for (long i = 0; i < n_pairs; i++) { void *p = malloc(64); sink = p; free(p); }
  sink = malloc(100);
}

static void *worker(void *arg) {
  pthread_barrier_wait(&started);
  thread_allocs();
  pthread_barrier_wait(&finished);
  return arg;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2000;
  if (argc > 2) n_pairs = atol(argv[2]);
  pthread_t *t = calloc((size_t)n, sizeof *t);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 128 * 1024);
  pthread_barrier_init(&started, NULL, (unsigned)n);
  pthread_barrier_init(&finished, NULL, (unsigned)n);
  for (int i = 0; i < n; i++)
    if (pthread_create(&t[i], &attr, worker, NULL) != 0) { fprintf(stderr, "pthread_create %d failed\n", i); return 3; }
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  printf("threads %d\n", n);
  return 0;
}
