/*
 * memtrace's process lifecycle in the target: fork and exec.  Its own small CModule, compiled
 * by every tracer agent (agents/runtime/process.js), Linux only.
 *
 * fork: the agent lives on in the child as a copy nobody serves (Frida's threads, our flush
 * timer and the host connection are the parent's).  Hooks left in place there hang the child:
 * Frida's own exit()/_exit() listeners allocate from Frida's heap, whose lock may have been
 * held by one of the parent's Frida threads at the instant of the fork.  So the atfork child
 * handler puts back the original bytes of every libc function memtrace or Frida patched (taken
 * from libc's file by the agent, mt_patch_*) before the child runs a line of its own: an
 * unfollowed child runs natively.  It then posts its pid in a page shared with the parent
 * (MAP_SHARED, mt_forks), which the parent's agent reports to the host; when the host follows
 * children the child waits (at most mt_proc.wait_ms) for the host's new agent to release it,
 * so the child is traced from its first line.
 *
 * exec: execve is replaced.  In the traced process the agent is told first (it flushes and
 * tells the host, mt_on_exec); in a vfork or posix_spawn child, which shares our memory under
 * another pid, the exec is only posted in the shared page (it must never enter the agent).
 *
 * Every pointer the host gives the C library here is called through a stub in leaked memory
 * (process.js), so the atfork handler stays harmless after the agent is gone.
 */
#include <gum/gummemory.h>

#define MT_FORK_FREE 0
#define MT_FORK_WRITING 1
#define MT_FORK_POSTED 2
#define MT_FORK_TAKEN 3
#define MT_FORK_RELEASED 4

typedef struct _MtForkEntry MtForkEntry;
typedef struct _MtForkShared MtForkShared;

/* Written by a child, read by the parent's C (mt_fork_take): never by JavaScript or Python. */
struct _MtForkEntry
{
  volatile gint state;
  gint pid;
  gint ppid;
  gint origin;
  guint64 agent_memory;             /* the parent agent's MtAgentMemory, inherited (process.js) */
  gchar path[MT_FORK_PATH];
};

struct _MtForkShared
{
  volatile gint next;
  volatile gint lost;               /* entries overwritten before the parent read them */
  volatile gint fence;
  gint reserved;
  MtForkEntry e[MT_FORK_ENTRIES];
};

extern MtProc mt_proc;
extern guint64 mt_patch_address[];
extern guint64 mt_patch_length[];
extern guint8 mt_patch_bytes[];         /* MT_PATCH_BYTES per patch */
extern MtForkShared mt_forks;           /* a MAP_SHARED page: the parent and its fork children */
extern gpointer mt_real_execve;
extern void mt_on_exec (const gchar * path, gchar * const * argv);
extern void mt_on_exec_failed (gint error);

extern gint mprotect (gpointer address, gsize length, gint prot);
extern gint getpid (void);
extern gint getppid (void);
extern gint usleep (guint usec);
extern gint * __errno_location (void);

#define MT_PROT_READ 1
#define MT_PROT_WRITE 2
#define MT_PROT_EXEC 4

static inline void
mt_proc_barrier (void)
{
  g_atomic_int_add (&mt_forks.fence, 0);
}

/* Original bytes back into every patched function (the child is single-threaded here). */
static void
mt_restore (void)
{
  gint i;
  guint64 page = (guint64) mt_proc.page_size;
  for (i = 0; i < mt_proc.n_patches; i++)
  {
    guint64 address = mt_patch_address[i], length = mt_patch_length[i];
    guint64 start = address & ~(page - 1);
    guint64 end = (address + length + page - 1) & ~(page - 1);
    guint64 k;
    if (mprotect ((gpointer) start, end - start, MT_PROT_READ | MT_PROT_WRITE | MT_PROT_EXEC) != 0)
      continue;
    for (k = 0; k != length; k++)
      ((volatile guint8 *) address)[k] = mt_patch_bytes[i * MT_PATCH_BYTES + k];
    mprotect ((gpointer) start, end - start, MT_PROT_READ | MT_PROT_EXEC);
#ifdef MT_ARM64
    /* Untested here (x86-64 only): arm64 needs the instruction cache told. */
    gum_clear_cache ((gpointer) start, end - start);
#endif
  }
}

/* Posts this process in the shared page; returns its entry (or -1). */
static gint
mt_post (gint origin, const gchar * path)
{
  gint idx = g_atomic_int_add (&mt_forks.next, 1) & (MT_FORK_ENTRIES - 1);
  MtForkEntry * e = &mt_forks.e[idx];
  gint k = 0;
  if (e->state == MT_FORK_POSTED || e->state == MT_FORK_WRITING)
    g_atomic_int_add (&mt_forks.lost, 1);
  e->state = MT_FORK_WRITING;
  mt_proc_barrier ();
  e->pid = getpid ();
  e->ppid = getppid ();
  e->origin = origin;
  /* In a fork child the agent's memory is a copy nobody serves: the child's own agent must know
   * it is not the program's (a leak scan takes none of it for a root). */
  e->agent_memory = mt_proc.agent_memory;
  if (path != NULL)
  {
    for (; k < MT_FORK_PATH - 1 && path[k] != 0; k++)
      e->path[k] = path[k];
  }
  e->path[k] = 0;
  mt_proc_barrier ();
  e->state = MT_FORK_POSTED;
  return idx;
}

/* pthread atfork child handler (through a leaked stub, see process.js). */
void
mt_fork_child (void)
{
  gint idx, me, waited;
  /* A copy inherited by a child is not the traced process: its own forks are not ours to
   * report (a followed child has a new agent of its own for that). */
  if (mt_proc.agent_pid == 0)
    return;
  mt_proc.agent_pid = 0;
  mt_proc.exec_notify = 0;
  mt_restore ();
  mt_proc.forks++;
  idx = mt_post (MT_ORIGIN_FORK, NULL);
  if (!mt_proc.follow)
    return;
  me = getpid ();
  /* Bounded: a host that never comes (gone, or too slow) costs the child wait_ms, never a hang. */
  for (waited = 0; waited < mt_proc.wait_ms; waited++)
  {
    MtForkEntry * e = &mt_forks.e[idx];
    if (e->pid == me && e->state == MT_FORK_RELEASED)
      return;
    if (e->pid != me)
      return;     /* overwritten by a later child: nobody will release this one */
    usleep (1000);
  }
}

/* ---- signals held across fork -------------------------------------------------------------
 *
 * glibc's fork() locks every malloc arena (after the prepare handlers run) and unlocks them once
 * the fork syscall returns (before the parent and child handlers run).  A signal whose handler
 * calls malloc -- common, though not async-signal-safe -- landing in that window deadlocks on the
 * arena lock its own thread holds.  Natively the window is a short syscall; with an agent in the
 * process the fork copies far more page tables and the window widens enough that such a program
 * hung 5 times in 5 under memtrace (0 in 8 natively).  So the forking thread blocks every signal
 * in our prepare handler and restores its mask in the parent and child handlers: a signal that
 * arrives meanwhile is delivered right after fork returns, when the arenas are free again.  The
 * saved masks are kept by pthread_self() (the same value in the child for the forking thread). */

#define MT_FORK_MASKS 64
#define MT_SIG_BLOCK 0
#define MT_SIG_SETMASK 2

typedef struct _MtForkMask MtForkMask;
struct _MtForkMask
{
  volatile gint claim;              /* taken by g_atomic_int_add (TinyCC has no compare-and-swap) */
  gint reserved;
  volatile gsize owner;             /* pthread_self() of the forking thread, 0 = free */
  guint64 mask[16];                 /* its sigset_t (128 bytes on glibc) before the fork */
};

extern MtForkMask mt_fork_masks[];     /* MT_FORK_MASKS entries, zeroed by the agent (process.js) */

extern gint pthread_sigmask (gint how, const gpointer set, gpointer old);
extern gpointer pthread_self (void);

void
mt_fork_prepare (void)
{
  guint64 all[16];
  gsize me = (gsize) pthread_self ();
  gint i;
  for (i = 0; i != 16; i++)
    all[i] = ~(guint64) 0;
  for (i = 0; i != MT_FORK_MASKS; i++)
  {
    MtForkMask * m = &mt_fork_masks[i];
    if (m->claim != 0)
      continue;
    if (g_atomic_int_add (&m->claim, 1) == 0)
    {
      /* glibc keeps its own internal signals unblockable; SIGKILL/SIGSTOP cannot be blocked. */
      pthread_sigmask (MT_SIG_BLOCK, all, m->mask);
      mt_proc_barrier ();
      m->owner = me;
      return;
    }
    g_atomic_int_add (&m->claim, -1);
  }
  /* 64 threads forking at once: this fork goes unprotected, as without memtrace. */
}

static void
mt_fork_unmask (void)
{
  gsize me = (gsize) pthread_self ();
  gint i;
  for (i = 0; i != MT_FORK_MASKS; i++)
  {
    MtForkMask * m = &mt_fork_masks[i];
    if (m->owner == me)
    {
      pthread_sigmask (MT_SIG_SETMASK, m->mask, NULL);
      m->owner = 0;
      mt_proc_barrier ();
      g_atomic_int_add (&m->claim, -1);
      return;
    }
  }
}

void
mt_fork_parent (void)
{
  mt_fork_unmask ();
}

void
mt_fork_child_unmask (void)
{
  gint i;
  mt_fork_unmask ();
  /* Entries of other threads that were forking at that instant: they do not exist here. */
  for (i = 0; i != MT_FORK_MASKS; i++)
  {
    mt_fork_masks[i].owner = 0;
    mt_fork_masks[i].claim = 0;
  }
}

/* Forks between prepare and parent/child right now (teardown waits for them before the parent
 * and child handlers stop restoring masks). */
gint
mt_fork_masks_size (void)
{
  return (gint) (sizeof (MtForkMask) * MT_FORK_MASKS);
}

gint
mt_fork_masks_busy (void)
{
  gint i, n = 0;
  for (i = 0; i != MT_FORK_MASKS; i++)
    n += mt_fork_masks[i].claim != 0;
  return n;
}

/* ---- Frida's threads never run the program's signal handlers ---------------------------------
 *
 * A signal sent to the process (a timer's SIGALRM, SIGCHLD, SIGUSR1...) is run by any thread that
 * does not block it.  Natively a single-threaded program runs every handler on its own thread;
 * with the agent in, Frida's threads block nothing, and the kernel hands the signal to one of them
 * whenever the program's thread has it blocked -- inside its own handler, or across fork (the
 * masks above) -- or is busy.  signal_fork ran 1259 of its 2159 handlers on Frida's threads: a
 * handler that mallocs there interrupts whatever that thread was doing in libc's allocator (its
 * tcache half updated: SIGSEGV in tcache_get) or holds.  So Frida's threads block every
 * asynchronous signal: the helper below (a clone sharing our memory, as world.c's) attaches each
 * one with ptrace and adds them to its mask (PTRACE_SETSIGMASK: a thread's mask is otherwise only
 * its own to change).  Left unblocked: the faults a thread raises on itself (SIGILL, SIGTRAP,
 * SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGPIPE, SIGXFSZ, SIGSYS) and glibc's own 32 and 33. */

#define MT_PTRACE_GETSIGMASK 0x420a
#define MT_PTRACE_SETSIGMASK 0x420b
#define MT_MASK_GO_US 5000000              /* 5 s for the go-ahead at most */

typedef struct _MtMaskJob MtMaskJob;
struct _MtMaskJob
{
  const guint64 * tids;
  guint64 n;
  guint64 mask;                     /* bit s - 1: signal s */
  volatile gint go;                 /* the caller has named the helper its tracer (Yama) */
  volatile gint done;
};

/* Attach to one thread and wait, a bounded time, for it to stop (world.c stops a whole pass of
 * threads at once instead: mt_world_wait_pass).  PTRACE_SEIZE + PTRACE_INTERRUPT,
 * not PTRACE_ATTACH: ATTACH's stop is a SIGSTOP, and a SIGCONT sent to the process meanwhile (job
 * control, a supervisor, a debugger) discards a pending SIGSTOP -- the thread never stopped and the
 * wait for it never ended: the agent's JavaScript thread hung for good at start (seen once in a
 * loaded run, in mt_mask_threads).  INTERRUPT's stop is no signal: nothing can cancel it.  A signal
 * that arrives first is handed back to the thread (PTRACE_CONT with it; the interrupt stays
 * pending) and we wait again, as LeakSanitizer does.  A thread still running after
 * MT_WORLD_ATTACH_LIMIT_US is given up (FALSE): it stays seized, harmlessly, until the helper
 * ends, when the kernel lets go of every tracee the helper still has. */
static gboolean
mt_mask_attach (gint tid)
{
  gint status = 0, got, signals = 0;
  guint64 deadline;
  if (mt_ptrace (MT_PTRACE_SEIZE, tid, NULL, NULL) != 0)
    return FALSE;
  if (mt_ptrace (MT_PTRACE_INTERRUPT, tid, NULL, NULL) != 0)
    return FALSE;                                 /* gone meanwhile */
  deadline = mt_world_now_us () + MT_WORLD_ATTACH_LIMIT_US;
  for (;;)
  {
    got = mt_waitpid (tid, &status, MT_WALL | MT_WNOHANG);
    if (got == 0)
    {
      if (mt_world_now_us () > deadline)
        return FALSE;
      mt_world_sleep_us (MT_WORLD_WAIT_US);
      continue;
    }
    if (got != tid)
      return FALSE;
    if ((status & 0xff) != 0x7f)
      return FALSE;                               /* exited meanwhile */
    if ((status >> 16) == MT_PTRACE_EVENT_STOP)
      return TRUE;                                /* our interrupt's stop (or a group stop) */
    if (++signals == 64)
      break;
    mt_ptrace (MT_PTRACE_CONT, tid, NULL, (gpointer) (gsize) ((status >> 8) & 0xff));
  }
  /* The 64th signal handed back with the detach, not lost. */
  mt_ptrace (MT_PTRACE_DETACH, tid, NULL, (gpointer) (gsize) ((status >> 8) & 0xff));
  return FALSE;
}

/* The helper runs on the caller's TLS (a clone without CLONE_SETTLS) while the caller waits: it
 * makes its system calls through syscall(2), as world.c's helper does (mt_ptrace, mt_prctl,
 * mt_world_sleep_us), never libc's wrappers -- a tracer may hook those (the descriptor guard
 * redirects close), and a hooked or locked libc entry run on a borrowed TLS is Frida's
 * interceptor, or a lock, entered twice on one thread's state.  Its bound is a time. */
static gint
mt_mask_helper (gpointer data)
{
  MtMaskJob * job = data;
  guint64 i;
  guint64 deadline;
  mt_world_block_signals ();      /* (world.c: the target's SIGCHLD handler must not run here) */
  mt_prctl (MT_PR_SET_PDEATHSIG, MT_SIGKILL, 0, 0, 0);
  deadline = mt_world_now_us () + MT_MASK_GO_US;
  while (g_atomic_int_add (&job->go, 0) == 0)
  {
    if (mt_world_now_us () > deadline)
      return 0;
    mt_world_sleep_us (MT_WORLD_WAIT_US);
  }
  for (i = 0; i != job->n; i++)
  {
    guint64 m = 0;
    gint tid = (gint) job->tids[i];
    if (!mt_mask_attach (tid))
      continue;                     /* gone meanwhile */
    if (mt_ptrace (MT_PTRACE_GETSIGMASK, tid, 8, &m) == 0)
    {
      m |= job->mask;
      if (mt_ptrace (MT_PTRACE_SETSIGMASK, tid, 8, &m) == 0)
        g_atomic_int_add (&job->done, 1);
    }
    mt_ptrace (MT_PTRACE_DETACH, tid, 0, 0);
  }
  return 0;
}

/* Adds `mask` to the signal mask of each of tids (never the caller's own); returns how many were
 * changed, -1 when no helper could be started, -2 under a seccomp filter (which may trap the
 * helper's clone: nothing is tried). */
gint
mt_mask_threads (const guint64 * tids, guint64 n, guint64 mask, guint8 * stack, guint64 stack_size)
{
  MtMaskJob job;
  gint pid, status = 0;
  gpointer top = (gpointer) (((guint64) stack + stack_size) & ~(guint64) 15);
  if (n == 0)
    return 0;
  if (mt_world_seccomp ((guint64) getpid ()))
    return -2;
  job.tids = tids;
  job.n = n;
  job.mask = mask;
  job.go = 0;
  job.done = 0;
  pid = clone (mt_mask_helper, top, MT_CLONE_VM | MT_CLONE_FS | MT_CLONE_FILES | MT_CLONE_UNTRACED, &job);
  if (pid <= 0)
    return -1;
  mt_prctl (MT_PR_SET_PTRACER, pid, 0, 0, 0);
  g_atomic_int_add (&job.go, 1);
  while (mt_waitpid (pid, &status, MT_WCLONE) < 0 && *__errno_location () == 4 /* EINTR */)
    ;
  return job.done;
}

/* ---- Frida's descriptors kept open -----------------------------------------------------------
 *
 * Daemons close every descriptor above 2 at start (a close() loop to the limit, close_range,
 * closefrom).  Among them are Frida's own -- the socket to the host, its event fds -- and with
 * them went the whole capture: 99.96 % of a run lost, and Frida's agent thread left spinning at
 * full CPU in a process memtrace no longer reached.  While the window is open, close, close_range
 * and closefrom are redirected here: a descriptor Frida cloaks (mt_fd_guard, a bitmap the agent
 * refreshes from Cloak.hasFileDescriptor) is kept open and the call reports success for it, as if
 * it had been closed -- unless the caller is Frida's own code (mt_fd_state ranges), which may
 * close what it opened.  Counted, and said in the capture.
 *
 * dup2 and dup3 onto one of them would close it just the same (the kernel closes the target
 * descriptor first).  Reporting success there, as close does, would leave the program writing its
 * own data into Frida's socket, so the call fails with EBUSY instead (what the kernel itself says
 * when the target descriptor is being opened at that instant): counted, and said in the capture.
 *
 * Not covered: the close system call made directly (syscall(SYS_close), an inline instruction,
 * a close_range system call): nothing short of a seccomp filter or patching every such call site
 * sees it.  Frida's channel is then lost; the host says so in the capture's ending. */

#define MT_CLOSE_RANGE_MAX_FD ~0U

#define MT_FD_KEPT 0                /* mt_fd_state: closes of a guarded descriptor kept open */
#define MT_EBUSY 16

/* mt_fd_state: [0] descriptors kept open, [1] ranges of Frida's code, then [lo, hi) pairs, [14]
 * dup2/dup3 refused. */
extern volatile guint64 mt_fd_guard[];
extern volatile guint64 mt_fd_state[];
extern gpointer mt_real_close;
extern gpointer mt_real_close_range;
extern gpointer mt_real_dup2;
extern gpointer mt_real_dup3;

typedef gint (* MtCloseFunc) (gint fd);
typedef gint (* MtCloseRangeFunc) (guint lo, guint hi, gint flags);
typedef gint (* MtDup2Func) (gint oldfd, gint newfd);
typedef gint (* MtDup3Func) (gint oldfd, gint newfd, gint flags);

#ifdef __TINYC__
/* TinyCC keeps a frame pointer in every function: the caller's return address sits above it. */
# define MT_CALLER() (((guint64 *) __builtin_frame_address (0))[1])
#else
# define MT_CALLER() ((guint64) __builtin_return_address (0))
#endif

/* Whether fd is one of Frida's that this caller (not Frida's own code) may not take away; counted
 * in mt_fd_state[counter] when so. */
static gboolean
mt_fd_guarded (guint64 fd, guint64 caller, gint counter)
{
  guint64 i, n;
  if (fd >= MT_FD_GUARD_MAX || ((mt_fd_guard[fd >> 6] >> (fd & 63)) & 1) == 0)
    return FALSE;
  n = mt_fd_state[1];
  for (i = 0; i < n && i < MT_FD_RANGES; i++)
  {
    if (caller >= mt_fd_state[2 + 2 * i] && caller < mt_fd_state[3 + 2 * i])
      return FALSE;
  }
  g_atomic_pointer_add ((volatile gsize *) &mt_fd_state[counter], 1);
  return TRUE;
}

static gboolean
mt_fd_kept (guint64 fd, guint64 caller)
{
  return mt_fd_guarded (fd, caller, MT_FD_KEPT);
}

gint
mt_close (gint fd)
{
  if (fd >= 0 && mt_fd_kept ((guint64) fd, MT_CALLER ()))
    return 0;
  return ((MtCloseFunc) mt_real_close) (fd);
}

/* [lo, hi] less the kept descriptors, as the runs between them. */
static gint
mt_close_range_kept (guint lo, guint hi, gint flags, guint64 caller)
{
  guint64 a = lo, fd, top = hi;
  gint r = 0;
  if (top > MT_FD_GUARD_MAX - 1)
    top = MT_FD_GUARD_MAX - 1;
  for (fd = lo; fd <= top; fd++)
  {
    if (!mt_fd_kept (fd, caller))
      continue;
    if (fd > a && ((MtCloseRangeFunc) mt_real_close_range) ((guint) a, (guint) (fd - 1), flags) != 0)
      r = -1;
    a = fd + 1;
  }
  if (a <= (guint64) hi && ((MtCloseRangeFunc) mt_real_close_range) ((guint) a, hi, flags) != 0)
    r = -1;
  return r;
}

gint
mt_close_range (guint lo, guint hi, gint flags)
{
  return mt_close_range_kept (lo, hi, flags, MT_CALLER ());
}

void
mt_closefrom (gint lo)
{
  guint64 caller = MT_CALLER ();
  if (lo < 0)
    lo = 0;
  if (mt_close_range_kept ((guint) lo, MT_CLOSE_RANGE_MAX_FD, 0, caller) != 0)
  {
    /* No close_range (an old kernel): one by one, as glibc's own fallback does. */
    guint64 fd;
    for (fd = (guint64) lo; fd < MT_FD_GUARD_MAX; fd++)
    {
      if (!mt_fd_kept (fd, caller))
        ((MtCloseFunc) mt_real_close) ((gint) fd);
    }
  }
}

/* dup2(old, new) onto a guarded descriptor: refused (dup2(fd, fd) changes nothing: let through). */
gint
mt_dup2 (gint oldfd, gint newfd)
{
  if (newfd >= 0 && newfd != oldfd && mt_fd_guarded ((guint64) newfd, MT_CALLER (), MT_FD_DUP_REFUSED))
  {
    *__errno_location () = MT_EBUSY;
    return -1;
  }
  return ((MtDup2Func) mt_real_dup2) (oldfd, newfd);
}

gint
mt_dup3 (gint oldfd, gint newfd, gint flags)
{
  if (newfd >= 0 && newfd != oldfd && mt_fd_guarded ((guint64) newfd, MT_CALLER (), MT_FD_DUP_REFUSED))
  {
    *__errno_location () = MT_EBUSY;
    return -1;
  }
  return ((MtDup3Func) mt_real_dup3) (oldfd, newfd, flags);
}

/* The parent's agent takes the next posted entry: out[0..2] = pid, ppid, origin, path copied.
 * Returns the entry index, or -1 when nothing is posted. */
gint
mt_fork_take (gint * out, gchar * path, gint path_max)
{
  gint i, k;
  for (i = 0; i != MT_FORK_ENTRIES; i++)
  {
    MtForkEntry * e = &mt_forks.e[i];
    if (e->state != MT_FORK_POSTED)
      continue;
    out[0] = e->pid;
    out[1] = e->ppid;
    out[2] = e->origin;
    for (k = 0; k < path_max - 1 && k < MT_FORK_PATH - 1 && e->path[k] != 0; k++)
      path[k] = e->path[k];
    path[k] = 0;
    mt_proc_barrier ();
    e->state = MT_FORK_TAKEN;
    return i;
  }
  return -1;
}

/* Where entry idx lives: the child's new agent finds it at the same address (the page is
 * inherited) and releases the child there. */
gpointer
mt_fork_entry (gint idx)
{
  return &mt_forks.e[idx & (MT_FORK_ENTRIES - 1)];
}

/* The child's own (new) agent lets the child run: the entry as the parent posted it. */
gint
mt_fork_release (MtForkEntry * e, gint pid)
{
  if (e->pid != pid || e->state != MT_FORK_TAKEN)
    return 0;
  mt_proc_barrier ();
  e->state = MT_FORK_RELEASED;
  return 1;
}

/* On a followed fork child's own agent: where its inherited copy of the parent agent's
 * MtAgentMemory is (0: none), as the child `pid` posted it (0 when the entry is another's). */
guint64
mt_fork_agent_memory (const MtForkEntry * e, gint pid)
{
  if (e->pid != pid || e->state != MT_FORK_TAKEN)
    return 0;
  mt_proc_barrier ();
  return e->agent_memory;
}

gint
mt_fork_lost (void)
{
  return mt_forks.lost;
}

typedef gint (* MtExecveFunc) (const gchar * path, gchar * const * argv, gchar * const * envp);

#if defined (__x86_64__)
/* execve as a system call of our own: glibc's execve is too short for Frida's replaceFast (its
 * error branch jumps back into the bytes a redirect overwrites), so process.js points execve's
 * first bytes straight at mt_execve and the real call is this (see hookExec). */
gint
mt_execve_raw (const gchar * path, gchar * const * argv, gchar * const * envp)
{
  glong r;
  __asm__ volatile ("syscall" : "=a" (r) : "0" (59L), "D" (path), "S" (argv), "d" (envp) : "rcx", "r11", "memory");
  if (r < 0 && r > -4096)
  {
    *__errno_location () = (gint) -r;
    return -1;
  }
  return (gint) r;
}
#endif

gint
mt_execve (const gchar * path, gchar * const * argv, gchar * const * envp)
{
  gint r;
  if (getpid () != mt_proc.agent_pid)
  {
    /* vfork/posix_spawn child: our memory, another process.  Never enter the agent.  A failed
     * attempt (execvp trying each PATH entry) withdraws its post: only the exec that happened is
     * a child (unless the parent's flush took it meanwhile). */
    gint idx = mt_post (MT_ORIGIN_SPAWN, path);
    r = ((MtExecveFunc) mt_real_execve) (path, argv, envp);
    /* (Both sides only ever write TAKEN over POSTED: no atomic exchange needed, nor one TinyCC has.) */
    if (mt_forks.e[idx].state == MT_FORK_POSTED && mt_forks.e[idx].pid == getpid ())
      mt_forks.e[idx].state = MT_FORK_TAKEN;
    return r;
  }
  if (mt_proc.exec_notify)
    mt_on_exec (path, argv);
  r = ((MtExecveFunc) mt_real_execve) (path, argv, envp);
  if (mt_proc.exec_notify)
    mt_on_exec_failed (*__errno_location ());
  return r;
}

/* Ranges where a (executable mapping) and b (the same bytes from the file) differ, as
 * [offset, length] pairs in out (at most max pairs; returns how many, or max + 1 when there
 * are more).  A range ends after 32 equal bytes. */
gint
mt_diff (const guint8 * a, const guint8 * b, guint64 len, guint64 * out, gint max)
{
  guint64 i = 0;
  gint n = 0;
  while (i < len)
  {
    guint64 start, last, same;
    if (a[i] == b[i])
    {
      i++;
      continue;
    }
    start = i;
    last = i;
    same = 0;
    for (i++; i < len && same < 32; i++)
    {
      if (a[i] == b[i])
        same++;
      else
      {
        last = i;
        same = 0;
      }
    }
    if (n == max)
      return max + 1;
    out[2 * n] = start;
    out[2 * n + 1] = last + 1 - start;
    n++;
  }
  return n;
}

guint64
mt_proc_size (void)
{
  return sizeof (MtProc);
}

guint64
mt_forks_size (void)
{
  return sizeof (MtForkShared);
}
