/* Benchmark target for bench/unwind_bench.py: N allocations, each freed at once, timed inside
 * the program so start-up and instrumentation set-up are excluded.
 *   unwind_loop N direct   malloc(32) from a frame-pointer function (the walk's first frame is ours)
 *   unwind_loop N strdup   strdup("x") from a frame-pointer function: the first frame is glibc's
 *                          __strdup, built without frame pointers (a table step, then ours)
 *   unwind_loop N deep     malloc(32) 20 frame-pointer calls deep (frames the tables never touch)
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

__attribute__((noinline)) void bench_nested(int depth) {
  if (depth == 0)
    bench_direct();
  else
    bench_nested(depth - 1);
  __asm__ volatile("" ::: "memory");   /* no tail call: every level keeps its frame */
}

__attribute__((noinline)) void bench_deep(void) {
  bench_nested(20);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000000;
  const char *mode = argc > 2 ? argv[2] : "direct";
  void (*fn)(void) = strcmp(mode, "strdup") == 0 ? bench_strdup : strcmp(mode, "deep") == 0 ? bench_deep : bench_direct;
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
