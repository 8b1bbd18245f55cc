/* A timer's signal handler that mallocs, in a program that forks: the handler can land anywhere,
 * including inside fork() itself and inside the child's first instructions.
 * Usage: signal_fork FORKS.  Prints "ok <forks> <handled> off-main <n>" when every child exited 0: n
 * handlers ran on a thread other than the program's own (natively 0: it has no other thread). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t handled, off_main;
static void *volatile sink;

__attribute__((noinline)) static void on_timer(int sig) {
  (void)sig;
  void *p = malloc(96);          /* not async-signal-safe, and programs do it anyway */
  sink = p;
  free(p);
  handled++;
  if (syscall(SYS_gettid) != getpid())
    off_main++;
}

__attribute__((noinline)) static void child_work(void) {
  for (int i = 0; i < 200; i++) {
    void *p = malloc(64 + i);
    sink = p;
    free(p);
  }
}

int main(int argc, char **argv) {
  int forks = argc > 1 ? atoi(argv[1]) : 200;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_timer;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval it = {{0, 200}, {0, 200}};     /* every 200 us */
  setitimer(ITIMER_REAL, &it, NULL);
  int bad = 0;
  for (int i = 0; i < forks; i++) {
    pid_t pid = fork();
    if (pid == 0) {
      child_work();
      _exit(0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      bad++;
    child_work();
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  /* A signal already pending runs no handler after this: `handled` is final. */
  sigset_t alrm;
  sigemptyset(&alrm);
  sigaddset(&alrm, SIGALRM);
  sigprocmask(SIG_BLOCK, &alrm, NULL);
  printf("%s %d %d off-main %d\n", bad ? "bad" : "ok", forks, (int)handled, (int)off_main);
  return bad != 0;
}
