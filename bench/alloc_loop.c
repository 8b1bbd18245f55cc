/* Benchmark target: N malloc(size)/free pairs in a tight loop, timed inside the program so
 * start-up and instrumentation set-up are excluded.  Prints "ns_per_pair <x>" on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void *volatile sink;

__attribute__((noinline)) void bench_alloc_pair(size_t size) {
  void *p = malloc(size);
  sink = p;
  free(p);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 2000000;
  size_t size = argc > 2 ? (size_t)atol(argv[2]) : 32;
  for (long i = 0; i < 10000; i++) bench_alloc_pair(size);   /* warm-up */
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < n; i++) bench_alloc_pair(size);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
  printf("ns_per_pair %.2f\n", ns / n);
  fflush(stdout);
  return 0;
}
