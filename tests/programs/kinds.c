/* Each allocation entry called by its own name, some of them entries glibc builds on others
 * (reallocarray calls realloc, realloc(NULL, n) calls malloc, aligned_alloc is memalign):
 *   use_reallocarray: reallocarray(NULL, 10, 100), reallocarray(p, 20, 100), free
 *   use_realloc_null: realloc(NULL, 5000), free
 *   use_aligned:      3 x aligned_alloc(64, 8192), freed
 *   use_memalign:     2 x memalign(64, 8192), freed
 * The program itself never calls malloc; nothing goes through stdio. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink;
static void *volatile nothing;   /* NULL the compiler cannot see: realloc(NULL, n) would become malloc(n) */

__attribute__((noinline)) void use_reallocarray(void) {
  void *p = reallocarray(nothing, 10, 100);
  p = reallocarray(p, 20, 100);
  sink = p;
  free(p);
}
__attribute__((noinline)) void use_realloc_null(void) { void *p = realloc(nothing, 5000); sink = p; free(p); }
__attribute__((noinline)) void use_aligned(void) {
  for (int i = 0; i < 3; i++) { void *p = aligned_alloc(64, 8192); sink = p; free(p); }
}
__attribute__((noinline)) void use_memalign(void) {
  for (int i = 0; i < 2; i++) { void *p = memalign(64, 8192); sink = p; free(p); }
}

int main(void) {
  use_reallocarray();
  use_realloc_null();
  use_aligned();
  use_memalign();
  const char done[] = "kinds done\n";
  if (write(2, done, strlen(done)) < 0) return 1;
  return 0;
}
