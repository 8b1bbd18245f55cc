/*
 * Stopping the world: every thread of the target but the caller and Frida's own held still, their
 * registers read, then let go.  ONE mechanism for both of its users:
 *   - the leak scan (leaks.c, through mt_leak_stop/mt_leak_resume), which reads the stopped
 *     threads' registers and stacks as roots;
 *   - every hook going in or out (agents/runtime/world.js): Frida's Interceptor rewrites a
 *     function's first bytes in place and, on Linux, suspends nobody (gum's mprotect path when
 *     RWX pages are allowed), so a thread executing those bytes meanwhile would resume in the
 *     middle of new instructions.  The agent queues its Interceptor changes, stops the world
 *     until no stopped thread's pc lies inside a prologue about to be rewritten (mt_world_stop_clear:
 *     a thread caught there is let go and caught again, which moves it on), applies them, resumes.
 *     Before memtrace's code is unloaded, mt_world_refs (mt_world_refs_open) tells whether any
 *     thread still runs in it or will return into it.
 * Compiled into the malloc tracer's CModule (for leaks.c) and into every tracer's process CModule
 * (agents/runtime/process.js), so nothing in it may need a symbol the other lacks: it calls only
 * the C library functions both are given.
 *
 * Linux: a helper process that shares our memory (clone(CLONE_VM), not a thread, since a thread
 * may not ptrace its own thread group) seizes and interrupts every thread of the process but the caller
 * and Frida's own (the agent lists them: Frida cloaks them), reads their registers, and holds them
 * until told to let go -- LeakSanitizer's StopTheWorld.  ptrace stops are transparent to the
 * stopped threads: a sleep in progress resumes where it was (a signal-handler stop would end it
 * early with EINTR).
 *
 * Deadlock-freedom.  While the world is stopped a stopped thread may hold any lock of the target
 * (the allocator's arena, a stdio lock, a thread descriptor's lock).  So:
 *   - nothing here allocates or takes a lock: no stdio, no opendir (getdents64 into a stack
 *     buffer), no allocator;
 *   - Frida's threads are never stopped, and the caller (the agent's JavaScript thread) does only
 *     Interceptor's patching while the world is stopped, which takes Frida's own locks and no
 *     lock of the target's (world.js says what it must not do);
 *   - Frida's threads may block on a lock a stopped thread holds (one calling pthread_getattr_np,
 *     which reallocates under its descriptor's lock, say): they wait until the world resumes,
 *     and nothing that resumes it ever waits for them;
 *   - the helper dies with the thread that made it (PR_SET_PDEATHSIG): a target killed while its
 *     world is stopped leaves no helper behind, and ptrace lets go of its tracees when it dies;
 *   - every wait is bounded (MT_WORLD_STOP_TIMEOUT_US, MT_WORLD_HOLD_LIMIT_US).
 * Under a seccomp filter (one that traps a non-thread clone would kill the process with SIGSYS)
 * no helper is made: the threads are stopped with a signal instead where the module has the
 * signal stop (MT_WORLD_SIGSTOP, below), else the stop is refused with the reason in `error`, as
 * where ptrace is not allowed.
 *
 * Darwin (MT_DARWIN, below): the same MtWorld and the same calls, with the threads held by Mach
 * thread suspension (task_threads, thread_suspend, thread_get_state) instead of a helper process:
 * every patch of every tracer (iosurface, purgeable, fds, threads, probe) and the leak scan stop
 * the world through it; mt_world_write writes through a writable alias there (no RWX pages).
 */

#define MT_WORLD_HOLD_LIMIT_US (600ULL * 1000000ULL)

/* A full barrier: an atomic add of 0 to the state word (no static: a TinyCC module's data may not
 * be writable). */
static inline void
mt_world_barrier (MtWorld * w)
{
  g_atomic_int_add ((volatile gint *) &w->state, 0);
}

static inline guint64
mt_world_state (MtWorld * w)
{
  return (guint64) g_atomic_int_add ((volatile gint *) &w->state, 0);
}

static gboolean
mt_world_is_skipped (MtWorld * w, guint64 tid)
{
  const guint64 * skip = (const guint64 *) w->skip;
  guint64 i;
  if (tid == w->self_tid)
    return TRUE;
  for (i = 0; i != w->n_skip; i++)
  {
    if (skip[i] == tid)
      return TRUE;
  }
  return FALSE;
}

static gboolean
mt_world_is_held (MtWorld * w, guint64 tid)
{
  MtWorldThread * t = (MtWorldThread *) w->threads;
  guint64 i;
  for (i = 0; i != w->n_threads; i++)
  {
    if (t[i].tid == tid)
      return TRUE;
  }
  return FALSE;
}

/* How long a stop may take: the caller's bound (the leak scan's budget), else the default. */
static guint64
mt_world_timeout_us (MtWorld * w)
{
  guint64 t = w->stop_timeout_us;
  /* The caller's own bound wins, longer or shorter (the leak scan gives its whole budget: thousands
   * of threads on a loaded machine take more than the default); never past the hold limit. */
  if (t == 0)
    return MT_WORLD_STOP_TIMEOUT_US;
  return t < MT_WORLD_HOLD_LIMIT_US ? t : MT_WORLD_HOLD_LIMIT_US;
}

/* What mt_world_each_task (one per platform, below) calls for every thread of the process. */
typedef void (* MtWorldVisit) (MtWorld * w, guint64 tid, gpointer data);

#ifndef MT_DARWIN

#define MT_WORLD_WAIT_US 200

/* MtWorld.error: why the world could not be stopped, or why a thread could not be -- MT_WORLD_E_ATTACH
 * (a thread could not be attached, most often: it ended), _CLONE (the helper could not be made),
 * _TIMEOUT (the helper did not report the world stopped in time), _SECCOMP (a seccomp filter is
 * installed: clone may be trapped), _INSIDE (mt_world_stop_clear: a thread stayed inside a range, or
 * running): generated from layout.WORLD_ERROR_CODES. */

/* System calls through syscall(2) only, never libc's wrappers (open, close, read, usleep,
 * waitpid, ptrace, prctl): the helper process runs this code too, and a wrapper may be hooked --
 * the descriptor guard redirects close, the fds tracer listens on open and close -- so the helper
 * would run Frida's interceptor (and a JavaScript listener) on a thread that is not one: sharing
 * the stopping thread's TLS (clone without CLONE_SETTLS), wanting the script's lock that thread
 * holds.  The threads storm's SIGSEGV in Frida's allocator (docs/hook-storm.md) came after such
 * stops.  syscall itself is hooked by no tracer. */
extern gint clone (gint (* fn) (gpointer), gpointer stack, gint flags, gpointer arg, ...);
extern glong syscall (glong number, ...);
/* Declared for process.c's signal-mask helper, which uses these wrappers (none is hooked by a
 * tracer today); world.c itself does not. */
extern glong ptrace (gint request, ...);
extern gint waitpid (gint pid, gint * status, gint options);
extern gint prctl (gint option, ...);
extern gint usleep (guint usec);
extern gssize process_vm_readv (gint pid, gpointer local, gulong nlocal, gpointer remote, gulong nremote,
    gulong flags);

#define MT_CLONE_VM 0x100
#define MT_CLONE_FS 0x200
#define MT_CLONE_FILES 0x400
#define MT_CLONE_UNTRACED 0x00800000
#define MT_WALL 0x40000000
#define MT_WCLONE 0x80000000
#define MT_PTRACE_CONT 7
#define MT_PTRACE_SEIZE 0x4206
#define MT_PTRACE_INTERRUPT 0x4207
#define MT_PTRACE_EVENT_STOP 128
#define MT_WNOHANG 1
#define MT_PTRACE_DETACH 17
#define MT_PTRACE_GETREGSET 0x4204
#define MT_NT_PRSTATUS 1
#define MT_PR_SET_PDEATHSIG 1
#define MT_PR_SET_PTRACER 0x59616d61
#define MT_SIGKILL 9
#ifdef MT_ARM64
# define MT_SYS_GETDENTS64 61
# define MT_SYS_TGKILL 131
# define MT_SYS_CLOCK_GETTIME 113
# define MT_SYS_OPENAT 56
# define MT_SYS_CLOSE 57
# define MT_SYS_READ 63
# define MT_SYS_NANOSLEEP 101
# define MT_SYS_PTRACE 117
# define MT_SYS_PRCTL 167
# define MT_SYS_WAIT4 260
# define MT_SYS_GETPPID 173
# define MT_SYS_RT_SIGPROCMASK 135
# define MT_WORLD_SP 31                    /* struct user_pt_regs: x0..x30, sp, pc, pstate */
# define MT_WORLD_PC 32
#else
# define MT_SYS_GETDENTS64 217
# define MT_SYS_TGKILL 234
# define MT_SYS_CLOCK_GETTIME 228
# define MT_SYS_OPENAT 257
# define MT_SYS_CLOSE 3
# define MT_SYS_READ 0
# define MT_SYS_NANOSLEEP 35
# define MT_SYS_PTRACE 101
# define MT_SYS_PRCTL 157
# define MT_SYS_WAIT4 61
# define MT_SYS_GETPPID 110
# define MT_SYS_RT_SIGPROCMASK 14
# define MT_WORLD_SP 19                    /* struct user_regs_struct: ... rip(16) cs eflags rsp(19) ss ... */
# define MT_WORLD_PC 16
#endif

#define MT_AT_FDCWD (-100)
#define mt_ptrace(req, tid, addr, data) \
  syscall (MT_SYS_PTRACE, (glong) (req), (glong) (tid), (glong) (gsize) (addr), (glong) (gsize) (data))
#define mt_waitpid(pid, status, options) syscall (MT_SYS_WAIT4, (glong) (pid), (glong) (gsize) (status), \
  (glong) (options), 0L)
#define mt_prctl(option, a, b, c, d) syscall (MT_SYS_PRCTL, (glong) (option), (glong) (a), (glong) (b), (glong) (c), \
  (glong) (d))
#define mt_open(path, flags) syscall (MT_SYS_OPENAT, (glong) MT_AT_FDCWD, (glong) (gsize) (path), (glong) (flags), 0L)
#define mt_close_fd(fd) syscall (MT_SYS_CLOSE, (glong) (fd))
#define mt_read(fd, buf, count) syscall (MT_SYS_READ, (glong) (fd), (glong) (gsize) (buf), (glong) (count))
#define mt_getppid() ((guint64) syscall (MT_SYS_GETPPID))

static void
mt_world_sleep_us (guint64 us)
{
  glong ts[2];
  ts[0] = (glong) (us / 1000000);
  ts[1] = (glong) ((us % 1000000) * 1000);
  syscall (MT_SYS_NANOSLEEP, (glong) (gsize) ts, 0L);
}

/* Every signal blocked in the calling task, by system call: the first thing a helper clone does.
 * A clone without CLONE_SIGHAND starts with a copy of the target's handlers and the calling
 * thread's mask, and every thread it stops sends it a SIGCHLD -- the target's own SIGCHLD handler
 * (a reaper's waitpid loop took the helper's stop reports: none held) would run in the helper,
 * with the world stopped and any of the target's locks held by a stopped thread.  SIGKILL (the
 * death signal) cannot be blocked; waitpid needs no signal. */
static void
mt_world_block_signals (void)
{
  guint64 all = ~(guint64) 0;
  syscall (MT_SYS_RT_SIGPROCMASK, 2L /* SIG_SETMASK */, (glong) (gsize) &all, 0L, 8L);
}

/* The monotonic clock, in microseconds, by system call (`syscall` is a symbol both CModules have).
 * Every bound here is a time, never a count of sleeps: in a process whose 128 threads kept both
 * CPUs busy, usleep (200) took 19 ms, not 0.2 (1000 of them 19 s), which stretched the leak
 * scan's 10 s stop to minutes (issue 27: "the stop phase ignores the budget, 49 s"). */
static guint64
mt_world_now_us (void)
{
  gint64 ts[2];
  ts[0] = 0;
  ts[1] = 0;
  syscall (MT_SYS_CLOCK_GETTIME, 1L, ts);          /* CLOCK_MONOTONIC */
  return (guint64) ts[0] * 1000000ULL + (guint64) ts[1] / 1000ULL;
}

/* How long a stop waits for threads that have not stopped yet: given up once none has stopped for
 * this long (mt_world_wait_pass; process.c's mt_mask_attach, for one thread). */
#define MT_WORLD_ATTACH_LIMIT_US 1000000ULL

static guint64
mt_world_parse_u64 (const gchar * s)
{
  guint64 v = 0;
  if (*s < '0' || *s > '9')
    return 0;
  while (*s >= '0' && *s <= '9')
    v = v * 10 + (guint64) (*s++ - '0');
  return v;
}

/* v's decimal digits at out (20 at most, no terminator); returns how many. */
static gint
mt_world_put_u64 (gchar * out, guint64 v)
{
  gchar digits[24];
  gint k = 0, d = 0;
  do
  {
    digits[d++] = (gchar) ('0' + v % 10);
    v /= 10;
  }
  while (v != 0);
  while (d > 0)
    out[k++] = digits[--d];
  return k;
}

/* "/proc/<tgid>/<leaf>" into path (64 bytes). */
static void
mt_world_proc_path (gchar * path, guint64 tgid, const gchar * leaf)
{
  const gchar * part = "/proc/";
  gint k = 0;
  while (*part)
    path[k++] = *part++;
  k += mt_world_put_u64 (path + k, tgid);
  path[k++] = '/';
  while (*leaf && k < 62)
    path[k++] = *leaf++;
  path[k] = 0;
}

/*
 * Calls visit(w, tid) for every thread of tgid (no allocation, no libc stdio: getdents64 into
 * a buffer on the stack, so any number of threads is visited, 4 KB at a time).  w may be NULL
 * for a listing.  Returns how many threads were listed.
 */
static guint64
mt_world_each_task (guint64 tgid, MtWorldVisit visit, MtWorld * w, gpointer data)
{
  gchar path[64];
  guint64 dents[512];                           /* 4 KB, 8-byte aligned */
  guint64 n = 0;
  gint fd;
  mt_world_proc_path (path, tgid, "task");
  fd = mt_open (path, 0x10000);                    /* O_DIRECTORY */
  if (fd < 0)
    return 0;
  for (;;)
  {
    glong got = syscall (MT_SYS_GETDENTS64, fd, dents, sizeof (dents));
    glong off = 0;
    if (got <= 0)
      break;
    while (off < got)
    {
      guint8 * e = (guint8 *) dents + off;           /* linux_dirent64: ino, off, reclen, type, name */
      guint64 tid = mt_world_parse_u64 ((const gchar *) (e + 19));
      off += *(guint16 *) (e + 16);
      if (tid != 0)
      {
        n++;
        visit (w, tid, data);
      }
    }
  }
  mt_close_fd (fd);
  return n;
}


/* 1 when the process runs under a seccomp filter (/proc/self/status "Seccomp:\t2"): such a
 * filter may trap a clone that makes no thread, which would kill the process with SIGSYS. */
gint
mt_world_seccomp (guint64 tgid)
{
  gchar path[64];
  gchar buf[4096];
  const gchar * key = "\nSeccomp:";
  gssize got, i;
  gint fd;
  mt_world_proc_path (path, tgid, "status");
  fd = mt_open (path, 0);
  if (fd < 0)
    return 0;
  got = mt_read (fd, buf, sizeof (buf) - 1);
  mt_close_fd (fd);
  if (got <= 0)
    return 0;
  buf[got] = 0;
  for (i = 0; i < got; i++)
  {
    gint k = 0;
    while (key[k] != 0 && buf[i + k] == key[k])
      k++;
    if (key[k] == 0)
    {
      const gchar * v = buf + i + k;
      while (*v == ' ' || *v == '\t')
        v++;
      return *v == '2' ? 1 : 0;
    }
  }
  return 0;
}

/* Whether thread tid of tgid is a zombie (or dead): /proc/<tgid>/task/<tid>/stat's state, the field
 * after the name's last ')'.  A main thread that called pthread_exit stays a zombie while the
 * others run: it cannot be seized (and runs nothing), yet tgkill (0) reaches it -- counted as a
 * thread that would not stop, it made every stop of such a process unclear. */
static gboolean
mt_world_task_dead (guint64 tgid, guint64 tid)
{
  gchar path[64], leaf[40], buf[512];
  const gchar * part = "task/";
  gssize got, i, close_paren = -1;
  gint fd, k = 0;
  while (*part)
    leaf[k++] = *part++;
  k += mt_world_put_u64 (leaf + k, tid);
  part = "/stat";
  while (*part)
    leaf[k++] = *part++;
  leaf[k] = 0;
  mt_world_proc_path (path, tgid, leaf);     /* "/proc/<tgid>/task/<tid>/stat": 56 bytes at most */
  fd = mt_open (path, 0);
  if (fd < 0)
    return FALSE;
  got = mt_read (fd, buf, sizeof (buf) - 1);
  mt_close_fd (fd);
  if (got <= 0)
    return FALSE;
  for (i = 0; i < got; i++)
  {
    if (buf[i] == ')')
      close_paren = i;
  }
  if (close_paren < 0 || close_paren + 2 >= got)
    return FALSE;
  return buf[close_paren + 2] == 'Z' || buf[close_paren + 2] == 'X';
}

/* A thread that could not be stopped: most often ESRCH, the thread ended between the listing and
 * the attach, and is no concern.  One still there runs on while the world is "stopped": counted,
 * and a patch waits for a stop with none (mt_world_stop_clear). */
static void
mt_world_not_stopped (MtWorld * w, guint64 tid)
{
  if (syscall (MT_SYS_TGKILL, (glong) w->tgid, (glong) tid, 0L) == 0 && !mt_world_task_dead (w->tgid, tid))
  {
    w->n_failed++;
    if (w->error == 0)
      w->error = MT_WORLD_E_ATTACH;
  }
}

/* One thread of the pass: seized and interrupted, unless it is skipped or held already.  Its stop
 * is waited for with the whole pass's (mt_world_wait_pass), not before the next thread is asked:
 * a thread stops only once the scheduler runs it, and with 64 threads spinning on two CPUs each
 * one waited for in turn took a scheduling round, so a stop took seconds (the busy target's
 * 1 s window took 9 s to put the hooks in and 18 s to take them out).  The pass's seized
 * threads wait in w->threads past n_threads (`data`: how many), their `sp` a count of the signals
 * handed back to them meanwhile. */
static void
mt_world_seize_one (MtWorld * w, guint64 tid, gpointer data)
{
  guint64 * pending = data, i;
  MtWorldThread * t = (MtWorldThread *) w->threads;
  if (mt_world_is_skipped (w, tid) || mt_world_is_held (w, tid))
    return;
  for (i = 0; i != *pending; i++)
  {
    if (t[w->n_threads + i].tid == tid)
      return;                                     /* listed twice in one pass */
  }
  /* A stopper that gave up is not kept waiting for the rest of a pass. */
  if (g_atomic_int_add ((volatile gint *) &w->abandoned, 0) != 0)
    return;
  if (w->n_threads + *pending == w->threads_cap)
  {
    w->n_failed++;
    return;
  }
  if (mt_ptrace (MT_PTRACE_SEIZE, (gint) tid, NULL, NULL) != 0)
  {
    mt_world_not_stopped (w, tid);
    return;
  }
  if (mt_ptrace (MT_PTRACE_INTERRUPT, (gint) tid, NULL, NULL) != 0)
  {
    mt_world_not_stopped (w, tid);                /* gone meanwhile */
    return;
  }
  t += w->n_threads + *pending;
  t->tid = tid;
  t->sp = 0;
  (*pending)++;
}

/* Pending thread i (an index into w->threads) leaves the pass's wait: the last pending one takes
 * its place. */
static void
mt_world_drop_pending (MtWorld * w, guint64 i, guint64 * pending)
{
  MtWorldThread * t = (MtWorldThread *) w->threads;
  guint64 last = w->n_threads + *pending - 1;
  t[i] = t[last];
  (*pending)--;
}

/* Waits for the pass's seized threads to stop, all at once: each that stops for our interrupt is
 * moved to w->threads[n_threads], its registers read, n_threads counted on.  A signal that arrives
 * first is handed back to its thread (PTRACE_CONT with it; the interrupt stays pending) and the
 * wait goes on, as LeakSanitizer does (64 at most a thread).  The pass gives up on the threads
 * still running once none has stopped for MT_WORLD_ATTACH_LIMIT_US: they stay seized, harmlessly,
 * until the helper ends, when the kernel lets go of every tracee the helper still has (and of
 * the interrupt it has not taken).  Returns how many stopped. */
static guint64
mt_world_wait_pass (MtWorld * w, guint64 pending)
{
  MtWorldThread * t = (MtWorldThread *) w->threads;
  guint64 added = 0, i, deadline = mt_world_now_us () + MT_WORLD_ATTACH_LIMIT_US;
  while (pending != 0 && g_atomic_int_add ((volatile gint *) &w->abandoned, 0) == 0)
  {
    gboolean progress = FALSE;
    i = w->n_threads;
    while (i < w->n_threads + pending)
    {
      gint status = 0, got;
      guint64 tid = t[i].tid;
      got = mt_waitpid ((gint) tid, &status, MT_WALL | MT_WNOHANG);
      if (got == 0)
      {
        i++;
        continue;
      }
      if (got == (gint) tid && (status & 0xff) == 0x7f && (status >> 16) == MT_PTRACE_EVENT_STOP)
      {
        /* Our interrupt's stop (or a group stop): held.  To the front of the pending ones, then
         * counted (the one that was at the front, already looked at this round, takes slot i). */
        guint64 * regs = (guint64 *) w->regs + w->n_threads * MT_WORLD_REGS;
        guint64 iov[2];
        MtWorldThread held = t[i];
        guint r;
        t[i] = t[w->n_threads];
        t[w->n_threads] = held;
        for (r = 0; r != MT_WORLD_REGS; r++)
          regs[r] = 0;
        iov[0] = (guint64) regs;
        iov[1] = MT_WORLD_REGS * 8;
        t[w->n_threads].sp = 0;
        if (mt_ptrace (MT_PTRACE_GETREGSET, (gint) tid, (gpointer) MT_NT_PRSTATUS, iov) == 0)
          t[w->n_threads].sp = regs[MT_WORLD_SP];
        w->n_threads++;
        pending--;
        added++;
        progress = TRUE;      /* (only a thread held: a thread's signals must not keep the others waiting) */
        i++;
        continue;
      }
      if (got == (gint) tid && (status & 0xff) == 0x7f && ++t[i].sp != 64)
      {
        mt_ptrace (MT_PTRACE_CONT, (gint) tid, NULL, (gpointer) (gsize) ((status >> 8) & 0xff));
        /* Again: a signal stop that began before the interrupt arrived may have taken it. */
        mt_ptrace (MT_PTRACE_INTERRUPT, (gint) tid, NULL, NULL);
        i++;
        continue;
      }
      /* Exited meanwhile, or a 64th signal before our stop: let go (with that signal), not held. */
      if (got == (gint) tid && (status & 0xff) == 0x7f)
        mt_ptrace (MT_PTRACE_DETACH, (gint) tid, NULL, (gpointer) (gsize) ((status >> 8) & 0xff));
      mt_world_drop_pending (w, i, &pending);
      mt_world_not_stopped (w, tid);
    }
    if (pending == 0)
      break;
    if (progress)
      deadline = mt_world_now_us () + MT_WORLD_ATTACH_LIMIT_US;
    else if (mt_world_now_us () > deadline)
      break;
    mt_world_sleep_us (MT_WORLD_WAIT_US);
  }
  /* Given up (or the stopper gave up): still seized, not held. */
  for (i = 0; i != pending; i++)
    mt_world_not_stopped (w, t[w->n_threads + i].tid);
  return added;
}

/* The helper process: runs on its own small stack, shares our memory, never allocates. */
static gint
mt_world_tracer (gpointer data)
{
  MtWorld * w = data;
  guint64 i, deadline;
  gint pass;

  /* Dies with the thread that made it: a target killed meanwhile leaves nothing behind.  The
   * signal is only armed from here on, so a target already gone is seen by its pid: a helper
   * made by a process killed at that instant (a run given up on, under load) was seen holding
   * on, orphaned, to its 600 s hold limit.  The same look each turn of the waits below. */
  mt_world_block_signals ();
  mt_prctl (MT_PR_SET_PDEATHSIG, MT_SIGKILL, 0, 0, 0);
  if (mt_getppid () != w->tgid)
    return 0;
  deadline = mt_world_now_us () + mt_world_timeout_us (w);
  while (mt_world_state (w) != MT_WORLD_STOPPING)
  {
    if (mt_getppid () != w->tgid)
      return 0;
    mt_world_sleep_us (MT_WORLD_WAIT_US);
    if (mt_world_now_us () > deadline)
      return 0;
  }
  /* Threads started while we attach are caught by the next pass; stop when a pass finds none. */
  for (pass = 0; pass != 16 && g_atomic_int_add ((volatile gint *) &w->abandoned, 0) == 0; pass++)
  {
    guint64 pending = 0;
    mt_world_each_task (w->tgid, mt_world_seize_one, w, &pending);
    if (mt_world_wait_pass (w, pending) == 0)
      break;
  }
  /* STOPPED is a plain store: it can overwrite the RESUME of a stopper that timed out meanwhile,
   * which then never says RESUME again -- the world was held stopped until the hold limit, 600 s
   * (the threads storm's hang).  So such a stopper also sets `abandoned` (before its RESUME), read
   * here after our store: whichever order the two stores took, one of the checks sees it. */
  mt_world_barrier (w);
  w->state = MT_WORLD_STOPPED;
  mt_world_barrier (w);
  deadline = mt_world_now_us () + MT_WORLD_HOLD_LIMIT_US;
  while (mt_world_state (w) != MT_WORLD_RESUME && g_atomic_int_add ((volatile gint *) &w->abandoned, 0) == 0
         && mt_getppid () == w->tgid)
  {
    mt_world_sleep_us (MT_WORLD_WAIT_US);
    /* The stopper is bounded in time; one that never says resume is gone: let go. */
    if (mt_world_now_us () > deadline)
      break;
  }
  for (i = 0; i != w->n_threads; i++)
    mt_ptrace (MT_PTRACE_DETACH, (gint) ((MtWorldThread *) w->threads)[i].tid, NULL, NULL);
  mt_world_barrier (w);
  w->state = MT_WORLD_RESUMED;
  return 0;
}

static gboolean
mt_world_wait_state (MtWorld * w, guint64 want)
{
  guint64 deadline = mt_world_now_us () + mt_world_timeout_us (w);
  while (mt_world_state (w) != want)
  {
    mt_world_sleep_us (MT_WORLD_WAIT_US);
    if (mt_world_now_us () > deadline)
      return FALSE;
  }
  return TRUE;
}

#ifdef MT_WORLD_SIGSTOP
/*
 * The world stopped with a signal, for a process under a seccomp filter (process CModule only:
 * MT_WORLD_SIGSTOP, x86-64).  The ptrace helper is a clone that makes no thread, which a filter
 * may trap (SIGSYS kills the process), so it is never made there -- and the hooks went in with the
 * world running: 1 sandboxed run in 10 crashed in malloc 0.94 s later (issue 27's audit).  Instead
 * each thread to stop is sent a real-time signal (tgkill, as pthread_kill does: what a filter that
 * lets the program use threads allows) whose handler (installed once: mt_sigstop_install) records
 * the registers it interrupted -- the thread's pc, its sp -- in its slot and waits on a futex
 * until the stopper lets go.  Everything else (clear of the ranges, no thread in Frida's code, the
 * writes) is the ptrace stop's, over the same slots.  Unlike a ptrace stop a signal is seen by the
 * thread: a system call without SA_RESTART semantics (epoll_wait, nanosleep's remainder, select)
 * may return EINTR -- said in the docs; the handler runs on the thread's alternate stack if it has
 * one.  A thread that blocks the signal never arrives: counted as not stopped (n_failed), so the
 * patch waits for a stop with none, as with a thread ptrace cannot attach.  Async-signal-safe: the
 * handler makes system calls and atomic operations only.
 */
typedef struct
{
  volatile gint phase;          /* MT_SIGSTOP_IDLE, _STOPPING (handlers hold), _RELEASING */
  volatile gint gen;            /* the futex the handlers wait on: bumped to let them go */
  volatile gint inside;         /* threads inside the handler */
  gint sig;                     /* the signal (0: not installed) */
  MtWorld * w;                  /* the stop the handlers record into */
  guint64 previous[19];         /* the signal's disposition before ours (struct sigaction) */
} MtSigStop;

extern MtSigStop mt_sigstop;
extern gint sigaction (gint sig, gconstpointer act, gpointer old);

#define MT_SIGSTOP_IDLE 0
#define MT_SIGSTOP_STOPPING 1
#define MT_SIGSTOP_RELEASING 2
#define MT_SYS_FUTEX 202
#define MT_SYS_GETTID 186
#define MT_FUTEX_WAIT_PRIVATE 128
#define MT_FUTEX_WAKE_PRIVATE 129
#define MT_SA_SIGINFO 4
#define MT_SA_ONSTACK 0x08000000
#define MT_SA_RESTART 0x10000000
#define MT_SIGSTOP_WAIT_US 100
#define MT_SIGSTOP_LEAVE_US 1000000ULL     /* resume waits this long at most for handlers to return */
#define MT_SIGSTOP_ARRIVE_US 1000000ULL    /* a stop waits this long at most for every thread to come */
#define MT_UC_GREGS 40                     /* ucontext_t: uc_flags, uc_link, uc_stack (24), then gregs */

/* glibc's struct sigaction (x86-64): handler, a 1024-bit mask, flags, restorer. */
typedef struct
{
  gpointer handler;
  guint64 mask[16];
  gint flags;
  gint pad;
  gpointer restorer;
} MtSigaction;

guint64
mt_sigstop_size (void)
{
  return sizeof (MtSigStop);
}

static void
mt_sigstop_handler (gint sig, gpointer info, gpointer uctx)
{
  MtSigStop * s = &mt_sigstop;
  MtWorld * w;
  gint gen;
  guint64 tid, i;
  (void) sig;
  (void) info;
  g_atomic_int_add (&s->inside, 1);
  gen = g_atomic_int_add (&s->gen, 0);
  w = s->w;
  if (g_atomic_int_add (&s->phase, 0) == MT_SIGSTOP_STOPPING && w != NULL)
  {
    tid = (guint64) syscall (MT_SYS_GETTID);
    for (i = 0; i != w->n_threads; i++)
    {
      MtWorldThread * t = (MtWorldThread *) w->threads + i;
      const guint64 * g = (const guint64 *) ((guint8 *) uctx + MT_UC_GREGS);
      guint64 * regs;
      guint64 deadline;
      if (t->tid != tid || t->sp != 0)
        continue;
      /* gregs (REG_R8 .. REG_CR2) into struct user_regs_struct's order, as the ptrace stop keeps them. */
      regs = (guint64 *) w->regs + i * MT_WORLD_REGS;
      regs[0] = g[7];  regs[1] = g[6];  regs[2] = g[5];  regs[3] = g[4];       /* r15 r14 r13 r12 */
      regs[4] = g[10]; regs[5] = g[11]; regs[6] = g[3];  regs[7] = g[2];       /* rbp rbx r11 r10 */
      regs[8] = g[1];  regs[9] = g[0];  regs[10] = g[13]; regs[11] = g[14];    /* r9 r8 rax rcx */
      regs[12] = g[12]; regs[13] = g[9]; regs[14] = g[8];                       /* rdx rsi rdi */
      regs[MT_WORLD_PC] = g[16];
      regs[18] = g[17];                                                         /* eflags */
      regs[MT_WORLD_SP] = g[15];
      g_atomic_int_add (&s->inside, 0);                                         /* the regs before sp */
      t->sp = g[15] != 0 ? g[15] : 8;                                           /* arrived */
      deadline = mt_world_now_us () + MT_WORLD_HOLD_LIMIT_US;
      while (g_atomic_int_add (&s->gen, 0) == gen && mt_world_now_us () < deadline)
      {
        glong ts[2];
        ts[0] = 0;
        ts[1] = 10 * 1000 * 1000;            /* 10 ms: a missed wake costs no more */
        syscall (MT_SYS_FUTEX, (glong) (gsize) &s->gen, (glong) MT_FUTEX_WAIT_PRIVATE, (glong) gen,
            (glong) (gsize) ts, 0L, 0L);
      }
      break;
    }
  }
  g_atomic_int_add (&s->inside, -1);
}

/* Installs the handler on a real-time signal no one uses (SIGRTMAX down to SIGRTMIN + 8: glibc
 * keeps the first ones); returns it, or 0.  Called once, when the process is under seccomp. */
gint
mt_sigstop_install (void)
{
  MtSigStop * s = &mt_sigstop;
  MtSigaction act, old;
  gint sig, k;
  if (s->sig != 0)
    return s->sig;
  for (sig = 64; sig >= 42; sig--)
  {
    if (sigaction (sig, NULL, &old) != 0 || old.handler != NULL || (old.flags & MT_SA_SIGINFO) != 0)
      continue;                              /* someone's handler, or SIG_IGN (1): not ours to take */
    for (k = 0; k != 16; k++)
      act.mask[k] = ~(guint64) 0;            /* nothing else runs on the thread while it waits */
    act.handler = (gpointer) mt_sigstop_handler;
    act.flags = MT_SA_SIGINFO | MT_SA_ONSTACK | MT_SA_RESTART;
    act.pad = 0;
    act.restorer = NULL;
    if (sigaction (sig, &act, NULL) != 0)
      continue;
    for (k = 0; k != 19; k++)
      s->previous[k] = ((guint64 *) &old)[k];
    s->sig = sig;
    return sig;
  }
  return 0;
}

/* Before the module is freed: the signal ignored (which discards one still pending at a thread
 * that blocks it), every thread out of the handler, the old disposition back.  1 when none stayed. */
gint
mt_sigstop_uninstall (void)
{
  MtSigStop * s = &mt_sigstop;
  MtSigaction ign;
  guint64 deadline;
  gint k;
  if (s->sig == 0)
    return 1;
  ign.handler = (gpointer) 1;               /* SIG_IGN */
  for (k = 0; k != 16; k++)
    ign.mask[k] = 0;
  ign.flags = 0;
  ign.pad = 0;
  ign.restorer = NULL;
  sigaction (s->sig, &ign, NULL);
  deadline = mt_world_now_us () + MT_SIGSTOP_LEAVE_US;
  while (g_atomic_int_add (&s->inside, 0) != 0 && mt_world_now_us () < deadline)
    mt_world_sleep_us (MT_SIGSTOP_WAIT_US);
  sigaction (s->sig, s->previous, NULL);
  s->sig = 0;
  return g_atomic_int_add (&s->inside, 0) == 0;
}

/* One thread of the pass: a slot, then the signal (a thread gone meanwhile gives its slot back). */
static void
mt_sigstop_signal_one (MtWorld * w, guint64 tid, gpointer data)
{
  guint64 * added = data;
  MtWorldThread * t;
  guint64 * regs;
  guint r;
  if (mt_world_is_skipped (w, tid) || mt_world_is_held (w, tid))
    return;
  if (w->n_threads == w->threads_cap)
  {
    w->n_failed++;
    return;
  }
  t = (MtWorldThread *) w->threads + w->n_threads;
  regs = (guint64 *) w->regs + w->n_threads * MT_WORLD_REGS;
  for (r = 0; r != MT_WORLD_REGS; r++)
    regs[r] = 0;
  t->tid = tid;
  t->sp = 0;
  mt_world_barrier (w);
  w->n_threads++;                            /* the slot is visible before the signal is sent */
  mt_world_barrier (w);
  if (syscall (MT_SYS_TGKILL, (glong) w->tgid, (glong) tid, (glong) mt_sigstop.sig) != 0)
  {
    w->n_threads--;                          /* gone (ESRCH), or refused: no signal, no one in it */
    if (syscall (MT_SYS_TGKILL, (glong) w->tgid, (glong) tid, 0L) == 0)
    {
      w->n_failed++;
      if (w->error == 0)
        w->error = MT_WORLD_E_ATTACH;
    }
    return;
  }
  (*added)++;
}

static guint64
mt_sigstop_waiting (MtWorld * w)
{
  guint64 i, n = 0;
  mt_world_barrier (w);
  for (i = 0; i != w->n_threads; i++)
  {
    if (((volatile MtWorldThread *) w->threads)[i].sp == 0)
      n++;
  }
  return n;
}

static void mt_sigstop_resume (MtWorld * w);

static gint
mt_sigstop_stop (MtWorld * w)
{
  MtSigStop * s = &mt_sigstop;
  guint64 deadline, timeout = mt_world_timeout_us (w);
  gint pass;
  w->state = MT_WORLD_IDLE;
  w->n_threads = 0;
  w->n_failed = 0;
  w->error = 0;
  w->abandoned = 0;
  s->w = w;
  mt_world_barrier (w);
  s->phase = MT_SIGSTOP_STOPPING;
  mt_world_barrier (w);
  /* Bounded per stop, not only by the caller's budget: a thread that blocks the signal never
   * comes, and the patch's stop is tried again and again. */
  deadline = mt_world_now_us () + MIN (timeout, MT_SIGSTOP_ARRIVE_US);
  /* Threads started while we signal are caught by the next pass; stop when a pass finds none. */
  for (pass = 0; pass != 16; pass++)
  {
    guint64 added = 0;
    mt_world_each_task (w->tgid, mt_sigstop_signal_one, w, &added);
    while (mt_sigstop_waiting (w) != 0 && mt_world_now_us () < deadline)
      mt_world_sleep_us (MT_SIGSTOP_WAIT_US);
    if (added == 0 || mt_sigstop_waiting (w) != 0)
      break;
  }
  if (mt_sigstop_waiting (w) != 0)
  {
    /* One never came (the signal blocked, a long uninterruptible sleep): the stop failed, as a
     * ptrace helper's that timed out.  Its slot is emptied first, so that its late arrival finds
     * nothing to wait for; the others are let go. */
    guint64 i;
    for (i = 0; i != w->n_threads; i++)
    {
      MtWorldThread * t = (MtWorldThread *) w->threads + i;
      if (t->sp == 0)
        t->tid = 0;
    }
    mt_sigstop_resume (w);
    w->n_threads = 0;
    w->state = MT_WORLD_FAILED;
    w->error = MT_WORLD_E_TIMEOUT;
    return 0;
  }
  mt_world_barrier (w);
  w->state = MT_WORLD_STOPPED;
  return 1;
}

static void
mt_sigstop_resume (MtWorld * w)
{
  MtSigStop * s = &mt_sigstop;
  guint64 deadline;
  mt_world_barrier (w);
  s->phase = MT_SIGSTOP_RELEASING;
  mt_world_barrier (w);
  g_atomic_int_add (&s->gen, 1);
  syscall (MT_SYS_FUTEX, (glong) (gsize) &s->gen, (glong) MT_FUTEX_WAKE_PRIVATE, 0x7fffffffL, 0L, 0L, 0L);
  /* Every held thread back out of the handler before anything else runs (a patch's caller may
   * free code; the next stop reuses the slots). */
  deadline = mt_world_now_us () + MT_SIGSTOP_LEAVE_US;
  while (g_atomic_int_add (&s->inside, 0) != 0 && mt_world_now_us () < deadline)
    mt_world_sleep_us (MT_SIGSTOP_WAIT_US);
  s->w = NULL;
  w->state = MT_WORLD_RESUMED;
}

static gboolean
mt_sigstop_on (MtWorld * w)
{
  return mt_sigstop.sig != 0 && mt_world_seccomp (w->tgid);
}
#endif

/* Stops every thread but the caller and w->skip; 1 when the world is stopped (n_failed says how
 * many threads could not be), 0 when it could not be stopped at all (error says why). */
gint
mt_world_stop (MtWorld * w)
{
  gint pid;
  gpointer top = (gpointer) ((w->tracer_stack + w->tracer_stack_size) & ~(guint64) 15);
#ifdef MT_WORLD_SIGSTOP
  if (mt_sigstop_on (w))
    return mt_sigstop_stop (w);
#endif
  if (w->tracer_pid != 0)
  {
    /* A helper that timed out earlier still uses this MtWorld and its stack: never a second one
     * beside it (nor a kill: it may be in the middle of giving a tracee back its signal). */
    gint status = 0;
    if (mt_waitpid ((gint) w->tracer_pid, &status, MT_WCLONE | MT_WNOHANG) != (gint) w->tracer_pid)
    {
      w->error = MT_WORLD_E_TIMEOUT;
      return 0;
    }
    w->tracer_pid = 0;
  }
  w->state = MT_WORLD_IDLE;
  w->n_threads = 0;
  w->n_failed = 0;
  w->error = 0;
  w->abandoned = 0;
  mt_world_barrier (w);
  if (mt_world_seccomp (w->tgid))
  {
    w->state = MT_WORLD_FAILED;
    w->error = MT_WORLD_E_SECCOMP;
    return 0;
  }
  pid = clone (mt_world_tracer, top, MT_CLONE_VM | MT_CLONE_FS | MT_CLONE_FILES | MT_CLONE_UNTRACED, w);
  if (pid <= 0)
  {
    w->state = MT_WORLD_FAILED;
    w->error = MT_WORLD_E_CLONE;
    return 0;
  }
  w->tracer_pid = (guint64) pid;
  /* Yama (ptrace_scope 1) lets only an ancestor trace us unless we name the tracer. */
  mt_prctl (MT_PR_SET_PTRACER, pid, 0, 0, 0);
  mt_world_barrier (w);
  w->state = MT_WORLD_STOPPING;
  if (!mt_world_wait_state (w, MT_WORLD_STOPPED))
  {
    /* The helper is slow (a loaded machine) or stuck (a thread that does not stop): it must be
     * gone before this MtWorld and its stack are used again.  Told to let go, it detaches what it
     * holds once it gets there; until it is reaped (here or by the next stop) no other starts. */
    gint status = 0;
    mt_world_barrier (w);
    w->abandoned = 1;
    mt_world_barrier (w);
    w->state = MT_WORLD_RESUME;
    mt_world_barrier (w);
    if (mt_world_wait_state (w, MT_WORLD_RESUMED))
    {
      mt_waitpid (pid, &status, MT_WCLONE);
      w->tracer_pid = 0;
    }
    w->n_threads = 0;
    w->error = MT_WORLD_E_TIMEOUT;
    return 0;
  }
  return 1;
}

void
mt_world_resume (MtWorld * w)
{
  gint status = 0;
#ifdef MT_WORLD_SIGSTOP
  if (mt_sigstop.w == w)
  {
    mt_sigstop_resume (w);
    return;
  }
#endif
  if (w->tracer_pid == 0)
    return;
  mt_world_barrier (w);
  w->state = MT_WORLD_RESUME;
  mt_world_barrier (w);
  /* A helper stuck past the timeout is left to finish (the next stop reaps it), never waited on. */
  if (!mt_world_wait_state (w, MT_WORLD_RESUMED))
    return;
  mt_waitpid ((gint) w->tracer_pid, &status, MT_WCLONE);
  w->tracer_pid = 0;
}

/* Linux: up to `len` bytes of this process's memory at `addr` into buf, without faulting: how many
 * were read (the end of a mapping stops it), -1 when none. */
static gssize
mt_world_read (MtWorld * w, guint64 addr, guint8 * buf, guint64 len)
{
  guint64 local[2], remote[2];
  local[0] = (guint64) buf;
  local[1] = len;
  remote[0] = addr;
  remote[1] = len;
  return process_vm_readv ((gint) w->tgid, local, 1, remote, 1, 0);
}

#define mt_world_strip(v) (v)

/* Linux: a thread starts only from a running one, and every one but Frida's is held: none. */
guint64
mt_world_unheld (MtWorld * w)
{
  (void) w;
  return 0;
}

#else /* MT_DARWIN */

/*
 * ---- Darwin: the world stopped with Mach thread suspension -------------------------------------
 * DEVICE-UNVERIFIED.  Run here in two ways: compiled natively against the stand-in's Mach calls
 * (demo/darwin/mtmach.c; tests/programs/world_darwin), and end to end on Linux, where the agent
 * builds this file with MT_DARWIN over the stand-in library when the host asks for it
 * (MEMTRACE_WORLD_MACH: agents/runtime/process.js) and the storms run against it.
 *
 * Why it is needed (docs/domain/frida.md): on a jailbroken iPhone Frida writes a patch through a
 * writable alias of the code pages or by mapping a re-signed copy over them, and neither suspends
 * a thread; a thread inside the bytes meanwhile resumes in a half-written prologue.
 *
 *   - task_threads hands a send right to every thread of the task, as out-of-line memory the
 *     kernel maps (no malloc: this runs while threads that may hold the allocator's locks are
 *     suspended); every thread but the caller and w->skip (Frida's own: Frida's thread ids on
 *     Darwin are these port names, which Cloak.hasThread knows) is thread_suspend'ed -- which
 *     returns once the thread is off the CPU -- and its registers read (thread_get_state);
 *     threads started meanwhile are caught by another pass, up to 16.  The rights of the held
 *     threads are kept until resume; every other is released at once.
 *   - A thread that ends between the listing and the suspend (KERN_TERMINATED, or a dead name) is
 *     no concern; one that cannot be suspended is counted (n_failed) and a patch waits for a stop
 *     with none, as on Linux.
 *   - arm64e signs pc, lr, sp and fp in the state thread_get_state returns, every return address a
 *     frame saved and any pointer a register holds signed: every register and stack word is
 *     stripped (mt_world_strip: iOS's 39-bit user address space) before it is compared with a
 *     range.
 *   - Memory is read with mach_vm_read_overwrite, which fails instead of faulting.
 *   - A gap Linux does not have: the kernel starts workqueue threads by itself (libdispatch), even
 *     with every thread of the app suspended.  mt_world_stop_checked lists the task once more
 *     before it says the world is clear and lets go (MT_WORLD_STOP_NEW: stopped again) if a
 *     thread is neither held nor Frida's; one started after that look, before the resume, runs
 *     on while the patch is written (the agent counts such threads after its flush:
 *     `started_during`).  Said in docs/domain/frida.md.
 *   - No helper holds the world on Darwin: a stopper that never resumes (its thread hung inside
 *     the flush) leaves the app's threads suspended; on Linux the helper lets go after
 *     MT_WORLD_HOLD_LIMIT_US.  Every wait of world.c's own is bounded on both.
 */
typedef guint32 mt_port_t;
extern mt_port_t mach_task_self_;
extern gint task_threads (mt_port_t task, mt_port_t ** list, guint32 * count);
extern gint thread_suspend (mt_port_t thread);
extern gint thread_resume (mt_port_t thread);
extern gint thread_get_state (mt_port_t thread, gint flavor, guint32 * state, guint32 * count);
extern gint mach_port_deallocate (mt_port_t task, mt_port_t name);
extern gint mach_vm_deallocate (mt_port_t task, guint64 address, guint64 size);
extern gint mach_vm_read_overwrite (mt_port_t task, guint64 address, guint64 size, guint64 data,
    guint64 * out_size);
extern gint mach_vm_region_recurse (mt_port_t task, guint64 * address, guint64 * size, guint32 * depth,
    gint32 * info, guint32 * count);
extern gint mach_vm_remap (mt_port_t target, guint64 * address, guint64 size, guint64 mask, gint flags,
    mt_port_t source_task, guint64 source, gint copy, gint * cur_protection, gint * max_protection, guint inheritance);
extern gint mach_vm_protect (mt_port_t task, guint64 address, guint64 size, gint set_maximum, gint protection);
extern guint64 mach_absolute_time (void);
extern gint mach_timebase_info (guint32 * info);       /* mach_timebase_info_data_t: numer, denom */
extern gint usleep (guint usec);
extern void gum_clear_cache (gpointer address, gsize size);

# ifdef MT_ARM64
#  define MT_THREAD_STATE_FLAVOR 6           /* ARM_THREAD_STATE64: x0..x28, fp, lr, sp, pc, cpsr */
#  define MT_THREAD_STATE_COUNT 68
#  define MT_WORLD_FP 29
#  define MT_WORLD_LR 30
#  define MT_WORLD_SP 31
#  define MT_WORLD_PC 32
/* arm64e's pointer authentication: the bits above the 39-bit user address space are a signature
 * (the leak scan's mask, agents/leaks.js PTR_MASK). */
#  define mt_world_strip(v) ((v) & 0x7fffffffffULL)
# else
#  define MT_THREAD_STATE_FLAVOR 4           /* x86_THREAD_STATE64: rax rbx rcx rdx rdi rsi rbp rsp r8..r15 rip */
#  define MT_THREAD_STATE_COUNT 42
#  define MT_WORLD_SP 7
#  define MT_WORLD_PC 16
#  define mt_world_strip(v) (v)
# endif
#define MT_KERN_TERMINATED 37
#define MT_MACH_SEND_INVALID_DEST 0x10000003
#define MT_SUBMAP_INFO_COUNT_64 19
#define MT_WORLD_READ_CHUNK 4096ULL
#define MT_VM_INHERIT_NONE 2
#define MT_VM_PROT_READ 1
#define MT_VM_PROT_WRITE 2

static void
mt_world_sleep_us (guint64 us)
{
  usleep ((guint) us);
}

/* The monotonic clock in microseconds: mach_absolute_time's ticks through the timebase (24 MHz
 * on Apple silicon: 125/3 ns a tick; 1/1 on Intel).  Every bound is a time, as on Linux. */
static guint64
mt_world_now_us (void)
{
  guint32 tb[2];
  guint64 t = mach_absolute_time ();
  tb[0] = 1;
  tb[1] = 1;
  if (mach_timebase_info (tb) != 0 || tb[0] == 0 || tb[1] == 0)
  {
    tb[0] = 1;
    tb[1] = 1;
  }
  return t / 1000 * tb[0] / tb[1] + (t % 1000) * tb[0] / tb[1] / 1000;
}

/* Calls visit(w, name) for every thread of the task (its port name: Frida's thread id on Darwin),
 * then releases every right task_threads gave (a live thread's name stays valid: libpthread holds
 * a right of its own).  Linux's signature (tgid unused).  Returns how many threads were listed. */
static guint64
mt_world_each_task (guint64 tgid, MtWorldVisit visit, MtWorld * w, gpointer data)
{
  mt_port_t * list = NULL;
  guint32 count = 0, i;
  (void) tgid;
  if (task_threads (mach_task_self_, &list, &count) != 0)
    return 0;
  for (i = 0; i != count; i++)
    visit (w, list[i], data);
  for (i = 0; i != count; i++)
    mach_port_deallocate (mach_task_self_, list[i]);
  mach_vm_deallocate (mach_task_self_, (guint64) list, (guint64) count * sizeof (mt_port_t));
  return count;
}

/* No seccomp on Darwin (the sandbox does not trap thread calls). */
gint
mt_world_seccomp (guint64 tgid)
{
  (void) tgid;
  return 0;
}

/* Suspends thread th and reads its registers into slot n_threads: MT_WORLD_HELD (its right kept),
 * MT_WORLD_HELD_BLIND (held, but its registers could not be read), MT_WORLD_NOT_HELD. */
#define MT_WORLD_NOT_HELD 0
#define MT_WORLD_HELD 1
#define MT_WORLD_HELD_BLIND 2
static gint
mt_world_suspend_one (MtWorld * w, mt_port_t th)
{
  MtWorldThread * t = (MtWorldThread *) w->threads + w->n_threads;
  guint64 * regs = (guint64 *) w->regs + w->n_threads * MT_WORLD_REGS;
  guint32 cnt = MT_THREAD_STATE_COUNT;
  guint r;
  gint kr = thread_suspend (th);
  if (kr != 0)
  {
    /* Ended between the listing and now: no concern.  Anything else runs on: counted. */
    if (kr != MT_KERN_TERMINATED && kr != MT_MACH_SEND_INVALID_DEST)
    {
      w->n_failed++;
      if (w->error == 0)
        w->error = MT_WORLD_E_ATTACH;
    }
    return MT_WORLD_NOT_HELD;
  }
  for (r = 0; r != MT_WORLD_REGS; r++)
    regs[r] = 0;
  t->tid = th;
  t->sp = 0;
  if (thread_get_state (th, MT_THREAD_STATE_FLAVOR, (guint32 *) regs, &cnt) == 0)
  {
#ifdef MT_ARM64
    regs[MT_WORLD_FP] = mt_world_strip (regs[MT_WORLD_FP]);
    regs[MT_WORLD_LR] = mt_world_strip (regs[MT_WORLD_LR]);
    regs[MT_WORLD_SP] = mt_world_strip (regs[MT_WORLD_SP]);
    regs[MT_WORLD_PC] = mt_world_strip (regs[MT_WORLD_PC]);
#endif
    t->sp = regs[MT_WORLD_SP];
    w->n_threads++;
    return MT_WORLD_HELD;
  }
  if (w->error == 0)
    w->error = MT_WORLD_E_ATTACH;
  w->n_threads++;
  return MT_WORLD_HELD_BLIND;
}

void mt_world_resume (MtWorld * w);

/* Stops every thread but the caller and w->skip; 1 when the world is stopped (n_failed says how
 * many threads could not be), 0 when it could not be stopped at all (error says why; nothing is
 * held then). */
gint
mt_world_stop (MtWorld * w)
{
  guint64 deadline = mt_world_now_us () + mt_world_timeout_us (w);
  guint64 blind = 0;
  gint pass;
  w->n_threads = 0;
  w->n_failed = 0;
  w->error = 0;
  w->abandoned = 0;
  w->state = MT_WORLD_STOPPING;
  for (pass = 0; pass != 16; pass++)
  {
    mt_port_t * list = NULL;
    guint32 count = 0, i, added = 0;
    /* The last pass's failures to suspend are the ones that stand (such a thread is tried again
     * in the next pass); a held thread whose registers could not be read stays counted (where it
     * is is unknown: pc 0 would read as outside every range), so a patch waits for a stop with
     * none. */
    w->n_failed = blind;
    if (task_threads (mach_task_self_, &list, &count) != 0)
    {
      if (pass == 0)
      {
        w->state = MT_WORLD_FAILED;
        w->error = MT_WORLD_E_ATTACH;
        return 0;
      }
      break;
    }
    for (i = 0; i != count; i++)
    {
      mt_port_t th = list[i];
      if (mt_world_is_skipped (w, th) || mt_world_is_held (w, th))
      {
        mach_port_deallocate (mach_task_self_, th);      /* a held thread's second right: one is kept */
        continue;
      }
      if (w->n_threads == w->threads_cap)
        w->n_failed++;
      else
      {
        gint got = mt_world_suspend_one (w, th);
        if (got != MT_WORLD_NOT_HELD)
        {
          blind += got == MT_WORLD_HELD_BLIND;
          w->n_failed += got == MT_WORLD_HELD_BLIND;
          added++;
          continue;
        }
      }
      mach_port_deallocate (mach_task_self_, th);
    }
    mach_vm_deallocate (mach_task_self_, (guint64) list, (guint64) count * sizeof (mt_port_t));
    if (added == 0)
      break;
    if (mt_world_now_us () > deadline)
    {
      w->state = MT_WORLD_STOPPED;
      mt_world_resume (w);
      w->n_threads = 0;
      w->state = MT_WORLD_FAILED;
      w->error = MT_WORLD_E_TIMEOUT;
      return 0;
    }
  }
  w->state = MT_WORLD_STOPPED;
  return 1;
}

/* How many threads of the task are neither held nor skipped now -- on Darwin the kernel starts
 * workqueue threads by itself (libdispatch) even with every thread of the app suspended, so a
 * stop can be joined after its last pass.  Every right released. */
static void
mt_world_count_unheld (MtWorld * w, guint64 tid, gpointer data)
{
  if (!mt_world_is_skipped (w, tid) && !mt_world_is_held (w, tid))
    (*(guint64 *) data)++;
}

guint64
mt_world_unheld (MtWorld * w)
{
  guint64 n = 0;
  mt_world_each_task (0, mt_world_count_unheld, w, &n);
  return n;
}

/* Lets every held thread go and releases its right.  The ids and registers stay in the buffers (a
 * look: the agent reads them after); a second resume does nothing. */
void
mt_world_resume (MtWorld * w)
{
  guint64 i;
  if (w->state != MT_WORLD_STOPPED)
    return;
  for (i = 0; i != w->n_threads; i++)
  {
    mt_port_t th = (mt_port_t) ((MtWorldThread *) w->threads)[i].tid;
    thread_resume (th);
    mach_port_deallocate (mach_task_self_, th);
  }
  w->state = MT_WORLD_RESUMED;
}

/* Up to `len` bytes at `addr` into buf, without faulting: how many were read (stopping at the
 * first page that cannot be: the end of a stack's mapping), -1 when none.  The whole length is
 * tried first; only a read that fails goes page by page. */
static gssize
mt_world_read (MtWorld * w, guint64 addr, guint8 * buf, guint64 len)
{
  guint64 done = 0, got = 0;
  (void) w;
  if (mach_vm_read_overwrite (mach_task_self_, addr, len, (guint64) buf, &got) == 0 && got == len)
    return (gssize) len;
  while (done < len)
  {
    guint64 at = addr + done;
    guint64 chunk = MIN (len - done, MT_WORLD_READ_CHUNK - (at & (MT_WORLD_READ_CHUNK - 1)));
    got = 0;
    if (mach_vm_read_overwrite (mach_task_self_, at, chunk, (guint64) (buf + done), &got) != 0 || got == 0)
      break;
    done += got;
    if (got < chunk)
      break;
  }
  return done == 0 ? -1 : (gssize) done;
}

/* Frida's own code on Darwin, where there is no /proc/self/maps and Frida cloaks its image from
 * Process's ranges: the VM region holding one of gum's functions (a CModule's gum symbols are the
 * agent's own), [start, end) into out.  1 when found.  DEVICE-UNVERIFIED: that the agent's __TEXT
 * is one region. */
gint
mt_world_frida_code (guint64 * out)
{
  guint64 want = (guint64) (gsize) gum_clear_cache;
  guint64 a = want, size = 0;
  guint32 depth = 0x7fffffff;
  gint32 info[32];
  guint32 count = MT_SUBMAP_INFO_COUNT_64;
  if (mach_vm_region_recurse (mach_task_self_, &a, &size, &depth, info, &count) != 0 || a > want ||
      a + size <= want)
    return 0;
  out[0] = a;
  out[1] = a + size;
  return 1;
}

#endif

typedef struct
{
  guint64 * out;
  guint64 cap;
  guint64 n;
} MtWorldList;

static void
mt_world_list_one (MtWorld * w, guint64 tid, gpointer data)
{
  MtWorldList * l = data;
  if (l->n < l->cap)
    l->out[l->n++] = tid;
}

/* The process's thread ids (Linux: task ids; Darwin: thread port names), at most cap of them (the
 * agent tells Frida's own apart); returns how many there are, which may be more than cap. */
guint64
mt_world_list_tasks (guint64 tgid, guint64 * out, guint64 cap)
{
  MtWorldList l;
  l.out = out;
  l.cap = cap;
  l.n = 0;
  return mt_world_each_task (tgid, mt_world_list_one, NULL, &l);
}

/* Stopped thread i's pc (0 when its registers could not be read). */
guint64
mt_world_pc (MtWorld * w, guint64 i)
{
  return ((guint64 *) w->regs)[i * MT_WORLD_REGS + MT_WORLD_PC];
}

static gboolean
mt_world_in (guint64 v, const guint64 * ranges, guint64 n_ranges)
{
  guint64 r;
  for (r = 0; r != n_ranges; r++)
  {
    if (v >= ranges[2 * r] && v < ranges[2 * r + 1])
      return TRUE;
  }
  return FALSE;
}

/* How many stopped threads have their pc inside one of ranges ([start, end) pairs). */
guint64
mt_world_inside (MtWorld * w, const guint64 * ranges, guint64 n_ranges)
{
  guint64 i, n = 0;
  for (i = 0; i != w->n_threads; i++)
  {
    if (mt_world_in (mt_world_pc (w, i), ranges, n_ranges))
      n++;
  }
  return n;
}

/*
 * Stops the world with no stopped thread's pc inside `ranges` (the bytes a patch rewrites) and no
 * live thread left running (one that could not be attached): otherwise it is let go and stopped again, at most `tries` times, `pause_us`
 * apart, which moves it on (no prologue loops).  1 when stopped and clear; 0 when the world could
 * not be stopped, or stayed unclear (then it is NOT stopped, error = MT_WORLD_E_INSIDE).
 */
gint
mt_world_stop_clear (MtWorld * w, const guint64 * ranges, guint64 n_ranges, guint64 tries, guint64 pause_us)
{
  guint64 t;
  for (t = 0; t < tries; t++)
  {
    if (!mt_world_stop (w))
      return 0;
    if (w->n_failed == 0 && mt_world_inside (w, ranges, n_ranges) == 0)
      return 1;
    mt_world_resume (w);
    mt_world_sleep_us ((guint) pause_us);
  }
  w->error = MT_WORLD_E_INSIDE;
  return 0;
}

/*
 * Whether the bytes before code address v end with a call: 1, 0, or -1 when they cannot be read
 * (or the architecture is not known here).  x86-64: E8 rel32, or FF /2 (an indirect call: ModRM
 * reg field 2) starting 2 to 9 bytes back, prefixes and all; arm64: BL, BLR and the
 * authenticating BLRA*.  Liberal: bytes that could end some call count.
 */
static gint
mt_world_call_before (MtWorld * w, guint64 v)
{
#if defined (__x86_64__) || defined (__aarch64__)
  guint8 b[16];
  guint k;
  if (v < sizeof (b) || mt_world_read (w, v - sizeof (b), b, sizeof (b)) != (gssize) sizeof (b))
    return -1;
# if defined (__x86_64__)
  if (b[16 - 5] == 0xe8)
    return 1;
  for (k = 2; k <= 9; k++)
  {
    if (b[16 - k] == 0xff && ((b[16 - k + 1] >> 3) & 7) == 2)
      return 1;
  }
  return 0;
# else
  {
    guint32 insn = (guint32) b[12] | ((guint32) b[13] << 8) | ((guint32) b[14] << 16) | ((guint32) b[15] << 24);
    if ((v & 3) != 0)
      return 0;                        /* no arm64 instruction starts there */
    (void) k;
    return (insn & 0xfc000000u) == 0x94000000u      /* BL */
        || (insn & 0xfefff000u) == 0xd63f0000u;     /* BLR, BLRAA(Z), BLRAB(Z) */
  }
# endif
#else
  (void) w;
  (void) v;
  return -1;
#endif
}

/* Whether code address v can be a return address: only a word that is no return address at all
 * is told apart -- one whose bytes cannot be read counts. */
static gboolean
mt_world_after_call (MtWorld * w, guint64 v)
{
  return mt_world_call_before (w, v) != 0;
}

/* mt_world_call_before for the agent's messages (world.js busyThread: a return address, or a
 * pointer to code?). */
gint64
mt_world_follows_call (MtWorld * w, guint64 v)
{
  return mt_world_call_before (w, v);
}

/* Whether v is the very start of one of ranges[open_from ...]: an entry only our own code calls (the
 * trampolines the malloc hooks call the real entries through), so a stack word holding it is no
 * reference of a thread not already inside that code -- and a page address a thread kept from
 * mmap, the page an Interceptor trampoline's since, often is (docs/hook-storm.md, round 25). */
static gboolean
mt_world_open_start (guint64 v, const guint64 * ranges, guint64 open_from, guint64 n_ranges)
{
  guint64 r;
  for (r = open_from; r < n_ranges; r++)
  {
    if (v == ranges[2 * r])
      return TRUE;
  }
  return FALSE;
}

/* Whether stopped thread i points into `ranges` (a register, or a stack word from sp up, at most
 * `depth` bytes), and how: *where the register index (< MT_WORLD_REGS) or MT_WORLD_REGS + the
 * stack word's byte offset from sp (+ MT_WORLD_WHERE_ABOVE_SIGNAL when a signal frame lies below
 * it), *value the value pointing in.
 *
 * `returns_only` (the strict stop's look for Frida's code: may this thread hold one of its
 * locks?): a stack word counts only when it can be a return address (mt_world_after_call), so long
 * as no signal frame lies below it -- a thread whose pc is elsewhere is inside that code only if it
 * called out of it, or was interrupted in it.  A word that follows no call is data: a function
 * pointer left in an unwritten slot of a live frame, which refused every patch of a session for
 * its 4 s (docs/hook-storm.md, "the stale word": a pointer to the start of one of the agent's
 * functions, 4.5 KB up a storm thread's stack).  A word into the signal-return code (w's
 * signal_returns: Linux x86-64's __restore_rt, arm64's __kernel_rt_sigreturn, Darwin's _sigtramp,
 * as the agent found them) is a handler's return address: a signal frame lies above it, whose
 * saved pc is wherever the thread was interrupted, after no call -- every word above counts.
 * Registers always count; with no signal-return code known, so does every word.  `open_from`: a
 * stack word at the very start of ranges[open_from ...] does not count (mt_world_open_start) --
 * below any signal frame only, and only where signal frames can be seen: a thread interrupted at a
 * trampoline's first instruction keeps that pc only in its signal frame, and resumes there; nor
 * does a register there other than the pc. */
static gboolean
mt_world_thread_ref (MtWorld * w, guint64 i, const guint64 * ranges, guint64 n_ranges, guint64 depth,
    guint8 * scratch, guint64 scratch_size, gboolean returns_only, guint64 open_from, guint64 * where,
    guint64 * value)
{
  const guint64 * regs = (const guint64 *) w->regs + i * MT_WORLD_REGS;
  guint64 sp = ((MtWorldThread *) w->threads)[i].sp & ~(guint64) 7;
  guint64 r, done = 0;
  const guint64 * sigret = (const guint64 *) w->signal_returns;
  guint64 n_sigret = sigret != NULL ? w->n_signal_returns : 0;
  /* Until a signal frame is seen (a register or word into the signal-return code): the call filter
   * (returns_only) and the open ranges' starts (open_from) apply. */
  gboolean below_signal = n_sigret != 0;
  gboolean filter = returns_only && below_signal;
  /* The main thread of a program at the hold point, waiting in the hold library: nothing of
   * Frida's or ours runs on it, and the words above its sp are ld.so's frames, which keep what
   * they kept -- one of them, a pointer into a mapping since freed, once lay where Frida's agent
   * was mapped later, and every stop at start was refused for 4 s (1 spawned cycle in 150). */
  if (w->hold_tid != 0 && ((MtWorldThread *) w->threads)[i].tid == w->hold_tid &&
      regs[MT_WORLD_PC] >= w->hold_code_lo && regs[MT_WORLD_PC] < w->hold_code_hi)
    return FALSE;
  for (r = 0; r != MT_WORLD_REGS; r++)
  {
    guint64 v = mt_world_strip (regs[r]);    /* arm64e: x16/x17 may hold signed ones */
    /* A register other than the pc at an open range's very start is the pointer our code last
     * called a trampoline through, left there: TinyCC's code calls through r11, which a thread
     * spinning in its own loop afterwards never writes again -- 62 of 64 spinning threads held it
     * through the whole 3 s wait, every uninstall (docs/hook-storm.md, round 26).  A thread that
     * will still call through it runs our code, and is counted by its pc or a return address; one
     * interrupted by a signal just after our code jumped through it (gcc's hooks tail-jump), by the
     * pc its signal frame saved -- where signal frames are seen: under a handler whose restorer
     * was not found, this register was the last evidence of such a thread (review, round 26). */
    if (mt_world_in (v, ranges, n_ranges) &&
        !(r != MT_WORLD_PC && mt_world_open_start (v, ranges, open_from, n_ranges)))
    {
      *where = r;
      *value = regs[r];
      return TRUE;
    }
    /* In the signal-return code (its pc, or arm64's link register in a handler's first
     * instructions): the interrupted context is on the stack, at no call. */
    if (below_signal && mt_world_in (v, sigret, n_sigret))
      below_signal = filter = FALSE;
  }
  while (sp != 0 && done < depth)
  {
    guint64 k;
    guint64 len = MIN (depth - done, scratch_size);
    gssize got = mt_world_read (w, sp + done, scratch, len);
    if (got <= 0)
      break;                           /* the end of the stack's mapping */
    for (k = 0; k + 8 <= (guint64) got; k += 8)
    {
      guint64 v = mt_world_strip (*(guint64 *) (scratch + k));    /* arm64e: a signed return address */
      if (below_signal && mt_world_in (v, sigret, n_sigret))
        below_signal = filter = FALSE;  /* a signal frame: every word above it counts */
      if (mt_world_in (v, ranges, n_ranges) &&
          !(below_signal && mt_world_open_start (v, ranges, open_from, n_ranges)) &&
          (!filter || mt_world_after_call (w, v)))
      {
        *where = MT_WORLD_REGS + done + k + (n_sigret != 0 && !below_signal ? MT_WORLD_WHERE_ABOVE_SIGNAL : 0);
        *value = v;
        return TRUE;
      }
    }
    done += (guint64) got;
    if ((guint64) got < len)
      break;
  }
  return FALSE;
}

/*
 * With the world stopped: how many stopped threads still run in `ranges` (code about to be
 * unloaded: memtrace's C module, Interceptor's trampolines) or will return into it -- a pc, a
 * register or a word of the stack from sp up (at most `depth` bytes) inside one.  Conservative:
 * a stale word on a live frame counts too (the caller then waits and asks again).  A stack that
 * cannot be read counts.  `returns_only`, `open_from`: see mt_world_thread_ref.
 */
static guint64
mt_world_count_refs (MtWorld * w, const guint64 * ranges, guint64 n_ranges, guint64 depth, guint8 * scratch,
    guint64 scratch_size, gboolean returns_only, guint64 open_from)
{
  guint64 i, n = 0, where, value;
  for (i = 0; i != w->n_threads; i++)
  {
    if (mt_world_thread_ref (w, i, ranges, n_ranges, depth, scratch, scratch_size, returns_only, open_from, &where,
        &value))
      n++;
  }
  return n;
}

/* mt_world_count_refs for code about to be freed: every word counts (a function pointer into it,
 * called later, is as deadly as a return address). */
guint64
mt_world_refs (MtWorld * w, const guint64 * ranges, guint64 n_ranges, guint64 depth, guint8 * scratch,
    guint64 scratch_size)
{
  return mt_world_count_refs (w, ranges, n_ranges, depth, scratch, scratch_size, FALSE, n_ranges);
}

/* mt_world_refs where ranges[open_from ...] are entries only our own code calls: a stack word at
 * one's very start does not count (mt_world_open_start); `returns_only`: code no program thread
 * calls through a pointer it keeps (process.c's, on Linux), where a stack word counts only as a
 * return address, as in the strict stop (mt_world_thread_ref). */
guint64
mt_world_refs_open (MtWorld * w, const guint64 * ranges, guint64 n_ranges, guint64 open_from, guint64 returns_only,
    guint64 depth, guint8 * scratch, guint64 scratch_size)
{
  return mt_world_count_refs (w, ranges, n_ranges, depth, scratch, scratch_size, returns_only != 0, open_from);
}

/*
 * Which held thread points into `ranges` first, and how -- for the refusal's message (a patch
 * refused because "a thread stayed in Frida's code" must say which thread and by what, or nobody
 * can tell Frida's bootstrap from a program thread parked in a listener).  out[0] tid, out[1]
 * where (mt_world_thread_ref), out[2] the value pointing in.  All 0 when none.
 */
static void
mt_world_first_ref (MtWorld * w, const guint64 * ranges, guint64 n_ranges, guint64 depth, guint8 * scratch,
    guint64 scratch_size, gboolean returns_only, guint64 open_from, guint64 * out)
{
  guint64 i;
  out[0] = out[1] = out[2] = 0;
  for (i = 0; i != w->n_threads; i++)
  {
    if (mt_world_thread_ref (w, i, ranges, n_ranges, depth, scratch, scratch_size, returns_only, open_from, &out[1],
        &out[2]))
    {
      out[0] = ((MtWorldThread *) w->threads)[i].tid;
      return;
    }
  }
}


/* mt_world_first_ref for the agent, with the world stopped: which held thread points into `ranges`
 * (a quiesce that does not end must say which thread, and by what register or stack word);
 * `open_from`, `returns_only` as mt_world_refs_open's. */
void
mt_world_first_ref_of (MtWorld * w, const guint64 * ranges, guint64 n_ranges, guint64 open_from,
    guint64 returns_only, guint64 depth, guint8 * scratch, guint64 scratch_size, guint64 * out)
{
  mt_world_first_ref (w, ranges, n_ranges, depth, scratch, scratch_size, returns_only != 0, open_from, out);
}


#ifdef MT_DARWIN
/*
 * Darwin's way to write code with the world stopped, touching nothing of Frida's (a stopped thread
 * may hold one of its locks): a writable alias of the pages (mach_vm_remap, not copied), the bytes
 * written through it, the alias dropped -- the code pages stay executable all along, as Frida's
 * own Darwin writer does where debugger mappings are enforced (docs/domain/frida.md, path 2).
 * Kernel calls only.  DEVICE-UNVERIFIED: whether the device allows it (where it does not, the
 * agent's restore counts as failed and Frida's own restore is what runs).  Run here against the
 * stand-in, whose mach_vm_remap aliases shared pages (Linux cannot alias private ones).
 */
static gint
mt_world_write_alias (guint8 * dst, const guint8 * src, guint64 len, guint64 start, guint64 end)
{
  guint64 alias = 0, k;
  gint cur = 0, max = 0;
  if (mach_vm_remap (mach_task_self_, &alias, end - start, 0, MT_VM_FLAGS_ANYWHERE, mach_task_self_, start, 0, &cur,
      &max, MT_VM_INHERIT_NONE) != 0)
    return 0;
  if ((max & MT_VM_PROT_WRITE) == 0 ||
      mach_vm_protect (mach_task_self_, alias, end - start, 0, MT_VM_PROT_READ | MT_VM_PROT_WRITE) != 0)
  {
    mach_vm_deallocate (mach_task_self_, alias, end - start);
    return 0;
  }
  for (k = 0; k != len; k++)
    ((volatile guint8 *) alias)[((guint64) dst - start) + k] = src[k];
  mach_vm_deallocate (mach_task_self_, alias, end - start);
  gum_clear_cache ((gpointer) start, end - start);
  return 1;
}
#endif

/*
 * Writes `len` bytes of code at `dst` (a hooked function's prologue, memtrace's own restore)
 * while the world is stopped, touching nothing of Frida's: a stopped thread may hold one of
 * Frida's locks (its heap's, a spinlock) and Memory.patchCode allocates from Frida's heap.
 * `mprotect_fn` is libc's mprotect, given by the agent (this file links in two CModules with
 * different symbols).  The pages go RWX, never non-executable, and back to RX.  Returns 1 when
 * written.
 */
typedef gint (* MtMprotectFunc) (gpointer address, gsize length, gint prot);
extern void gum_clear_cache (gpointer address, gsize size);

gint
mt_world_write (guint8 * dst, const guint8 * src, guint64 len, gpointer mprotect_fn, guint64 page_size)
{
  MtMprotectFunc protect = (MtMprotectFunc) mprotect_fn;
  guint64 start = (guint64) dst & ~(page_size - 1);
  guint64 end = ((guint64) dst + len + page_size - 1) & ~(page_size - 1);
  guint64 k;
#ifdef MT_DARWIN
  /* No mprotect given: a device (iOS refuses RWX pages): the writable alias.  Given: the Mach stop
   * run on Linux over the stand-in, where the code pages are Linux's and written as there. */
  if (mprotect_fn == NULL)
    return mt_world_write_alias (dst, src, len, start, end);
#endif
  if (protect ((gpointer) start, end - start, 1 | 2 | 4) != 0)
    return 0;
  for (k = 0; k != len; k++)
    ((volatile guint8 *) dst)[k] = src[k];
  protect ((gpointer) start, end - start, 1 | 4);
  gum_clear_cache ((gpointer) start, end - start);
  return 1;
}

/*
 * mt_world_stop_clear, and then, before anything else runs -- in C, so that nothing of Frida's
 * (a JavaScript value, an allocation from Frida's heap) is touched while a thread is held that may
 * own one of Frida's locks -- two checks, each of which lets the world go again when it fails:
 *   - `listed` (n_listed thread ids, 0 for none): every held thread was listed before the stop
 *     (one started since may be Frida's own, not yet known as cloaked): else MT_WORLD_STOP_NEW;
 *   - `frida` (n_frida [start, end) pairs of Frida's code, 0 for none): no held thread's pc,
 *     register or stack word (up to frida_depth bytes from sp) points into it: else
 *     MT_WORLD_STOP_BUSY, with how many in *n_busy.  The threads storm's hang: a thread stopped
 *     in Frida's allocator (its heap's spin lock held, in mmap, at thread start) while the agent's
 *     thread, with the world stopped, made a JavaScript value -- which allocates from that heap:
 *     it spun on the lock for good, the world held stopped, Frida's own threads spinning too.
 * `resume_now`: let go before returning even when clear (a look at the threads: their ids and
 * registers stay in the buffers).  MT_WORLD_STOP_CLEAR when stopped and clear (resume owed unless
 * resume_now), MT_WORLD_STOP_FAILED when the world could not be stopped clear of `ranges` (error
 * says why).
 */
#define MT_WORLD_STOP_FAILED 0
#define MT_WORLD_STOP_CLEAR 1
#define MT_WORLD_STOP_NEW 2
#define MT_WORLD_STOP_BUSY 3

gint
mt_world_stop_checked (MtWorld * w, const guint64 * ranges, guint64 n_ranges, guint64 tries, guint64 pause_us,
    const guint64 * listed, guint64 n_listed, const guint64 * frida, guint64 n_frida, guint64 frida_depth,
    guint8 * scratch, guint64 scratch_size, gint resume_now, guint64 * n_busy)
{
  guint64 i, k;
  if (n_busy != NULL)
    *n_busy = 0;
  if (!mt_world_stop_clear (w, ranges, n_ranges, tries, pause_us))
    return MT_WORLD_STOP_FAILED;
  if (n_listed != 0)
  {
    for (i = 0; i != w->n_threads; i++)
    {
      guint64 tid = ((MtWorldThread *) w->threads)[i].tid;
      for (k = 0; k != n_listed && listed[k] != tid; k++)
        ;
      if (k == n_listed)
      {
        mt_world_resume (w);
        return MT_WORLD_STOP_NEW;
      }
    }
  }
  /* Darwin: a thread the kernel started since the last pass (mt_world_unheld) runs on: let go
   * and stopped again, as one not listed is.  The window left is from here to the resume. */
  if (mt_world_unheld (w) != 0)
  {
    mt_world_resume (w);
    return MT_WORLD_STOP_NEW;
  }
  if (n_frida != 0)
  {
    guint64 busy = mt_world_count_refs (w, frida, n_frida, frida_depth, scratch, scratch_size, TRUE, n_frida);
    if (busy != 0)
    {
      if (n_busy != NULL)
      {
        *n_busy = busy;
        mt_world_first_ref (w, frida, n_frida, frida_depth, scratch, scratch_size, TRUE, n_frida, n_busy + 1);
      }
      mt_world_resume (w);
      return MT_WORLD_STOP_BUSY;
    }
  }
  if (resume_now)
    mt_world_resume (w);
  return MT_WORLD_STOP_CLEAR;
}

/*
 * Stops the world clear of `ranges` (by pc; Frida's code among them) with only `listed` threads
 * held, writes n_writes staged patches (triples: dst, src, len) with mt_world_write, and lets go
 * -- all in C, nothing of Frida's touched while stopped: a stop that cannot be strict (threads
 * waiting in a listener for the script's lock are inside Frida's code, and stay there until this
 * thread lets go of it) must run nothing that may want one of Frida's locks.  Returns how many
 * were written; -1 when the world could not be stopped (error says why), -2 when a thread not
 * listed was held (tried again by the caller).
 */
gint64
mt_world_write_stopped (MtWorld * w, const guint64 * ranges, guint64 n_ranges, guint64 tries, guint64 pause_us,
    const guint64 * listed, guint64 n_listed, const guint64 * writes, guint64 n_writes, gpointer mprotect_fn,
    guint64 page_size)
{
  guint64 i;
  gint64 written = 0;
  gint got = mt_world_stop_checked (w, ranges, n_ranges, tries, pause_us, listed, n_listed, NULL, 0, 0, NULL, 0, 0, NULL);
  if (got == MT_WORLD_STOP_FAILED)
    return -1;
  if (got != MT_WORLD_STOP_CLEAR)
    return -2;
  for (i = 0; i != n_writes; i++)
    written += mt_world_write ((guint8 *) writes[3 * i], (const guint8 *) writes[3 * i + 1], writes[3 * i + 2],
        mprotect_fn, page_size);
  mt_world_resume (w);
  return written;
}
