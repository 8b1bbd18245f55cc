/* split_parts [N]: GCC moves build_index's branch that calls a cold function into
 * build_index.cold; the N allocations of 12,288 B made there are build_index's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *volatile sink[64];
volatile int big = 100000;
volatile int noted;

__attribute__((cold, noinline)) void note_big(int n) { noted += n; }

__attribute__((noinline)) void *build_index(int n) {
  if (n > 1000) {
    note_big(n);
    void *p = malloc(12288);
    memset(p, n & 0xff, 64);
    return p;
  }
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  for (int i = 0; i < n && i < 64; i++)
    sink[i] = build_index(big);
  printf("built %d\n", n);
  return 0;
}
