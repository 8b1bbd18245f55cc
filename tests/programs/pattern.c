/* Known allocation pattern for exact-count tests.
 *   alloc_4k_batch:   1000 x malloc(4096), then frees the first 600 (400 stay live)
 *   alloc_small:      500 x malloc(100), all freed
 *   alloc_big:        10 x malloc(100000), kept
 *   use_calloc:       20 x calloc(16, 1024) (16384 B), freed
 *   use_realloc:      one block grown 1024 -> 2048 -> 16384 -> 65536, then freed
 *   use_memalign:     5 x posix_memalign(64, 8192), kept
 * Optional argv[1]: seconds to sleep first (attach-with-delay tests). */
#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>

static void *volatile sink[2000];

__attribute__((noinline)) void alloc_4k_batch(void) {
  for (int i = 0; i < 1000; i++) sink[i] = malloc(4096);
  for (int i = 0; i < 600; i++) free(sink[i]);
}
__attribute__((noinline)) void alloc_small(void) {
  for (int i = 0; i < 500; i++) { void *p = malloc(100); sink[1999] = p; free(p); }
}
__attribute__((noinline)) void alloc_big(void) {
  for (int i = 0; i < 10; i++) sink[1000 + i] = malloc(100000);
}
__attribute__((noinline)) void use_calloc(void) {
  for (int i = 0; i < 20; i++) { void *p = calloc(16, 1024); sink[1998] = p; free(p); }
}
__attribute__((noinline)) void use_realloc(void) {
  void *p = malloc(1024);
  p = realloc(p, 2048);
  p = realloc(p, 16384);
  p = realloc(p, 65536);
  free(p);
}
__attribute__((noinline)) void use_memalign(void) {
  for (int i = 0; i < 5; i++) { void *p; if (posix_memalign(&p, 64, 8192) == 0) sink[1100 + i] = p; }
}

int main(int argc, char **argv) {
  if (argc > 1) { double s = atof(argv[1]); usleep((useconds_t)(s * 1e6)); }
  alloc_4k_batch();
  alloc_small();
  alloc_big();
  use_calloc();
  use_realloc();
  use_memalign();
  fprintf(stderr, "pattern done\n");
  return 0;
}
