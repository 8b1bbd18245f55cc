/* exec_target SECONDS STATUS: for SECONDS, every 10 ms after_exec_tick mallocs 2 x 20480 and
 * frees them; then prints "exec_target done" and exits STATUS. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink;

__attribute__((noinline)) void after_exec_tick(void) {
  for (int i = 0; i < 2; i++) { void *p = malloc(20480); sink = p; free(p); }
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 2.0;
  int status = argc > 2 ? atoi(argv[2]) : 0;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    after_exec_tick();
    usleep(10000);
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
  printf("exec_target done\n");
  fflush(stdout);
  return status;
}
