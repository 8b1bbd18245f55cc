// peer_kinds: every allocation entry a C++ program reaches, each from a function of its own with
// its own exact size, everything freed before exit (a memory profiler's classic test program):
//   use_new            3 x new Big (1000 B), deleted
//   use_new_array      2 x new char[3000], delete[]
//   use_new_aligned    2 x new Aligned (2560 B, alignas 128: operator new(size, align_val_t)), deleted
//   use_new_nothrow    1 x new (std::nothrow) char[1500], delete[]
//   use_aligned_alloc  aligned_alloc(64, 1600)
//   use_posix_memalign posix_memalign(&p, 256, 1700)
//   use_memalign       memalign(512, 1800)
//   use_valloc         valloc(1900)
//   use_pvalloc        pvalloc(1950)
//   use_calloc         calloc(7, 311): 2177 B
//   use_realloc_zero   malloc(2100), then realloc(p, 0): glibc frees it and returns NULL (no failure)
//   use_realloc_grow   malloc(2200), realloc to 2300, then to 2400, freed
// Prints "kinds done".
#include <cstdio>
#include <cstdlib>
#include <malloc.h>
#include <new>

struct Big { char b[1000]; };
struct alignas(128) Aligned { char c[2560]; };

static void *volatile sink;
static void *volatile nothing;

#define NOINLINE __attribute__((noinline))

NOINLINE void use_new() {
  for (int i = 0; i < 3; i++) { Big *p = new Big; sink = p; delete p; }
}
NOINLINE void use_new_array() {
  for (int i = 0; i < 2; i++) { char *p = new char[3000]; sink = p; delete[] p; }
}
NOINLINE void use_new_aligned() {
  for (int i = 0; i < 2; i++) { Aligned *p = new Aligned; sink = p; delete p; }
}
NOINLINE void use_new_nothrow() { char *p = new (std::nothrow) char[1500]; sink = p; delete[] p; }
NOINLINE void use_aligned_alloc() { void *p = aligned_alloc(64, 1600); sink = p; free(p); }
NOINLINE void use_posix_memalign() {
  void *p = nullptr;
  if (posix_memalign(&p, 256, 1700) == 0) { sink = p; free(p); }
}
NOINLINE void use_memalign() { void *p = memalign(512, 1800); sink = p; free(p); }
NOINLINE void use_valloc() { void *p = valloc(1900); sink = p; free(p); }
NOINLINE void use_pvalloc() { void *p = pvalloc(1950); sink = p; free(p); }
NOINLINE void use_calloc() { void *p = calloc(7, 311); sink = p; free(p); }
NOINLINE void use_realloc_zero() {
  void *p = malloc(2100);
  sink = p;
  nothing = realloc(p, 0);
}
NOINLINE void use_realloc_grow() {
  void *p = malloc(2200);
  p = realloc(p, 2300);
  p = realloc(p, 2400);
  sink = p;
  free(p);
}

int main() {
  use_new();
  use_new_array();
  use_new_aligned();
  use_new_nothrow();
  use_aligned_alloc();
  use_posix_memalign();
  use_memalign();
  use_valloc();
  use_pvalloc();
  use_calloc();
  use_realloc_zero();
  use_realloc_grow();
  std::printf("kinds done%s\n", nothing == nullptr ? "" : " (realloc 0 returned a block)");
  return 0;
}
