/* The stand-in's thread_suspend given up on (demo/darwin/mtmach.c): a thread that blocks the
 * suspend signal cannot be stopped, and thread_suspend says so after its deadline (2 s) -- but
 * the signal stays queued, and arrives once the thread unblocks it.  That late signal must stop
 * nothing and must not stand in for a later suspend's: a later thread_suspend returns only once
 * the thread is held by *its* signal, and after thread_resume the thread runs on.
 *
 * Prints one JSON object (tests/integration/test_world_darwin.py checks it). */
#define _GNU_SOURCE
#include "mtmach.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Atomic unsigned long g_count;
static _Atomic int g_tid;
static _Atomic int g_unblock;

static void *
spin (void * arg)
{
  sigset_t s;
  (void) arg;
  sigemptyset (&s);
  sigaddset (&s, SIGRTMIN + 5);                    /* mtmach.c's SUSPEND_SIGNAL */
  pthread_sigmask (SIG_BLOCK, &s, NULL);
  atomic_store (&g_tid, (int) syscall (SYS_gettid));
  while (!atomic_load (&g_unblock))
    atomic_fetch_add (&g_count, 1);
  pthread_sigmask (SIG_UNBLOCK, &s, NULL);         /* the given-up suspend's signal arrives here */
  for (;;)
    atomic_fetch_add (&g_count, 1);
  return NULL;
}

/* Whether the spinning thread ran during a 200 ms look. */
static int
runs (void)
{
  unsigned long a = atomic_load (&g_count);
  usleep (200000);
  return atomic_load (&g_count) != a;
}

int
main (void)
{
  pthread_t t;
  mtmach_name_threads_by_id ();                    /* names are thread ids: the spinner's is known */
  pthread_create (&t, NULL, spin, NULL);
  while (atomic_load (&g_tid) == 0)
    usleep (1000);
  mach_port_t * list = NULL;
  uint32_t n = 0;
  task_threads (mach_task_self_, &list, &n);       /* the stand-in learns the thread's name */
  mach_port_t th = (mach_port_t) atomic_load (&g_tid);
  int blocked_kr = thread_suspend (th);            /* given up after its deadline */
  int count_after_failure = mtmach_suspend_count (th);
  atomic_store (&g_unblock, 1);                    /* the late signal is delivered now */
  int ran_after_late_signal = runs ();
  int kr = thread_suspend (th);
  uint32_t state[42], cnt = 42;
  int state_kr = thread_get_state (th, x86_THREAD_STATE64, state, &cnt);
  int ran_while_held = runs ();
  int resume_kr = thread_resume (th);
  int ran_after_resume = runs ();
  printf ("{\"blocked_kr\": %d, \"count_after_failure\": %d, \"ran_after_late_signal\": %d, \"kr\": %d, "
          "\"state_kr\": %d, \"ran_while_held\": %d, \"resume_kr\": %d, \"ran_after_resume\": %d}\n",
          blocked_kr, count_after_failure, ran_after_late_signal, kr, state_kr, ran_while_held, resume_kr,
          ran_after_resume);
  fflush (stdout);
  _exit (0);
}
