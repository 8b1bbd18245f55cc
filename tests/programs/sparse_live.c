/* Live blocks at the end spread thin over a large heap: 200,000 blocks of 64 B from spread_small, all
 * but every 1,000th freed (200 left, one per ~80 KB of heap), and 8 blocks of 1..8 MiB from
 * spread_big (glibc maps each on its own, far from the heap).  The live table then has runs of
 * untouched pages between written ones, which the final drain steps over (cmodule/drain.c). */
#include <stdlib.h>
#include <string.h>

#define N 200000

static void *keep[N];
static void *volatile big[8];

__attribute__((noinline)) void spread_small(void) {
  for (int i = 0; i < N; i++) keep[i] = malloc(64);
  for (int i = 0; i < N; i++)
    if (i % 1000 != 0) free(keep[i]);
}

__attribute__((noinline)) void spread_big(void) {
  for (int i = 0; i < 8; i++) {
    big[i] = malloc((size_t)(i + 1) << 20);
    memset(big[i], 1, 64);
  }
}

int main(void) {
  spread_small();
  spread_big();
  return 0;
}
