/* The Darwin stop-the-world (cmodule/world.c built with MT_DARWIN) run on Linux against the
 * stand-in's Mach calls (demo/darwin/mtmach.c), as the agent runs it around every patch on a
 * device: a function's first bytes rewritten one at a time -- as a writer that is not atomic
 * leaves them, half old and half new, for a moment -- while four threads call it in a loop.
 *
 *   control    in a child process, the same rewriting with the world running: it must die (a
 *              thread runs a half-written prologue), or this harness proves nothing;
 *   stopped    mt_world_stop_clear: every thread held, none inside the bytes (one caught there
 *              is let go and caught again), the bytes rewritten, resumed -- no thread may die;
 *   and the rest of what the agent relies on: "Frida's" thread (in the skip list) never held;
 *   a thread not listed beforehand let go (MT_WORLD_STOP_NEW); one held inside "Frida's code"
 *   (MT_WORLD_STOP_BUSY, named); a thread that will return into a "module" counted by
 *   mt_world_refs; every right task_threads gave released; the clock through the timebase.
 *
 * Prints one JSON object (tests/integration/test_world_darwin.py checks it).  Built with
 * -I <generated layout header dir> -I tests/programs/leaks_darwin (its glib.h) -I cmodule. */
#define MT_DARWIN 1
#include "mt_layout.h"

void gum_clear_cache (gpointer address, gsize size);
#include "world.c"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <ucontext.h>

extern guint32 mtmach_thread_self (void);
extern int mtmach_suspend_count (guint32 thread);
extern int mtmach_user_refs (guint32 thread);

#define N_HOT 4
#define PATCH_BYTES 16
#define MAX_HELD 64

/* Two versions of hot(), 16 bytes of straight-line code (a thread spends most of its time in
 * them): mov eax, 1; nop x10; ret -- and xor eax, eax; inc eax; inc eax; nop x9; ret.  A thread
 * that runs a mix of the two faults (the mixes read memory at eax + a displacement of nops) or
 * returns what neither returns. */
static const guint8 HOT_A[PATCH_BYTES] = { 0xb8, 0x01, 0x00, 0x00, 0x00, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90,
                                            0x90, 0x90, 0x90, 0xc3 };
static const guint8 HOT_B[PATCH_BYTES] = { 0x31, 0xc0, 0xff, 0xc0, 0xff, 0xc0, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90,
                                            0x90, 0x90, 0x90, 0xc3 };

static guint8 * g_hot;
static volatile int g_stop;
static volatile long g_calls[N_HOT];
static volatile guint32 g_ports[N_HOT];
static volatile long g_frida_count;
static volatile guint32 g_frida_port, g_parked_port, g_module_port;
static volatile int g_release_parked, g_release_module, g_parked_in, g_module_in;

void
gum_clear_cache (gpointer address, gsize size)
{
  __builtin___clear_cache ((char *) address, (char *) address + size);
}

static void *
hot_caller (void * arg)
{
  long i = (long) arg;
  int (* hot) (void) = (int (*) (void)) g_hot;
  g_ports[i] = mtmach_thread_self ();
  while (!g_stop)
  {
    int r = hot ();
    if (r != 1 && r != 2)
      abort ();                                      /* a mix of the two ran */
    g_calls[i]++;
  }
  return NULL;
}

/* "Frida's" thread: in the skip list, never held, runs on while the world is stopped. */
static void *
frida_thread (void * arg)
{
  (void) arg;
  g_frida_port = mtmach_thread_self ();
  while (!g_stop)
    g_frida_count++;
  return NULL;
}

/* A thread parked inside "Frida's code" (its own section): a strict stop must not keep it held. */
__attribute__ ((noinline, section ("mt_fridacode"))) static void
frida_code_spin (void)
{
  g_parked_in = 1;
  while (!g_release_parked)
    __asm__ volatile ("pause");
}

static void *
parked_thread (void * arg)
{
  (void) arg;
  g_parked_port = mtmach_thread_self ();
  frida_code_spin ();
  while (!g_stop)
    usleep (1000);
  return NULL;
}

/* The strict stop's words into "Frida's code" that are no return address (world.c
 * mt_world_thread_ref, returns_only).  A function of that code whose address a thread keeps in a
 * live frame, while it waits elsewhere: a pointer to a function's first byte, which 16 NOPs
 * precede (no byte of a call). */
__asm__ (".pushsection mt_fridacode, \"ax\", @progbits\n"
         ".byte 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90\n"
         ".globl mt_frida_fn\n"
         "mt_frida_fn:\n"
         "  ret\n"
         ".popsection\n");
extern void mt_frida_fn (void);
static volatile guint32 g_pointer_port, g_called_port, g_signaled_port;
static volatile int g_pointer_in, g_called_in, g_signaled_spin, g_signaled_in, g_release_waits;
static volatile guint64 g_restorer, g_saved_pc;

static __attribute__ ((noinline)) void
keep_pointer (volatile guint64 * slot)
{
  slot[0] = (guint64) mt_frida_fn;
}

static void *
pointer_thread (void * arg)
{
  volatile guint64 slot[8];
  (void) arg;
  keep_pointer (slot);
  g_pointer_port = mtmach_thread_self ();
  g_pointer_in = 1;
  while (!g_release_waits)
    usleep (1000);
  return (void *) (guint64) slot[0];
}

/* A thread that called out of "Frida's code" and waits there: a return address after a call. */
__attribute__ ((noinline, section ("mt_fridacode"))) static void
frida_code_calls_out (void)
{
  g_called_in = 1;
  while (!g_release_waits)
    usleep (1000);
}

static void *
called_thread (void * arg)
{
  (void) arg;
  g_called_port = mtmach_thread_self ();
  frida_code_calls_out ();
  return NULL;
}

/* A thread interrupted by a signal inside "Frida's code", its handler waiting outside it: the
 * interrupted pc is only in the signal frame, after no call. */
__attribute__ ((noinline, section ("mt_fridacode"))) static void
frida_code_spin_until_signaled (void)
{
  g_signaled_spin = 1;
  while (!g_signaled_in)
    __asm__ volatile ("pause");
}

static void
on_usr2 (int sig, siginfo_t * info, void * context)
{
  (void) sig;
  (void) info;
  g_restorer = (guint64) __builtin_return_address (0);    /* the signal-return code */
  g_saved_pc = (guint64) ((ucontext_t *) context)->uc_mcontext.gregs[16];     /* x86-64's REG_RIP */
  g_signaled_in = 1;
  while (!g_release_waits)
    usleep (1000);
}

static void *
signaled_thread (void * arg)
{
  (void) arg;
  g_signaled_port = mtmach_thread_self ();
  frida_code_spin_until_signaled ();
  return NULL;
}

/* Round 26: a thread that last called an open range's entry through a register (TinyCC's code calls
 * through r11) and spins on in its own loop, r11 untouched: a register at the range's very start,
 * its pc elsewhere.  The loop's compare is the other case: a pc at an open range's start. */
extern void mt_register_loop (void);
static volatile guint32 g_register_port;
static volatile int g_register_in, g_release_register;

static __attribute__ ((noinline)) void
open_entry (void)
{
  __asm__ volatile ("");
}

static __attribute__ ((noinline)) void *
register_thread (void * arg)
{
  (void) arg;
  g_register_port = mtmach_thread_self ();
  /* g_register_in set once r11 holds the entry (a preemption between the two would otherwise leave
   * the first look to an r11 not yet written). */
  __asm__ volatile ("  mov %0, %%r11\n"
                    "  movl $1, %2\n"
                    "1:\n"
                    "  pause\n"
                    ".globl mt_register_loop\n"
                    "mt_register_loop:\n"         /* where a pause is interrupted: its end */
                    "  cmpl $0, %1\n"
                    "  je 1b\n"
                    : : "r" ((guint64) open_entry), "m" (g_release_register), "m" (g_register_in)
                    : "r11", "memory", "cc");
  return NULL;
}

/* The pc of the held thread `port` (0: not held). */
static guint64
held_pc (MtWorld * w, guint64 port)
{
  for (guint64 i = 0; i != w->n_threads; i++)
  {
    if (((MtWorldThread *) w->threads)[i].tid == port)
      return ((guint64 *) w->regs)[i * MT_WORLD_REGS + MT_WORLD_PC];
  }
  return 0;
}

/* A thread that will return into a "module" (its own section) from a sleep. */
__attribute__ ((noinline, section ("mt_module"))) static void
module_wait (void)
{
  g_module_in = 1;
  while (!g_release_module)
    usleep (2000);
  g_module_in = 0;
}

static void *
module_thread (void * arg)
{
  (void) arg;
  g_module_port = mtmach_thread_self ();
  module_wait ();
  while (!g_stop)
    usleep (1000);
  return NULL;
}

static volatile int g_late_started;

static void *
late_thread (void * arg)
{
  (void) arg;
  g_late_started = 1;
  while (!g_stop)
    usleep (1000);
  return NULL;
}

extern char __start_mt_fridacode[], __stop_mt_fridacode[], __start_mt_module[], __stop_mt_module[];

/* Rewrites hot()'s bytes from last to first, yielding between them: a non-atomic writer's
 * half-old, half-new prologue, held for a moment. */
static void
slow_write (const guint8 * bytes)
{
  for (int k = PATCH_BYTES - 1; k >= 0; k--)
  {
    ((volatile guint8 *) g_hot)[k] = bytes[k];
    sched_yield ();
  }
  gum_clear_cache (g_hot, PATCH_BYTES);
}

static void
start_hot (pthread_t * t)
{
  for (long i = 0; i < N_HOT; i++)
    pthread_create (&t[i], NULL, hot_caller, (void *) i);
  while (g_calls[0] == 0 || g_calls[N_HOT - 1] == 0)
    usleep (1000);
}

/* The control: the same writes with the world running, in a child.  Returns its wait status. */
static int
control (int patches)
{
  pid_t pid = fork ();
  if (pid == 0)
  {
    pthread_t t[N_HOT];
    start_hot (t);
    for (int i = 0; i < patches; i++)
      slow_write (i % 2 ? HOT_A : HOT_B);
    _exit (0);
  }
  int status = 0;
  waitpid (pid, &status, 0);
  return status;
}

static MtWorld *
new_world (guint64 * skip, guint64 n_skip)
{
  MtWorld * w = calloc (1, sizeof (MtWorld));
  w->self_tid = mtmach_thread_self ();
  w->skip = (guint64) skip;
  w->n_skip = n_skip;
  w->threads = (guint64) calloc (MAX_HELD, sizeof (MtWorldThread));
  w->threads_cap = MAX_HELD;
  w->regs = (guint64) calloc (MAX_HELD * MT_WORLD_REGS, 8);
  return w;
}

static int
held (MtWorld * w, guint32 port)
{
  for (guint64 i = 0; i < w->n_threads; i++)
    if (((MtWorldThread *) w->threads)[i].tid == port)
      return 1;
  return 0;
}

int
main (int argc, char ** argv)
{
  int patches = argc > 1 ? atoi (argv[1]) : 2000;
  g_hot = mmap (NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memcpy (g_hot, HOT_A, PATCH_BYTES);

  /* The control first, before this process has threads (fork keeps only the caller). */
  int control_status = control (patches);

  pthread_t hot[N_HOT], frida, parked, module;
  pthread_create (&frida, NULL, frida_thread, NULL);
  while (g_frida_port == 0)
    usleep (1000);
  start_hot (hot);
  guint64 skip[1] = { g_frida_port };
  MtWorld * w = new_world (skip, 1);
  guint64 range[2] = { (guint64) g_hot + 1, (guint64) g_hot + PATCH_BYTES };

  /* How often a plain stop finds a thread inside the bytes: what mt_world_stop_clear moves on. */
  int looks = 0, inside = 0, frida_held = 0, frida_ran_stopped = 0, frozen = 1;
  for (; looks < 200; looks++)
  {
    if (!mt_world_stop (w))
      break;
    inside += mt_world_inside (w, range, 1) != 0;
    frida_held += held (w, g_frida_port);
    long f0 = g_frida_count, c0 = g_calls[0];
    if (looks % 50 == 0)
    {
      /* Until "Frida's" thread has run (2 s at most: a loaded machine -- 17 runnable threads a CPU
       * in one CI-like run -- may not schedule it within a fixed 20 ms, the one failure of this
       * check) and 20 ms at least, for the held callers to show they do not. */
      int waited_ms = 0;
      do
      {
        usleep (20000);
        waited_ms += 20;
      }
      while (g_frida_count == f0 && waited_ms < 2000);
      frida_ran_stopped += g_frida_count != f0;
      frozen &= g_calls[0] == c0 && mtmach_suspend_count (g_ports[0]) == 1 && mtmach_suspend_count (g_frida_port) == 0;
    }
    mt_world_resume (w);
  }

  /* The storm: every rewrite with the world stopped clear of the bytes. */
  int stopped = 0, not_clear = 0, n_held_min = 1 << 30;
  for (int i = 0; i < patches; i++)
  {
    if (!mt_world_stop_clear (w, range, 1, 400, 500))
    {
      not_clear++;
      continue;
    }
    if ((int) w->n_threads < n_held_min)
      n_held_min = (int) w->n_threads;
    slow_write (i % 2 ? HOT_A : HOT_B);
    mt_world_resume (w);
    stopped++;
  }
  long calls_after = 0;
  for (int i = 0; i < N_HOT; i++)
    calls_after += g_calls[i] != 0;

  /* A thread started after the listing is let go: STOP_NEW. */
  guint64 listed[MAX_HELD];
  guint64 n_listed = mt_world_list_tasks (0, listed, MAX_HELD);
  pthread_create (&module, NULL, module_thread, NULL);
  while (!g_module_in)
    usleep (1000);
  gint new_got = mt_world_stop_checked (w, range, 1, 400, 500, listed, n_listed, NULL, 0, 0, NULL, 0, 0, NULL);
  int module_suspended_after_new = mtmach_suspend_count (g_module_port);

  /* A thread started while the world is stopped (as xnu starts workqueue threads by itself) is
   * neither held nor skipped: mt_world_unheld sees it, and a checked stop lets go (STOP_NEW) even
   * with a listing that names it. */
  guint64 unheld_before = ~0ULL, unheld_after = ~0ULL;
  pthread_t late;
  g_late_started = 0;
  if (mt_world_stop (w))
  {
    unheld_before = mt_world_unheld (w);
    pthread_create (&late, NULL, late_thread, NULL);
    while (!g_late_started)
      usleep (1000);
    unheld_after = mt_world_unheld (w);
    mt_world_resume (w);
  }

  /* mt_world_refs: the module thread will return into module_wait (a word of its stack). */
  guint8 * scratch = malloc (65536);
  guint64 module_range[2] = { (guint64) __start_mt_module, (guint64) __stop_mt_module };
  guint64 refs_in = ~0ULL, refs_out = ~0ULL;
  if (mt_world_stop (w))
  {
    refs_in = mt_world_refs (w, module_range, 1, 256 * 1024, scratch, 65536);
    mt_world_resume (w);
  }
  g_release_module = 1;
  while (g_module_in)
    usleep (1000);
  if (mt_world_stop (w))
  {
    refs_out = mt_world_refs (w, module_range, 1, 256 * 1024, scratch, 65536);
    mt_world_resume (w);
  }

  /* A strict stop with a thread inside "Frida's code": BUSY, that thread named; then CLEAR. */
  pthread_create (&parked, NULL, parked_thread, NULL);
  while (!g_parked_in)
    usleep (1000);
  guint64 frida_code[2] = { (guint64) __start_mt_fridacode, (guint64) __stop_mt_fridacode };
  guint64 busy[4] = { 0, 0, 0, 0 };
  n_listed = mt_world_list_tasks (0, listed, MAX_HELD);
  gint busy_got = mt_world_stop_checked (w, range, 1, 400, 500, listed, n_listed, frida_code, 1, 8192, scratch, 65536,
      0, busy);
  int parked_suspended_after_busy = mtmach_suspend_count (g_parked_port);
  g_release_parked = 1;
  usleep (20000);
  n_listed = mt_world_list_tasks (0, listed, MAX_HELD);
  gint clear_got = mt_world_stop_checked (w, range, 1, 400, 500, listed, n_listed, frida_code, 1, 8192, scratch, 65536,
      1, NULL);

  /* The strict stop's look at words that are no return address.  Three threads wait outside
   * "Frida's code": one keeps a pointer to one of its functions, one called out of it, one was
   * interrupted inside it by a signal.  Each is looked at alone (the others skipped, as Frida's
   * threads are), with no signal-return code known (every word counts), with a wrong one (the
   * signal frame unseen: its saved pc dismissed -- the control), and with the right one. */
  pthread_t pointer_t, called_t, signaled_t;
  struct sigaction usr2;
  memset (&usr2, 0, sizeof (usr2));
  usr2.sa_sigaction = on_usr2;
  usr2.sa_flags = SA_SIGINFO;
  sigaction (SIGUSR2, &usr2, NULL);
  pthread_create (&pointer_t, NULL, pointer_thread, NULL);
  pthread_create (&called_t, NULL, called_thread, NULL);
  pthread_create (&signaled_t, NULL, signaled_thread, NULL);
  while (!g_pointer_in || !g_called_in || !g_signaled_spin)
    usleep (1000);
  pthread_kill (signaled_t, SIGUSR2);
  while (!g_signaled_in)
    usleep (1000);
  usleep (20000);                      /* each thread into its sleep */
  guint64 skip_p[3] = { g_frida_port, g_called_port, g_signaled_port };
  guint64 skip_c[3] = { g_frida_port, g_pointer_port, g_signaled_port };
  guint64 skip_s[3] = { g_frida_port, g_pointer_port, g_called_port };
  MtWorld * wp = new_world (skip_p, 3), * wc = new_world (skip_c, 3), * ws = new_world (skip_s, 3);
  guint64 restorer[2] = { g_restorer, g_restorer + 16 }, elsewhere[2] = { 1, 2 };
  guint64 busy_pointer[3][4], busy_called[4], busy_signaled[3][4];
  gint got_pointer[3], got_called, got_signaled[3];
  for (int known = 0; known < 3; known++)
  {
    wp->signal_returns = ws->signal_returns = (guint64) (known == 2 ? restorer : elsewhere);
    wp->n_signal_returns = ws->n_signal_returns = known == 0 ? 0 : 1;
    n_listed = mt_world_list_tasks (0, listed, MAX_HELD);
    got_pointer[known] = mt_world_stop_checked (wp, range, 1, 400, 500, listed, n_listed, frida_code, 1, 8192,
        scratch, 65536, 1, busy_pointer[known]);
    n_listed = mt_world_list_tasks (0, listed, MAX_HELD);
    got_signaled[known] = mt_world_stop_checked (ws, range, 1, 400, 500, listed, n_listed, frida_code, 1, 8192,
        scratch, 65536, 1, busy_signaled[known]);
  }
  wc->signal_returns = (guint64) restorer;
  wc->n_signal_returns = 1;
  n_listed = mt_world_list_tasks (0, listed, MAX_HELD);
  got_called = mt_world_stop_checked (wc, range, 1, 400, 500, listed, n_listed, frida_code, 1, 8192, scratch, 65536,
      1, busy_called);
  /* Code about to be freed still counts every word (mt_world_refs): the pointer's thread too --
   * unless the range is "open" (mt_world_refs_open: an entry only our own code calls, a
   * trampoline) and the word is its very start; a return address inside one still counts. */
  guint64 refs_pointer = ~0ULL, refs_pointer_open = ~0ULL, refs_called_open = ~0ULL;
  guint64 fn_range[2] = { (guint64) mt_frida_fn, (guint64) mt_frida_fn + 1 };
  if (mt_world_stop (wp))
  {
    refs_pointer = mt_world_refs (wp, fn_range, 1, 8192, scratch, 65536);
    refs_pointer_open = mt_world_refs_open (wp, fn_range, 1, 0, 0, 8192, scratch, 65536);
    mt_world_resume (wp);
  }
  if (mt_world_stop (wc))
  {
    refs_called_open = mt_world_refs_open (wc, frida_code, 1, 0, 0, 8192, scratch, 65536);
    mt_world_resume (wc);
  }
  /* The quiesce with return addresses only (process.c's module): the pointer's thread does not
   * count, the caller's return address and the signal frame's saved pc do. */
  guint64 refs_returns[3] = { ~0ULL, ~0ULL, ~0ULL };
  MtWorld * rw[3] = { wp, wc, ws };
  for (int t = 0; t < 3; t++)
  {
    rw[t]->signal_returns = (guint64) restorer;
    rw[t]->n_signal_returns = 1;
    if (mt_world_stop (rw[t]))
    {
      refs_returns[t] = mt_world_refs_open (rw[t], frida_code, 1, 1, 1, 8192, scratch, 65536);
      mt_world_resume (rw[t]);
    }
  }
  /* A pc saved in a signal frame at an open range's very start is where the thread resumes: it
   * counts -- once the frame is seen (none known: no start is exempt; a wrong one: the control). */
  guint64 saved_pc_range[2] = { g_saved_pc, g_saved_pc + 1 }, refs_saved_open[3] = { ~0ULL, ~0ULL, ~0ULL };
  for (int known = 0; known < 3; known++)
  {
    ws->signal_returns = (guint64) (known == 2 ? restorer : elsewhere);
    ws->n_signal_returns = known == 0 ? 0 : 1;
    if (mt_world_stop (ws))
    {
      refs_saved_open[known] = mt_world_refs_open (ws, saved_pc_range, 1, 0, 0, 8192, scratch, 65536);
      mt_world_resume (ws);
    }
  }
  g_release_waits = 1;
  pthread_join (pointer_t, NULL);
  pthread_join (called_t, NULL);
  pthread_join (signaled_t, NULL);

  /* Registers at an open range's start: r11 left pointing at the entry does not count where the
   * range is open (it does where it is not); the pc at the loop's first byte counts either way. */
  pthread_t register_t;
  pthread_create (&register_t, NULL, register_thread, NULL);
  while (!g_register_in)
    usleep (1000);
  usleep (20000);
  guint64 skip_r[1] = { g_frida_port };
  MtWorld * wr = new_world (skip_r, 1);
  guint64 entry_range[2] = { (guint64) open_entry, (guint64) open_entry + 1 };
  guint64 loop_range[2] = { (guint64) mt_register_loop, (guint64) mt_register_loop + 1 };
  guint64 refs_register = ~0ULL, refs_register_open = ~0ULL, refs_pc_open = ~0ULL;
  if (mt_world_stop (wr))
  {
    refs_register = mt_world_refs (wr, entry_range, 1, 8192, scratch, 65536);
    refs_register_open = mt_world_refs_open (wr, entry_range, 1, 0, 0, 8192, scratch, 65536);
    mt_world_resume (wr);
  }
  /* Held until one stop finds its pc at the compare (after a pause: most of its time). */
  for (int look = 0; look < 2000 && refs_pc_open == ~0ULL; look++)
  {
    if (mt_world_stop (wr))
    {
      if (held_pc (wr, g_register_port) == loop_range[0])
        refs_pc_open = mt_world_refs_open (wr, loop_range, 1, 0, 0, 8192, scratch, 65536);
      mt_world_resume (wr);
    }
  }
  g_release_register = 1;
  pthread_join (register_t, NULL);

  /* The clock: mach_absolute_time through the timebase, in microseconds. */
  guint64 t0 = mt_world_now_us ();
  usleep (200000);
  guint64 slept_us = mt_world_now_us () - t0;

  guint64 code[2] = { 0, 0 };
  int frida_code_found = mt_world_frida_code (code);
  int code_has_it = code[0] <= (guint64) gum_clear_cache && (guint64) gum_clear_cache < code[1];
  /* The Darwin writer (no mprotect given): through a writable alias, the code page executable all
   * along -- of shared pages here (the stand-in's remap cannot alias a private page: refused). */
  guint8 byte = 0x90;
  int wrote = mt_world_write (g_hot + 8, &byte, 1, NULL, 4096);
  guint8 * shared = mmap (NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  static const guint8 RET7[6] = { 0xb8, 0x07, 0x00, 0x00, 0x00, 0xc3 }, RET9[6] = { 0xb8, 0x09, 0x00, 0x00, 0x00, 0xc3 };
  memcpy (shared, RET7, sizeof (RET7));
  mprotect (shared, 4096, PROT_READ | PROT_EXEC);
  int before_alias = ((int (*) (void)) shared) ();
  int alias_wrote = mt_world_write (shared, RET9, sizeof (RET9), NULL, 4096);
  int after_alias = ((int (*) (void)) shared) ();

  g_stop = 1;
  for (int i = 0; i < N_HOT; i++)
    pthread_join (hot[i], NULL);
  int refs_ok = 1;
  for (int i = 0; i < N_HOT; i++)
    refs_ok &= mtmach_user_refs (g_ports[i]) == 1;
  refs_ok &= mtmach_user_refs (g_frida_port) == 1 && mtmach_user_refs (g_module_port) == 1 &&
      mtmach_user_refs (g_parked_port) == 1;
  int names_are_not_tids = g_frida_port > 0x1000 && (g_frida_port & 0xff) == 0x03;

  printf ("{\"control_signaled\": %d, \"control_signal\": %d, \"looks\": %d, \"inside\": %d, \"frida_held\": %d,"
          " \"frida_ran_stopped\": %d, \"frozen\": %d, \"patches\": %d, \"stopped\": %d, \"not_clear\": %d,"
          " \"held_min\": %d, \"callers_ran\": %ld, \"new_got\": %d, \"module_suspended_after_new\": %d,"
          " \"refs_in\": %llu, \"refs_out\": %llu, \"busy_got\": %d, \"busy_n\": %llu, \"busy_first_is_parked\": %d,"
          " \"parked_suspended_after_busy\": %d, \"clear_got\": %d, \"slept_us\": %llu, \"frida_code_found\": %d,"
          " \"frida_code_has_gum\": %d, \"wrote\": %d, \"alias_wrote\": %d, \"alias_before\": %d, \"alias_after\": %d,"
          " \"rights_released\": %d, \"names_are_not_tids\": %d, \"unheld_before\": %llu, \"unheld_after\": %llu,"
          " \"pointer_got\": [%d, %d, %d], \"pointer_busy_where\": %llu, \"called_got\": %d, \"called_busy_is_it\": %d,"
          " \"signaled_got\": [%d, %d, %d], \"signaled_busy_is_it\": %d, \"refs_pointer\": %llu,"
          " \"refs_pointer_open\": %llu, \"refs_called_open\": %llu, \"refs_saved_open\": [%llu, %llu, %llu],"
          " \"refs_returns\": [%llu, %llu, %llu],"
          " \"refs_register\": %llu, \"refs_register_open\": %llu, \"refs_pc_open\": %llu}\n",
          WIFSIGNALED (control_status), WIFSIGNALED (control_status) ? WTERMSIG (control_status) : 0, looks, inside,
          frida_held, frida_ran_stopped, frozen, patches, stopped, not_clear, n_held_min, calls_after, new_got,
          module_suspended_after_new, (unsigned long long) refs_in, (unsigned long long) refs_out, busy_got,
          (unsigned long long) busy[0], busy[1] == g_parked_port, parked_suspended_after_busy, clear_got,
          (unsigned long long) slept_us, frida_code_found, code_has_it, wrote, alias_wrote, before_alias, after_alias, refs_ok,
          names_are_not_tids, (unsigned long long) unheld_before, (unsigned long long) unheld_after,
          got_pointer[0], got_pointer[1], got_pointer[2], (unsigned long long) busy_pointer[0][2], got_called,
          busy_called[1] == g_called_port, got_signaled[0], got_signaled[1], got_signaled[2],
          busy_signaled[2][1] == g_signaled_port,
          (unsigned long long) refs_pointer, (unsigned long long) refs_pointer_open,
          (unsigned long long) refs_called_open, (unsigned long long) refs_saved_open[0],
          (unsigned long long) refs_saved_open[1], (unsigned long long) refs_saved_open[2],
          (unsigned long long) refs_returns[0], (unsigned long long) refs_returns[1],
          (unsigned long long) refs_returns[2], (unsigned long long) refs_register,
          (unsigned long long) refs_register_open, (unsigned long long) refs_pc_open);
  return 0;
}
