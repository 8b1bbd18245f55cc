/* split_clones: GCC's other split and cloned functions, each allocating its own size (built -O2):
 *   from_cfg.constprop.0.isra.0   2 x 2,345 B (only c->size is used: ISRA passes it alone)
 *   make_block.constprop.0        3 x 4,321 B (every call passes the same fill: IPA-CP clones it)
 *   maybe_grow.part.0             1 x 5,432 B, from grow_a (the early return is inlined into the
 *                                 callers, the rest is split off: partial inlining) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *volatile sink[64];
volatile int seven = 7;

struct cfg { int kind; size_t size; char pad[100]; };

static __attribute__((noinline)) void *from_cfg(const struct cfg *c) { return malloc(c->size); }

static __attribute__((noinline)) void *make_block(size_t n, int fill) {
  void *p = malloc(n);
  memset(p, fill, 8);
  return p;
}

static void *maybe_grow(int n) {
  if (__builtin_expect(n < 1000, 1))
    return NULL;
  char *p = malloc(5432);
  for (int i = 0; i < n % 13; i++)
    p[i * 7 % 5432] = (char) i;
  snprintf(p, 64, "grown %d %d", n, n * 3);
  puts(p);
  for (int i = 0; i < n % 7; i++) { snprintf(p + 64, 64, "%d %d %d", i, n, i * n); fputs(p + 64, stderr); }
  for (int i = 0; i < n % 5; i++) { snprintf(p + 128, 64, "%x %x", i, n); fputs(p + 128, stderr); }
  return p;
}
__attribute__((noinline)) void *grow_a(int n) { return maybe_grow(n); }
__attribute__((noinline)) void *grow_b(int n) { return maybe_grow(n + 1); }
__attribute__((noinline)) void *grow_c(int n) { return maybe_grow(n + 2); }

int main(int argc, char **argv) {
  struct cfg c = {seven, 2345, {0}};
  for (int i = 0; i < 2; i++) sink[i] = from_cfg(&c);
  for (int i = 0; i < 3; i++) sink[4 + i] = make_block(4321, 0x5a);
  sink[10] = grow_a(argc * 1000 + seven);
  sink[11] = grow_b(argc);
  sink[12] = grow_c(argc);
  return 0;
}
