/* fork_storm CHILDREN [TIMEOUT_S]: 4 threads allocate without pause while main forks CHILDREN
 * children one after another.  Each child (child_work) makes 300 x malloc(24576) in its main
 * thread, creates a thread that makes 200 more, and exits 0.  The parent waits for each child
 * at most TIMEOUT_S seconds (default 15), SIGKILLs a child that is late, then prints
 * "children done D hung H failed F" and exits 0 when every child finished. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;
static void *volatile sink[8];

__attribute__((noinline)) static void churn(int n) {
  for (int i = 0; i < n; i++) { void *p = malloc(16 + (i % 64) * 256); sink[i & 7] = p; free(p); }
}
static void *worker(void *arg) { while (!stop) churn(1000); return arg; }

__attribute__((noinline)) void child_alloc(int n) {
  for (int i = 0; i < n; i++) { void *p = malloc(24576); sink[i & 7] = p; free(p); }
}
static void *child_thread(void *arg) { child_alloc(200); return arg; }

__attribute__((noinline)) void child_work(void) {
  child_alloc(300);
  pthread_t t;
  if (pthread_create(&t, NULL, child_thread, NULL) == 0) pthread_join(t, NULL);
  _exit(0);
}

static double since(const struct timespec *t0) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (now.tv_sec - t0->tv_sec) + (now.tv_nsec - t0->tv_nsec) / 1e9;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20;
  double timeout = argc > 2 ? atof(argv[2]) : 15.0;
  pthread_t w[4];
  for (int i = 0; i < 4; i++) pthread_create(&w[i], NULL, worker, NULL);
  int done = 0, hung = 0, failed = 0;
  for (int i = 0; i < n; i++) {
    pid_t pid = fork();
    if (pid == 0) child_work();
    int status = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) done++;
        else { failed++; fprintf(stderr, "child %d status 0x%x\n", (int)pid, status); }
        break;
      }
      if (since(&t0) > timeout) {
        fprintf(stderr, "child %d hung\n", (int)pid);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        hung++;
        break;
      }
      usleep(1000);
    }
  }
  stop = 1;
  for (int i = 0; i < 4; i++) pthread_join(w[i], NULL);
  printf("children done %d hung %d failed %d\n", done, hung, failed);
  fflush(stdout);
  return done == n ? 0 : 1;
}
