/* A big heap for the leak scan's scale bench (bench/leak_bench.py scale): N blocks totalling about
 * BYTES, every block filled (so resident and read), their pointers kept in one index block, every
 * 100th dropped (leaked).  Prints "ready" and sleeps SECONDS.
 *   leak_heap N BYTES SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void **volatile g_index;

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000000;
  long bytes = argc > 2 ? atol(argv[2]) : 2L << 30;
  int wait_s = argc > 3 ? atoi(argv[3]) : 60;
  long size = bytes / n;
  void **index = malloc((size_t) n * sizeof(void *));
  for (long i = 0; i < n; i++) {
    /* sizes vary around the mean, as a real heap's do */
    size_t sz = (size_t) (size / 2 + (i * 7919) % (size + 1));
    char *p = malloc(sz);
    memset(p, 'x', sz);
    index[i] = (i % 100 == 99) ? NULL : p;
  }
  g_index = index;
  printf("ready\n");
  fflush(stdout);
  sleep(wait_s);
  return 0;
}
