/* exit_code N: one malloc, then returns N from main. */
#include <stdlib.h>

static void *volatile sink;

int main(int argc, char **argv) {
  sink = malloc(100);
  free(sink);
  return argc > 1 ? atoi(argv[1]) : 0;
}
