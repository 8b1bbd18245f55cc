/* The scan at exit with many threads alive (tests/integration/test_leak_parity.py): N workers
 * (argv[1], default 500) each hold one block only in their own stack frame, blocked in pause()
 * -> still reachable, as valgrind finds it on their stacks; then one more thread, not main, calls
 * exit while they wait, with exit_patterns.h's blocks: pat_stale_slot's dropped (definitely lost),
 * pat_in_register's in a register (still reachable).  Each worker's caller frame, above the block's,
 * also holds a decoy: the address of code right after a call to exit, as a function placed after
 * a noreturn call to exit has (gcc put main so): a word that looks like that call's return address
 * on a stack that is in no call to exit (argv[2] "no-decoy": none, for bench/leak_bench.py exit). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "exit_patterns.h"

#if defined(__x86_64__)
/* Never called: only the address after its call to exit is used. */
__attribute__((noinline, used)) void decoy_site(void) {
  __asm__ volatile("call exit@PLT\n\t.globl after_exit_call\nafter_exit_call:\n\tnop");
}
extern char after_exit_call[];
#define DECOY ((void *)after_exit_call)
#else
#define DECOY NULL
#endif

static atomic_long ready;
static void *decoy_word = DECOY;

__attribute__((noinline)) void *pat_thread_held(void) {
  void *p = malloc(100);
  memset(p, 3, 100);
  return p;
}

__attribute__((noinline)) void hold_and_wait(void) {
  void *volatile held = pat_thread_held();
  atomic_fetch_add(&ready, 1);
  for (;;)
    pause();
  (void)held;
}

static void *worker(void *arg) {
  void *volatile decoy = decoy_word;
  hold_and_wait();
  return decoy;
}

static void *exiter(void *arg) {
  long n = (long)arg;
  while (atomic_load(&ready) < n)
    usleep(1000);
  pat_stale_slot();
  char *p = pat_in_register();   /* kept in a callee-saved register across the calls below */
  touch(p);
  touch(p);
  exit(0);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 500;
  if (argc > 2 && strcmp(argv[2], "no-decoy") == 0)
    decoy_word = NULL;
  pthread_attr_t attr;
  pthread_t t;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);     /* small: hundreds fit anywhere */
  for (long i = 0; i < n; i++) {
    if (pthread_create(&t, &attr, worker, NULL) != 0) {
      fprintf(stderr, "pthread_create %ld failed\n", i);
      return 3;
    }
  }
  if (pthread_create(&t, &attr, exiter, (void *)n) != 0)
    return 3;
  pthread_join(t, NULL);
  return 1;
}
