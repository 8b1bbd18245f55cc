/* Benchmark target: T threads x N malloc(size)/free pairs each, timed inside the program so start-up
 * and instrumentation set-up are excluded.  Usage: alloc_storm N [threads [size [grow]]].
 * "grow": each thread makes its N blocks first, keeping them, then frees them all -- heaps that grow,
 * so every block lands on memory (and a live-table entry on a table page) never touched before.
 * Prints "ns_per_pair <x>": the process's CPU time over the storm divided by the pairs made (every
 * thread's, memtrace's drain included), so that 4 threads on 2 CPUs compare with 1 thread on 1;
 * "wall_ns_per_pair <y>"; and "thread_ns_per_pair <z>", the storm threads' own CPU time only. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void *volatile sink;
static long n_pairs;
static size_t pair_size;
static int grow;
static pthread_barrier_t start;

__attribute__((noinline)) void storm_pair(size_t size) {
  void *p = malloc(size);
  sink = p;
  free(p);
}

static double thread_cpu[64];

static double seconds(clockid_t clock);

static void *storm_thread(void *arg) {
  long me = (long)arg;
  pthread_barrier_wait(&start);
  double c0 = seconds(CLOCK_THREAD_CPUTIME_ID);
  if (grow) {
    void **kept = malloc((size_t)n_pairs * sizeof *kept);
    for (long i = 0; i < n_pairs; i++) kept[i] = malloc(pair_size);
    for (long i = 0; i < n_pairs; i++) free(kept[i]);
    free(kept);
  } else {
    for (long i = 0; i < n_pairs; i++) storm_pair(pair_size);
  }
  thread_cpu[me] = seconds(CLOCK_THREAD_CPUTIME_ID) - c0;
  return arg;
}

static double seconds(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  n_pairs = argc > 1 ? atol(argv[1]) : 2000000;
  int threads = argc > 2 ? atoi(argv[2]) : 4;
  pair_size = argc > 3 ? (size_t)atol(argv[3]) : 32;
  grow = argc > 4 && argv[4][0] == 'g';
  pthread_t t[64];
  if (threads < 1 || threads > 64) return 2;
  for (long i = 0; i < 10000; i++) storm_pair(pair_size);   /* warm-up */
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, storm_thread, (void *)i);
  /* The workers sleep in the barrier until main arrives: nothing runs between this reading and theirs. */
  double c0 = seconds(CLOCK_PROCESS_CPUTIME_ID), w0 = seconds(CLOCK_MONOTONIC);
  pthread_barrier_wait(&start);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  double c1 = seconds(CLOCK_PROCESS_CPUTIME_ID), w1 = seconds(CLOCK_MONOTONIC);
  double pairs = (double)n_pairs * threads, storm_cpu = 0;
  for (int i = 0; i < threads; i++) storm_cpu += thread_cpu[i];
  printf("ns_per_pair %.2f\nwall_ns_per_pair %.2f\nthread_ns_per_pair %.2f\n", (c1 - c0) * 1e9 / pairs,
         (w1 - w0) * 1e9 / pairs, storm_cpu * 1e9 / pairs);
  fflush(stdout);
  return 0;
}
