/* A process carrying a memtrace session mark (agents/runtime/process.js, claimProcess): a memfd
 * page named "memtrace-session" holding a pid -- its own ("own", as a traced process) or another's
 * ("inherited", as a fork child of a traced process) -- then the marking agent's thread id: none
 * (an older agent's mark), or ("stale") a thread that has exited, as a session leaves whose
 * teardown failed, or ("ending") a live thread whose session has stopped and is unloading: the mark
 * says so (its third word) and the thread takes it off 1.5 s later, then exits.  Prints "ready" and
 * sleeps until killed. */
#define _GNU_SOURCE
#include <stdio.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <unistd.h>

static void *gone(void *out) {
  *(unsigned *) out = (unsigned) syscall(SYS_gettid);
  return NULL;
}

static void *unloading(void *page) {
  ((volatile unsigned *) page)[1] = (unsigned) syscall(SYS_gettid);
  ((volatile unsigned *) page)[2] = 1;
  usleep(1500000);
  *(volatile unsigned *) page = 0;      /* as the agent's releaseProcess: pid 0, then unmapped */
  munmap(page, 4096);
  return NULL;
}

int main(int argc, char **argv) {
  int own = argc < 2 || strcmp(argv[1], "inherited") != 0;
  int stale = argc > 1 && strcmp(argv[1], "stale") == 0;
  int ending = argc > 1 && strcmp(argv[1], "ending") == 0;
  int fd = memfd_create("memtrace-session", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, 4096) != 0) { perror("memfd"); return 2; }
  unsigned *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (page == MAP_FAILED) { perror("mmap"); return 2; }
  close(fd);
  *page = (unsigned) (own ? getpid() : getppid());
  if (stale) {
    pthread_t t;
    if (pthread_create(&t, NULL, gone, &page[1]) != 0 || pthread_join(t, NULL) != 0) return 3;
  }
  if (ending) {
    pthread_t t;
    if (pthread_create(&t, NULL, unloading, page) != 0) return 3;
    while (((volatile unsigned *) page)[2] == 0) usleep(1000);
  }
  printf("ready\n");
  fflush(stdout);
  for (;;) pause();
}
