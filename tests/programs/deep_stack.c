/* One malloc(100) (kept) at the bottom of recurse(N) (argv[1], default 100) called from main: a stack
 * deeper than --frames, whose innermost frames must be kept. */
#include <stdlib.h>

static void *volatile sink;

__attribute__((noinline)) void alloc_deep(void) { sink = malloc(100); }

__attribute__((noinline)) void recurse(int n) {
  if (n == 0)
    alloc_deep();
  else
    recurse(n - 1);
  __asm__ volatile("" ::: "memory");   /* not a tail call: every level keeps its frame */
}

int main(int argc, char **argv) {
  recurse(argc > 1 ? atoi(argv[1]) : 100);
  return 0;
}
