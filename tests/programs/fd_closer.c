/* fd_closer HOW: allocates (before_close: 100 x 8192), closes every descriptor but 0-2 the way
 * daemons do (HOW = loop: close() on 3..sysconf(_SC_OPEN_MAX); range: close_range(3, ~0U, 0); from: closefrom(3)),
 * then allocates again (after_close: 100 x 16384, 10 ms apart) and exits 0. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/close_range.h>

static void *volatile sink;

__attribute__((noinline)) void before_close(void) {
  for (int i = 0; i < 100; i++) { void *p = malloc(8192); sink = p; free(p); }
}

__attribute__((noinline)) void after_close(void) {
  void *p = malloc(16384);
  sink = p;
  free(p);
}

int main(int argc, char **argv) {
  const char *how = argc > 1 ? argv[1] : "loop";
  before_close();
  if (strcmp(how, "range") == 0) {
    close_range(3U, ~0U, 0);
  } else if (strcmp(how, "from") == 0) {
    closefrom(3);
  } else {
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = 3; fd < max; fd++) close((int)fd);
  }
  for (int i = 0; i < 100; i++) { after_close(); usleep(10000); }
  printf("fd_closer done\n");
  fflush(stdout);
  return 0;
}
