/* churn SECONDS [MARKER [PER_MS]]: mallocs and frees 16 KiB blocks (above the stack threshold, so
 * with --events every call is a record with a stack), PER_MS (default 1000) of them per millisecond, for
 * SECONDS, then writes "finished N" to MARKER (N: blocks allocated) and exits 0.  Prints "ready <pid>" once started: an --events capture
 * of it grows by megabytes a second, which fills a small disk quickly. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink;

__attribute__((noinline)) static void churn_block(void) {
  void *p = malloc(16384);
  sink = p;
  free(p);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 5.0;
  int per_ms = argc > 3 ? atoi(argv[3]) : 1000;
  unsigned long n = 0;
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  double end = now() + seconds;
  while (now() < end) {
    for (int i = 0; i < per_ms; i++, n++) churn_block();
    usleep(1000);
  }
  if (argc > 2 && argv[2][0] != '\0') {
    FILE *f = fopen(argv[2], "w");
    if (f == NULL) return 3;
    fprintf(f, "finished %lu\n", n);
    fclose(f);
  }
  return 0;
}
