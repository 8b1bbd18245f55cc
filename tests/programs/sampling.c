/* Small allocations for sampling tests: 200000 x malloc(48) from small_a (all kept until the end),
 * 100000 x malloc(200) from small_b (freed at once); small_a's blocks stay live until exit. */
#include <stdlib.h>
#include <stdio.h>

#define NA 200000
static void *volatile blocks[NA];
static void *volatile sink;

__attribute__((noinline)) void small_a(void) { for (int i = 0; i < NA; i++) blocks[i] = malloc(48); }
__attribute__((noinline)) void small_b(void) { for (int i = 0; i < 100000; i++) { void *p = malloc(200); sink = p; free(p); } }

int main(void) {
  small_a();
  small_b();
  fprintf(stderr, "sampling done\n");
  return 0;
}
