/* A process carrying a memtrace session mark (agents/runtime/process.js, claimProcess): a memfd
 * page named "memtrace-session" holding a pid -- its own ("own", as a traced process) or another's
 * ("inherited", as a fork child of a traced process).  Prints "ready" and sleeps until killed. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
  int own = argc < 2 || strcmp(argv[1], "inherited") != 0;
  int fd = memfd_create("memtrace-session", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, 4096) != 0) { perror("memfd"); return 2; }
  unsigned *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (page == MAP_FAILED) { perror("mmap"); return 2; }
  close(fd);
  *page = (unsigned) (own ? getpid() : getppid());
  printf("ready\n");
  fflush(stdout);
  for (;;) pause();
}
