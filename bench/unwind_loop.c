/* Benchmark target for bench/unwind_bench.py: N allocations, each freed at once, timed inside
 * the program so start-up and instrumentation set-up are excluded.
 *   unwind_loop N direct   malloc(32) from a frame-pointer function (the walk's first frame is ours)
 *   unwind_loop N strdup   strdup("x") from a frame-pointer function: the first frame is glibc's
 *                          __strdup, built without frame pointers (a table step, then ours)
 * Prints "ns_per_alloc <x>" on stdout. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *volatile sink;

__attribute__((noinline)) void bench_direct(void) {
  void *p = malloc(32);
  sink = p;
  free(p);
}

__attribute__((noinline)) void bench_strdup(void) {
  char *p = strdup("x");
  sink = p;
  free(p);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000000;
  void (*fn)(void) = (argc > 2 && strcmp(argv[2], "strdup") == 0) ? bench_strdup : bench_direct;
  for (long i = 0; i < 10000; i++) fn();   /* warm-up: every stack interned */
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < n; i++) fn();
  clock_gettime(CLOCK_MONOTONIC, &b);
  double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
  printf("ns_per_alloc %.2f\n", ns / n);
  fflush(stdout);
  return 0;
}
