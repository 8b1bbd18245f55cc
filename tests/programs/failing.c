/* failing: allocation calls that return NULL, each from a function of its own, then 10 blocks of
 * 5,000 B that succeed.  Before, the 64 TiB asked for was added to the gross bytes and the
 * overflowing calloc wrapped a 64-bit counter. */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define HUGE_SIZE ((size_t) 1 << 46)         /* 64 TiB: no machine grants it */

void *volatile sink[16];
volatile size_t big_count = (size_t) 1 << 40;    /* calloc's and reallocarray's n * size overflows */

__attribute__((noinline)) void fail_malloc(void) { sink[0] = malloc(HUGE_SIZE); }
__attribute__((noinline)) void fail_calloc(void) { sink[1] = calloc(big_count, big_count); }
__attribute__((noinline)) void fail_reallocarray(void) {
  sink[2] = reallocarray(NULL, big_count, big_count);
}
__attribute__((noinline)) void fail_realloc(void *p) { sink[3] = realloc(p, HUGE_SIZE); }
__attribute__((noinline)) void fail_posix_memalign(void) {
  void *p = NULL;
  if (posix_memalign(&p, 64, HUGE_SIZE) == 0)
    sink[4] = p;
}
__attribute__((noinline)) void succeed(int i) { sink[5 + i] = malloc(5000); }

int main(void) {
  void *keep = malloc(100);
  fail_malloc();
  fail_calloc();
  fail_reallocarray();
  fail_realloc(keep);
  fail_posix_memalign();
  for (int i = 0; i < 10; i++)
    succeed(i);
  int failed = 0;
  for (int i = 0; i < 5; i++)
    failed += sink[i] == NULL;
  printf("failed %d\n", failed);
  return 0;
}
