/* A heap that peaks at N 64-byte blocks (argv[1], default 200000: 12.8 MB) from hold_small, all
 * freed again, then 3 blocks of 100 bytes kept from keep_small (leaked: live at the end). */
#include <stdlib.h>

static void *volatile sink;

__attribute__((noinline)) void **hold_small(long n) {
  void **blocks = malloc((size_t)n * sizeof *blocks);
  for (long i = 0; i < n; i++) blocks[i] = malloc(64);
  return blocks;
}

__attribute__((noinline)) void keep_small(void) {
  for (int i = 0; i < 3; i++) sink = malloc(100);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 200000;
  void **blocks = hold_small(n);
  for (long i = 0; i < n; i++) free(blocks[i]);
  free(blocks);
  keep_small();
  return 0;
}
