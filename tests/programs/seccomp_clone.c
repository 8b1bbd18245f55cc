/* A sandboxed target: a seccomp filter traps every clone that makes no thread (SIGSYS, which kills
 * the process: no handler), answers clone3 with ENOSYS (so glibc falls back to clone, whose flags a
 * filter can read), and allows the rest; then T threads malloc and free in a loop.
 * Usage: seccomp_clone [threads].  Prints "ready" once they run. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_clone3
#define __NR_clone3 435
#endif

static void *volatile sink;
static volatile int started;

static void *loop(void *arg) {
  unsigned long i = (unsigned long)arg;
  __sync_fetch_and_add(&started, 1);
  for (;;) {
    void *p = malloc(32 + (i++ % 256));
    sink = p;
    free(p);
    if (i % 4096 == 0) usleep(100);
  }
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4;
  struct sock_filter filter[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone3, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
    BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_THREAD, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
  };
  struct sock_fprog prog = { sizeof(filter) / sizeof(filter[0]), filter };
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    perror("seccomp");
    return 2;
  }
  for (long i = 0; i < n; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, loop, (void *)i) != 0) return 3;
  }
  while (started < n) usleep(1000);
  printf("ready\n");
  fflush(stdout);
  for (;;) pause();
}
