/* thread_leaker: a known pattern of thread creations, joins and detaches.  Expected
 * (tests/integration/test_threads.py), in order:
 *   start_long_lived   2 joinable threads (long_lived_task) that block until main exits
 *   run_joined_workers 4 joinable (worker_task), all alive at once at a barrier, then joined
 *                      -> peak: main + 2 + 4 = 7 threads
 *   run_detached_later 3 joinable (detached_task), pthread_detach'ed; each ends before the next
 *   run_detached_attr  2 created detached with a 256 KiB stack (attr_task), one at a time
 *   leak_joinable      5 joinable (quick_task), never joined nor detached, one at a time: leaked
 *   try_huge_stack     1 pthread_create with an impossible stack size: fails (EAGAIN or ENOMEM)
 * Prints "done" and exits while the 2 long-lived threads still run. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static pthread_barrier_t barrier;
static atomic_int finished;
static int block_pipe[2];
static atomic_int last_tid;    /* the kernel id of the last counted thread to return */

NOINLINE void *long_lived_task(void *arg) {
  char c;
  read(block_pipe[0], &c, 1);   /* never written: blocks until the process exits */
  return arg;
}

NOINLINE void *worker_task(void *arg) {
  pthread_barrier_wait(&barrier);
  return arg;
}

/* Three distinct start routines (the compiler must not fold them into one symbol). */
NOINLINE void *detached_task(void *arg) {
  atomic_store(&last_tid, (int) syscall(SYS_gettid));
  atomic_fetch_add(&finished, 1);
  return arg;
}

NOINLINE void *attr_task(void *arg) {
  atomic_store(&last_tid, (int) syscall(SYS_gettid));
  atomic_fetch_add(&finished, 1);
  return (char *) arg + 1;
}

NOINLINE void *quick_task(void *arg) {
  atomic_store(&last_tid, (int) syscall(SYS_gettid));
  atomic_fetch_add(&finished, 1);
  return (char *) arg + 2;
}

/* Wait until `n` counted threads have returned and the last of them is gone from the kernel's
 * task list: its exit has happened (the tracer's exit hook runs before the thread ends).  A fixed
 * sleep could leave the last leaked thread on its way out, on a loaded machine, when main returned. */
static void wait_finished(int n) {
  while (atomic_load(&finished) < n) usleep(1000);
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/task/%d", atomic_load(&last_tid));
  struct stat st;
  for (int i = 0; i < 20000 && stat(path, &st) == 0; i++) usleep(1000);
}

NOINLINE void start_long_lived(void) {
  pthread_t t;
  pipe(block_pipe);
  for (int i = 0; i < 2; i++) pthread_create(&t, NULL, long_lived_task, NULL);
}

NOINLINE void run_joined_workers(void) {
  pthread_t t[4];
  pthread_barrier_init(&barrier, NULL, 5);
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker_task, NULL);
  usleep(50000);                     /* all four alive and waiting: the peak */
  pthread_barrier_wait(&barrier);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
}

NOINLINE void run_detached_later(void) {
  for (int i = 0; i < 3; i++) {
    pthread_t t;
    int before = atomic_load(&finished);
    pthread_create(&t, NULL, detached_task, NULL);
    pthread_detach(t);
    wait_finished(before + 1);
  }
}

NOINLINE void run_detached_attr(void) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  for (int i = 0; i < 2; i++) {
    pthread_t t;
    int before = atomic_load(&finished);
    pthread_create(&t, &attr, attr_task, NULL);
    wait_finished(before + 1);
  }
  pthread_attr_destroy(&attr);
}

NOINLINE void leak_joinable(void) {
  for (int i = 0; i < 5; i++) {
    pthread_t t;
    int before = atomic_load(&finished);
    pthread_create(&t, NULL, quick_task, NULL);
    wait_finished(before + 1);
  }
}

NOINLINE void try_huge_stack(void) {
  pthread_attr_t attr;
  pthread_t t;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, (size_t) 1 << 46);
  int r = pthread_create(&t, &attr, quick_task, NULL);
  printf("huge stack: %s\n", strerror(r));
  pthread_attr_destroy(&attr);
}

int main(void) {
  start_long_lived();
  run_joined_workers();
  run_detached_later();
  run_detached_attr();
  leak_joinable();
  try_huge_stack();
  printf("done\n");
  fflush(stdout);
  return 0;
}
