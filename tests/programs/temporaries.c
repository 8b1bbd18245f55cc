/* A known set of temporary allocations (freed by the thread that made them with no other allocation
 * on that thread in between), every one from its own call site:
 *   temp_pairs:    1000 x (malloc(64), free)                      1000 temporaries, 64000 B
 *   interleaved:   300 x (a = malloc(96), b = malloc(96), free(a)) none: b came between
 *                  then one malloc(32) kept (sentinel), then the 300 b freed: none either
 *   realloc_chain: malloc(100) -> realloc 200 -> realloc 300 -> free: 3 temporaries (each block
 *                  released right after it was made), 100 + 200 + 300 B
 * Nothing goes through stdio. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink;
static void *kept[300];

__attribute__((noinline)) void temp_pairs(void) {
  for (int i = 0; i < 1000; i++) { void *p = malloc(64); sink = p; free(p); }
}
__attribute__((noinline)) void *interleaved_a(void) { return malloc(96); }
__attribute__((noinline)) void *interleaved_b(void) { return malloc(96); }
__attribute__((noinline)) void interleaved(void) {
  for (int i = 0; i < 300; i++) { void *a = interleaved_a(); kept[i] = interleaved_b(); free(a); }
}
__attribute__((noinline)) void sentinel(void) { sink = malloc(32); }
__attribute__((noinline)) void release_kept(void) { for (int i = 0; i < 300; i++) free(kept[i]); }
__attribute__((noinline)) void realloc_chain(void) {
  void *p = malloc(100);
  p = realloc(p, 200);
  p = realloc(p, 300);
  free(p);
}

int main(void) {
  temp_pairs();
  interleaved();
  sentinel();
  release_kept();
  realloc_chain();
  const char done[] = "temporaries done\n";
  if (write(2, done, strlen(done)) < 0) return 1;
  return 0;
}
