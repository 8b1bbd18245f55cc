/* fd_closer HOW: allocates (before_close: 100 x 8192), closes every descriptor but 0-2 the way
 * daemons do (HOW = loop: close() on 3..sysconf(_SC_OPEN_MAX); range: close_range(3, ~0U, 0); from: closefrom(3);
 * dup2 / dup3: /dev/null dup2'ed (dup3'ed) over every descriptor from 3 to 1023, then closed; raw: the close
 * system call itself, syscall(SYS_close), on 3..1023), then allocates again (after_close: 100 x 16384, 10 ms
 * apart) and exits 0.  dup2 and dup3 print how many of their calls failed and with which errno. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>
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
  } else if (strcmp(how, "dup2") == 0 || strcmp(how, "dup3") == 0) {
    int null = open("/dev/null", O_RDWR), failed = 0, err = 0;
    for (int fd = 3; fd < 1024; fd++) {
      if (fd == null)
        continue;
      int r = how[3] == '2' ? dup2(null, fd) : dup3(null, fd, O_CLOEXEC);
      if (r < 0) {
        failed++;
        err = errno;
      } else {
        close(fd);
      }
    }
    close(null);
    printf("fd_closer %s failed %d errno %d\n", how, failed, err);
  } else if (strcmp(how, "raw") == 0) {
    for (long fd = 3; fd < 1024; fd++) syscall(SYS_close, fd);
  } else {
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = 3; fd < max; fd++) close((int)fd);
  }
  for (int i = 0; i < 100; i++) { after_close(); usleep(10000); }
  printf("fd_closer done\n");
  fflush(stdout);
  return 0;
}
