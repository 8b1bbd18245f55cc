/* Runs until killed: every 10 ms, steady_tick mallocs 4 x 16384 and frees them.
 * Prints "ready <pid>" on stdout once started. */
#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>

static void *volatile sink;

__attribute__((noinline)) void steady_tick(void) {
  void *p[4];
  for (int i = 0; i < 4; i++) { p[i] = malloc(16384); sink = p[i]; }
  for (int i = 0; i < 4; i++) free(p[i]);
}

int main(void) {
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  for (;;) { steady_tick(); usleep(10000); }
}
