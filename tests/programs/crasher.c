/* crasher [SECONDS]: allocates in steady ticks for SECONDS (default 0.5), then writes through
 * a null pointer in crash_here <- crash_caller <- main (SIGSEGV, faulting address 0x10). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink;
static int *volatile null_ptr;

__attribute__((noinline)) void crash_here(void) {
  null_ptr[4] = 1;
}
__attribute__((noinline)) void crash_caller(void) {
  crash_here();
  sink = NULL;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 0.5;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    void *p = malloc(16384); sink = p; free(p);
    usleep(10000);
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
  crash_caller();
  return 0;
}
