/*
 * The malloc core (cmodule/core.c, track.c, drain.c, malloc.c, unwind.c, leaks.c), compiled
 * natively under AddressSanitizer + UndefinedBehaviorSanitizer or ThreadSanitizer, driven the way
 * a target drives it: 8 threads calling the hooked malloc family (as Interceptor.replaceFast sends
 * the target's calls to mt_malloc ...) or, in "logger" mode, libmalloc's malloc_logger calls
 * (the Darwin path: mt_malloc_logger around the real calls); short-lived threads coming and going
 * (slots claimed, the key's destructor, slots retired); signals landing in the middle of the hooks
 * (a handler that allocates: the nested path); fork children that allocate through the hooks with
 * whatever locks other threads held at the fork; and a drain thread doing what the agent's timer
 * does.  The tables are allocated here, sized as agents/runtime/core.js sizes them, each as a
 * global of its exact size so that an index past its end is a sanitizer report.
 *
 * Besides the sanitizers, it checks what the core promises, and exits 1 naming what broke:
 *   - every call counted: the counters by kind (plus calls with no slot) equal the calls made;
 *   - nothing left in the live table once every block is freed (modes that track every block);
 *   - slots_hw never beyond the slot array;
 *   - the peak never below the tracked bytes a drain sees;
 *   - a fork child finishes its allocations (no lock a vanished thread held hangs it).
 *
 * Usage: harness MODE [ITERATIONS]   MODE: stacked | sampled | events | logger
 * The layout header generated from memtrace/layout.py comes first in the core's translation
 * unit (tests/native/test_sanitizers.py builds both); this file includes it for the structs.
 */
#define _GNU_SOURCE
#include "layout.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- the tables the agent allocates (agents/runtime/core.js), at smaller sizes ---------------- */

#define N_SLOTS 64            /* probe.c's MT_HARNESS_SLOTS */
#define STACK_SLOTS 4096
#define LIVE_BUCKET_BITS MT_LIVE_MIN_BUCKET_BITS   /* the agent's smallest: a key names a 48-bit address */
#define LIVE_BUCKETS (1 << LIVE_BUCKET_BITS)
#define LANES 4
#define N_ROWS (STACK_SLOTS + 3)
#define N_RINGS 64
#define RING_SIZE 65536
#define DEFS_BYTES (1 << 20)
#define DRAIN_CAP (4 << 20)

#define ALIGNED __attribute__ ((aligned (64)))

MtConfig mt_config;
/* mt_globals, mt_core and mt_slots (N_SLOTS of them): probe.c, where their types are known. */
guint8 mt_ring_pool[N_RINGS * RING_SIZE] ALIGNED;
/* As the agent sizes them (runtime/core.js): (hash, id) pairs, twice as many as stack ids; each
 * live bucket its MT_LIVE_WAYS entries. */
volatile guint64 mt_stack_table[8 * STACK_SLOTS];   /* every generation of the index */
guint8 mt_defs[DEFS_BYTES] ALIGNED;
guint8 mt_live_table[LIVE_BUCKETS * MT_LIVE_WAYS * sizeof (MtLiveEntry)] ALIGNED;
volatile gint mt_live_locks[LIVE_BUCKETS];
volatile guint8 mt_live_spill[LIVE_BUCKETS];
volatile guint64 mt_agg[N_ROWS * LANES * MT_AGG_HOT] ALIGNED;
volatile guint64 mt_agg_cold[N_ROWS * LANES * MT_AGG_COLD] ALIGNED;
volatile guint8 mt_agg_cold_rows[N_ROWS];
volatile guint8 mt_agg_dirty[N_ROWS];
guint64 mt_agg_shipped[N_ROWS * MT_AGG_SHIPPED_HOT];
guint64 mt_agg_shipped_cold[N_ROWS * MT_AGG_COLD];
gint64 mt_agg_live[N_ROWS];
MtDrainInfo mt_drain_info;
guint64 mt_top[2 * MT_TOP_STACKS];
guint64 mt_top_changed[1 + MT_TOP_CHANGED_MAX] = { MT_TOP_CHANGED_MAX + 1 };
MtSite mt_sites[MT_N_SITES];
volatile guint64 mt_slow_kinds;
volatile guint64 mt_alias_kinds;
volatile guint64 mt_tls_offset;          /* 0: the core asks pthread_getspecific */
volatile guint64 mt_own_threads[MT_OWN_THREADS_WORDS];   /* zeros: no thread is Frida's */
volatile guint64 mt_main_stack[3];       /* zeros: every thread's bounds from pthread_getattr_np */
volatile guint64 mt_main_arena[2];       /* zeros: no thread is handed an arena */
gsize (* volatile mt_usable_size) (gconstpointer);   /* NULL: the harness's threads are never memtrace's own */
volatile guint64 mt_unwind_count;        /* no unwind tables: frame-pointer walks */
MtUnwindModule mt_unwind_modules[MT_MAX_UNWIND_MODULES];
guint8 mt_frame_caches[(N_SLOTS + 1) * MT_FRAME_CACHE_BYTES] ALIGNED;   /* unwind.c's, unused without tables */
volatile guint64 mt_frame_cache_on = 1;
volatile guint32 mt_self_task;
gsize (* volatile mt_block_size) (gconstpointer);
volatile gint mt_inflight[MT_LOGGER_INFLIGHT_SHARDS * MT_LOGGER_INFLIGHT_STRIDE];

/* ---- what Frida's CModule runtime provides (tests/native/shim) -------------------------------- */

gint
g_atomic_int_add (volatile gint * atomic, gint val)
{
  return __atomic_fetch_add (atomic, val, __ATOMIC_SEQ_CST);
}

gssize
g_atomic_pointer_add (volatile void * atomic, gssize val)
{
  return __atomic_fetch_add ((volatile gssize *) atomic, val, __ATOMIC_SEQ_CST);
}

gint64
g_get_monotonic_time (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (gint64) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* world.c's own patch writer (mt_world_write) flushes the instruction cache after a store. */
void
gum_clear_cache (gpointer address, gsize size)
{
  __builtin___clear_cache ((char *) address, (char *) address + size);
}

/* Replacements are called directly here, as replaceFast calls them: no invocation context. */
void *
gum_interceptor_get_current_invocation (void)
{
  return NULL;
}

gpointer
gum_invocation_context_get_return_address (void * context)
{
  (void) context;
  return NULL;
}

/* ---- the core's entry points ----------------------------------------------------------------- */

extern gpointer mt_malloc (gsize);
extern gpointer mt_calloc (gsize, gsize);
extern gpointer mt_realloc (gpointer, gsize);
extern gpointer mt_reallocarray (gpointer, gsize, gsize);
extern void mt_free (gpointer);
extern gint mt_posix_memalign (gpointer *, gsize, gsize);
extern gpointer mt_memalign (gsize, gsize);
extern gpointer mt_aligned_alloc (gsize, gsize);
extern void mt_malloc_logger (guint32 type, guint64 arg1, guint64 arg2, guint64 arg3, guint64 result, guint32 skip);
extern void mt_thread_exit (gpointer value);
extern guint64 mt_drain (guint8 * out, guint64 cap, guint64 final);
extern void mt_snapshot (guint64 * out);
extern guint64 mt_lost_calls (void);
extern guint64 mt_live_count (void);
extern guint64 mt_live_occupied (void);
extern guint64 mt_slot_size (void);
extern guint64 mt_globals_size (void);
extern guint64 mt_core_size (void);
extern gint64 mt_probe_live_blocks (void);
extern gint64 mt_probe_tracked_bytes (void);
extern guint64 mt_config_size (void);
extern guint64 mt_busy_slots (void);
/* probe.c, compiled with the core */
extern guint64 mt_probe_n_slots (void);
extern guint64 mt_probe_slots_hw (void);
extern void mt_probe_set_slots_hw (gint hw);
extern void mt_probe_peak_lock (gint delta);
extern guint64 mt_probe_live_bucket (guint64 p);
extern guint64 mt_probe_live_keys (void);
extern guint64 mt_probe_index_check (guint64 * gen);

/* ---- the allocator behind the hooks ---------------------------------------------------------- */

/* A signal handler's allocations come from a per-thread pool (glibc's malloc is not
 * async-signal-safe; the hooks around it are what is under test).  The handler runs with its
 * signal blocked, so one thread never enters the pool twice. */
#define POOL_BYTES (1 << 18)      /* more than twice the largest block the workload asks for */
static __thread int in_handler;
static int in_fork_child;     /* the sanitizers' own allocators are not safe after a fork of a threaded process */
static __thread guint8 pool[POOL_BYTES] __attribute__ ((aligned (16)));
static __thread gsize pool_used;

static int
from_pool (gconstpointer p)
{
  return (const guint8 *) p >= pool && (const guint8 *) p < pool + POOL_BYTES;
}

static gpointer
h_malloc (gsize n)
{
  if (in_handler || in_fork_child)
  {
    gpointer p;
    n = (n + 15) & ~(gsize) 15;
    if (pool_used + n > POOL_BYTES)
      pool_used = 0;      /* every handler frees what it took before it returns */
    p = pool + pool_used;
    pool_used += n;
    return p;
  }
  return malloc (n);
}

static gpointer
h_calloc (gsize n, gsize size)
{
  if (in_handler || in_fork_child)
  {
    gpointer p = h_malloc (n * size);
    memset (p, 0, n * size);
    return p;
  }
  return calloc (n, size);
}

static void
h_free (gpointer p)
{
  if (!from_pool (p))
    free (p);
}

static gint
h_posix_memalign (gpointer * out, gsize alignment, gsize size)
{
  return posix_memalign (out, alignment, size);
}

gpointer (*real_malloc) (gsize) = h_malloc;
gpointer (*real_calloc) (gsize, gsize) = h_calloc;
gpointer (*real_realloc) (gpointer, gsize) = realloc;
void (*real_free) (gpointer) = h_free;
gint (*real_posix_memalign) (gpointer *, gsize, gsize) = h_posix_memalign;
gpointer (*real_memalign) (gsize, gsize) = memalign;
gpointer (*real_aligned_alloc) (gsize, gsize) = aligned_alloc;
gpointer (*real_valloc) (gsize) = valloc;
gpointer (*real_pvalloc) (gsize) = pvalloc;
gpointer (*real_reallocarray) (gpointer, gsize, gsize) = reallocarray;

/* Darwin's malloc_size: 0 for an address that is not an allocated block (glibc's
 * malloc_usable_size may not be asked about a freed one; the sanitizers' allocator can say). */
extern int __sanitizer_get_ownership (const volatile void * p);          /* sanitizer/allocator_interface.h */
extern size_t __sanitizer_get_allocated_size (const volatile void * p);

static gsize
h_block_size (gconstpointer p)
{
  return __sanitizer_get_ownership (p) ? __sanitizer_get_allocated_size (p) : 0;
}

/* ---- the workload ---------------------------------------------------------------------------- */

enum { MODE_STACKED, MODE_SAMPLED, MODE_EVENTS, MODE_LOGGER };
static int mode;
static long iterations = 20000;

#define N_WORKERS 8
#define KEEP 64
#define LOG_ALLOC 2
#define LOG_DEALLOC 4
#define LOG_ZONE 8

/* Calls made, by kind, to compare with what the core counted. */
static atomic_ulong made[MT_N_KINDS];
static atomic_int stop_drain, stop_signals;
static atomic_int failures;
static atomic_int worker_done[N_WORKERS];      /* a finished worker is never signalled (nor joined before) */
/* Nor one before its first hooked call has its slot: a thread's first call made in a signal handler
 * assigns the slot there, and mt_fetch_stack_bounds's pthread_getattr_np is not async-signal-safe
 * (it deadlocked on its own lock when the signal landed inside the sanitizer's thread start-up, in
 * the same call).  A known limit of the core, kept out of this run. */
static atomic_int worker_ready[N_WORKERS];
static pthread_t workers[N_WORKERS];

#define FAIL(...) do { fprintf (stderr, "harness: " __VA_ARGS__); fputc ('\n', stderr); \
                       atomic_fetch_add (&failures, 1); } while (0)

static guint64
next_random (guint64 * state)
{
  guint64 x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *state = x;
}

static gsize
pick_size (guint64 r)
{
  static const gsize sizes[] = { 16, 48, 200, 1000, 4096, 8192, 20000, 70000 };
  return sizes[r % G_N_ELEMENTS (sizes)] + (gsize) ((r >> 8) % 64);
}

/* The logger path: the allocator's own call, then the event libmalloc logs for it. */
static gpointer
logged_malloc (gsize n)
{
  gpointer p = malloc (n);
  mt_malloc_logger (LOG_ALLOC | LOG_ZONE, 0, n, 0, (guint64) (gsize) p, 0);
  return p;
}

static void
logged_free (gpointer p)
{
  mt_malloc_logger (LOG_DEALLOC | LOG_ZONE, 0, (guint64) (gsize) p, 0, 0, 0);
  free (p);
}

static gpointer
logged_realloc (gpointer old, gsize n)
{
  gpointer p = realloc (old, n);
  mt_malloc_logger (LOG_ALLOC | LOG_DEALLOC | LOG_ZONE, 0, (guint64) (gsize) old, n, (guint64) (gsize) p, 0);
  return p;
}

static gpointer
do_alloc (guint64 r)
{
  gsize n = pick_size (r >> 3);
  gpointer p = NULL;
  if (mode == MODE_LOGGER)
  {
    atomic_fetch_add (&made[MT_K_MALLOC], 1);
    return logged_malloc (n);
  }
  switch (r % 5)
  {
    case 0: case 1:
      atomic_fetch_add (&made[MT_K_MALLOC], 1);
      return mt_malloc (n);
    case 2:
      atomic_fetch_add (&made[MT_K_CALLOC], 1);
      return mt_calloc (1, n);
    case 3:
      atomic_fetch_add (&made[MT_K_POSIX_MEMALIGN], 1);
      if (mt_posix_memalign (&p, 64, n) != 0)
        return NULL;
      return p;
    default:
      atomic_fetch_add (&made[MT_K_MEMALIGN], 1);
      return mt_memalign (32, n);
  }
}

static gpointer
do_realloc (gpointer p, guint64 r)
{
  gsize n = pick_size (r >> 5);
  if (mode == MODE_LOGGER)
  {
    atomic_fetch_add (&made[MT_K_REALLOC], 1);
    return logged_realloc (p, n);
  }
  atomic_fetch_add (&made[MT_K_REALLOC], 1);
  return mt_realloc (p, n);
}

static void
do_free (gpointer p)
{
  atomic_fetch_add (&made[MT_K_FREE], 1);
  if (mode == MODE_LOGGER)
    logged_free (p);
  else
    mt_free (p);
}

/* A handler that allocates in the middle of whatever the thread was doing (the nested path). */
static void
on_signal (int sig)
{
  int saved = errno;
  gpointer p;
  (void) sig;
  in_handler = 1;
  if (mode == MODE_LOGGER)
  {
    /* libmalloc logs a handler's calls like any other (through the pool here). */
    p = h_malloc (1000);
    atomic_fetch_add (&made[MT_K_MALLOC], 1);
    mt_malloc_logger (LOG_ALLOC | LOG_ZONE, 0, 1000, 0, (guint64) (gsize) p, 0);
    atomic_fetch_add (&made[MT_K_FREE], 1);
    mt_malloc_logger (LOG_DEALLOC | LOG_ZONE, 0, (guint64) (gsize) p, 0, 0, 0);
  }
  else
  {
    atomic_fetch_add (&made[MT_K_CALLOC], 1);
    p = mt_calloc (1, 1000);
    atomic_fetch_add (&made[MT_K_FREE], 1);
    mt_free (p);
  }
  in_handler = 0;
  errno = saved;
}

static void *
short_lived (void * arg)
{
  guint64 r = (guint64) (gsize) arg | 1;
  int i;
  for (i = 0; i != 50; i++)
    do_free (do_alloc (next_random (&r)));
  return NULL;
}

/* A fork child allocates through the hooks, with whatever locks other threads held at the fork. */
static void
fork_and_wait (guint64 r)
{
  pid_t pid = fork ();
  if (pid == 0)
  {
    int i;
    in_fork_child = 1;
    for (i = 0; i != 200; i++)
    {
      gsize n = pick_size (next_random (&r));
      if (mode == MODE_LOGGER)
      {
        gpointer p = h_malloc (n);
        mt_malloc_logger (LOG_ALLOC | LOG_ZONE, 0, n, 0, (guint64) (gsize) p, 0);
        mt_malloc_logger (LOG_DEALLOC | LOG_ZONE, 0, (guint64) (gsize) p, 0, 0, 0);
      }
      else
        mt_free (i & 1 ? mt_malloc (n) : mt_calloc (1, n));
    }
    _exit (0);
  }
  if (pid < 0)
    return;
  for (int waited = 0;; waited++)
  {
    int status;
    pid_t w = waitpid (pid, &status, WNOHANG);
    if (w == pid)
    {
      if (!WIFEXITED (status) || WEXITSTATUS (status) != 0)
        FAIL ("a fork child ended with status %#x", status);
      return;
    }
    if (w < 0 && errno != EINTR)
      return;
    if (waited == 30000)      /* 30 s */
    {
      FAIL ("a fork child hung in the hooks (a lock held by a thread that does not exist in it)");
      {
        /* Where it hangs, for the report (best effort: gdb may be missing or not allowed). */
        char cmd[160];
        snprintf (cmd, sizeof cmd, "gdb -batch -p %d -ex 'thread apply all bt 25' 1>&2 2>/dev/null", (int) pid);
        if (system (cmd) != 0)
          fprintf (stderr, "harness: no stack of the hung child (gdb)\n");
      }
      kill (pid, SIGKILL);
      waitpid (pid, &status, 0);
      return;
    }
    usleep (1000);
  }
}

/* Allocations from up to 2,047 distinct call paths (each level one of two functions, up to 10
 * deep): stacks keep being interned all run long, so the stack index grows (MT_INDEX_MIN is small
 * here, build.py) while other threads look stacks up in it. */
static gpointer path_b (guint64 r, guint depth);

static __attribute__ ((noinline)) gpointer
path_a (guint64 r, guint depth)
{
  gpointer p = depth == 0 ? do_alloc (r) : (r & 1) ? path_a (r >> 1, depth - 1) : path_b (r >> 1, depth - 1);
  __asm__ __volatile__ ("" ::: "memory");   /* no tail call: every level keeps its frame */
  return p;
}

static __attribute__ ((noinline)) gpointer
path_b (guint64 r, guint depth)
{
  gpointer p = depth == 0 ? do_alloc (r) : (r & 1) ? path_a (r >> 1, depth - 1) : path_b (r >> 1, depth - 1);
  __asm__ __volatile__ ("" ::: "memory");
  return p;
}

static void *
worker (void * arg)
{
  long id = (long) arg;
  guint64 r = 0x9e3779b97f4a7c15ULL * (guint64) (id + 1);
  gpointer keep[KEEP] = { 0 };
  long i;
  do_free (do_alloc (next_random (&r)));
  atomic_store (&worker_ready[id], 1);
  for (i = 0; i != iterations; i++)
  {
    guint64 x = next_random (&r);
    guint k = (guint) (x >> 40) % KEEP;
    if (keep[k] == NULL)
      keep[k] = (x & 0x300) == 0 ? path_a (x >> 12, (guint) (x >> 24) % 11) : do_alloc (x);
    else if ((x & 7) == 0)
      keep[k] = do_realloc (keep[k], x);
    else
    {
      do_free (keep[k]);
      keep[k] = NULL;
    }
    if (i % 997 == 0)
    {
      /* a thread that comes and goes: claims a slot, runs the key's destructor, is retired */
      pthread_t t;
      if (pthread_create (&t, NULL, short_lived, (void *) (gsize) x) == 0)
        pthread_join (t, NULL);
    }
    if (id == 0 && i % 4001 == 2000)
      fork_and_wait (x);
  }
  for (i = 0; i != KEEP; i++)
    if (keep[i] != NULL)
      do_free (keep[i]);
  atomic_store (&worker_done[id], 1);
  return NULL;
}

static void *
signaller (void * arg)
{
  guint64 r = 12345;
  (void) arg;
  while (!atomic_load (&stop_signals))
  {
    guint64 w = next_random (&r) % N_WORKERS;
    if (atomic_load (&worker_ready[w]) && !atomic_load (&worker_done[w]))
      pthread_kill (workers[w], SIGUSR1);
    usleep (200);
  }
  return NULL;
}

/* What the agent's timer does every 100 ms (here: all the time), and what it checks. */
static guint8 drain_buf[DRAIN_CAP];

static guint64 snapshot_buf[MT_N_COUNTERS];
static guint64 max_tracked_seen;     /* the most tracked bytes any drain saw (drain thread, then main) */

/* Once every thread that allocated has returned: the peak is at least what any drain saw. */
static void
check_peak (const char * when)
{
  if (mt_drain_info.peak_bytes < max_tracked_seen)
    FAIL ("%s: the peak (%llu B) is below the %llu B a drain saw tracked", when,
          (unsigned long long) mt_drain_info.peak_bytes, (unsigned long long) max_tracked_seen);
}

static void
drain_once (guint64 final)
{
  do
  {
    mt_drain (drain_buf, DRAIN_CAP, final);
    mt_snapshot (snapshot_buf);     /* flush.js reads the counters with every drain */
    /* Every thread frees only its own blocks: a free is counted after its allocation in program
     * order, and the drain reads a row's free side first (drain.c, mt_row_totals). */
    if (mt_probe_live_blocks () < 0 || mt_probe_tracked_bytes () < 0)
      FAIL ("a drain read %lld live blocks, %lld tracked bytes: a free counted before its allocation",
            (long long) mt_probe_live_blocks (), (long long) mt_probe_tracked_bytes ());
    /* (A drain can see bytes just added before the same call raised the peak: compared at the end.) */
    if (mt_drain_info.tracked_bytes > max_tracked_seen)
      max_tracked_seen = mt_drain_info.tracked_bytes;
  }
  while (mt_drain_info.more);
}

static void *
drainer (void * arg)
{
  (void) arg;
  while (!atomic_load (&stop_drain))
  {
    drain_once (0);
    usleep (500);
  }
  return NULL;
}

/* ---- the four findings, each provoked on purpose ---------------------------------------------- */

static void *
big_alloc (void * arg)
{
  (void) arg;
  atomic_fetch_add (&made[MT_K_MALLOC], 1);
  return mt_malloc (64 << 20);      /* far above anything tracked so far: a new peak */
}

static void *
logged_free_thread (void * p)
{
  atomic_fetch_add (&made[MT_K_FREE], 1);
  logged_free (p);
  return NULL;
}

/* Runs fn(arg) on a new thread; FALSE when it has not returned after `seconds`. */
static gboolean
run_bounded (void * (*fn) (void *), void * arg, int seconds, void ** result)
{
  pthread_t t;
  struct timespec deadline;
  clock_gettime (CLOCK_REALTIME, &deadline);
  deadline.tv_sec += seconds;
  pthread_create (&t, NULL, fn, arg);
  if (pthread_timedjoin_np (t, result, &deadline) != 0)
  {
    pthread_detach (t);
    return FALSE;
  }
  return TRUE;
}

static void
provoke_findings (void)
{
  gpointer big = NULL;

  /* slots_hw past the slot array (two threads raising it at once): every walk must stay inside. */
  guint64 hw = mt_probe_slots_hw ();
  mt_probe_set_slots_hw (N_SLOTS + 8);
  drain_once (0);
  (void) mt_busy_slots ();
  mt_probe_set_slots_hw ((gint) hw);

  /* The live table's keys and big blocks (probe.c). */
  if (mt_probe_live_keys () != 0)
    FAIL ("the live table's keys or big blocks (above)");

  /* A new high-water mark while another thread holds the peak's lock: the peak must still reach it. */
  if (mode == MODE_STACKED)
  {
    mt_probe_peak_lock (1);
    if (!run_bounded (big_alloc, NULL, 60, &big))
      FAIL ("raising the peak hung while another thread held its lock");
    mt_probe_peak_lock (-1);
    drain_once (0);
    check_peak ("a new high while the peak's lock was held");
    if (big != NULL)
      do_free (big);
  }

  /* The Darwin logger path with a live-table bucket whose lock is never let go (its holder did not
   * survive a fork): the event is skipped and counted, the thread not hung. */
  if (mode == MODE_LOGGER)
  {
    gpointer p = logged_malloc (5000);
    guint64 b = mt_probe_live_bucket ((guint64) (gsize) p);
    guint64 before[MT_N_COUNTERS], after[MT_N_COUNTERS];
    atomic_fetch_add (&made[MT_K_MALLOC], 1);
    mt_snapshot (before);
    mt_live_locks[b] += 1;
    if (!run_bounded (logged_free_thread, p, 60, NULL))
      FAIL ("a logger event spun without bound on a bucket lock nobody lets go");
    mt_live_locks[b] -= 1;
    mt_snapshot (after);
    if (after[MT_C_TABLE_BUSY] != before[MT_C_TABLE_BUSY] + 1)
      FAIL ("the skipped event was not counted as table_busy");
    /* the entry is still listed: the free the table missed, logged again, takes it out */
    mt_malloc_logger (LOG_DEALLOC | LOG_ZONE, 0, (guint64) (gsize) p, 0, 0, 0);
    atomic_fetch_add (&made[MT_K_FREE], 1);
  }
}

static void
configure (void)
{
  pthread_key_t key;
  if (mt_probe_n_slots () != N_SLOTS || mt_config_size () != sizeof (MtConfig))
  {
    fprintf (stderr, "harness: probe.c and harness.c disagree on the tables\n");
    exit (1);
  }
  pthread_key_create (&key, mt_thread_exit);
  mt_config.live_threshold = mode == MODE_SAMPLED ? 16384 : 0;
  mt_config.stack_threshold = mode == MODE_SAMPLED ? 65536 : 0;
  mt_config.max_frames = 32;
  mt_config.sample_interval = mode == MODE_SAMPLED ? 4096 : 0;
  mt_config.ring_size = RING_SIZE;
  mt_config.n_slots = N_SLOTS;
  mt_config.n_rings = mode == MODE_EVENTS ? N_RINGS : 0;
  mt_config.stack_mask = STACK_SLOTS - 1;
  mt_config.live_mask = LIVE_BUCKETS - 1;
  mt_config.live_bits = LIVE_BUCKET_BITS;
  mt_config.code_mask = ~0ULL;
  mt_config.tls_key = key;
  mt_config.gettid_nr = SYS_gettid;
  mt_config.agg_lanes = LANES;
  mt_config.events = mode == MODE_EVENTS;
  mt_config.defs_size = DEFS_BYTES;
  mt_config.track_min = mode == MODE_SAMPLED ? 0 : 0;
  mt_config.chunk_min = 0;
  mt_block_size = h_block_size;
  mt_config.enabled = 1;
}

int
main (int argc, char ** argv)
{
  pthread_t drain_thread, signal_thread;
  struct sigaction sa;
  guint64 counted[MT_N_COUNTERS];
  guint64 calls = 0, made_total = 0;
  long i;

  if (argc < 2)
  {
    fprintf (stderr, "usage: harness stacked|sampled|events|logger [iterations]\n");
    return 2;
  }
  mode = !strcmp (argv[1], "sampled") ? MODE_SAMPLED : !strcmp (argv[1], "events") ? MODE_EVENTS
       : !strcmp (argv[1], "logger") ? MODE_LOGGER : MODE_STACKED;
  if (argc > 2)
    iterations = atol (argv[2]);
  configure ();

  memset (&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigaction (SIGUSR1, &sa, NULL);

  pthread_create (&drain_thread, NULL, drainer, NULL);
  for (i = 0; i != N_WORKERS; i++)
    pthread_create (&workers[i], NULL, worker, (void *) i);
  pthread_create (&signal_thread, NULL, signaller, NULL);
  for (i = 0; i != N_WORKERS; i++)
    while (!atomic_load (&worker_done[i]))
      usleep (1000);
  atomic_store (&stop_signals, 1);
  pthread_join (signal_thread, NULL);
  for (i = 0; i != N_WORKERS; i++)
    pthread_join (workers[i], NULL);
  atomic_store (&stop_drain, 1);
  pthread_join (drain_thread, NULL);

  drain_once (0);
  check_peak ("after the workload");
  provoke_findings ();

  /* The window's end: hooks off, the final drain (rows, the peak's composition, the live table). */
  mt_config.enabled = 0;
  drain_once (1);

  mt_snapshot (counted);
  for (i = 0; i != MT_N_KINDS; i++)
  {
    guint64 m = atomic_load (&made[i]);
    guint64 c = counted[MT_C_CALLS + i];
    made_total += m;
    calls += c;
  }
  if (calls + mt_lost_calls () != made_total)
    FAIL ("%llu calls made, %llu counted and %llu without a slot", (unsigned long long) made_total,
          (unsigned long long) calls, (unsigned long long) mt_lost_calls ());
  for (i = 0; i != MT_N_KINDS && mt_lost_calls () == 0; i++)
    if (counted[MT_C_CALLS + i] != atomic_load (&made[i]))
      FAIL ("kind %ld: %llu calls made, %llu counted", i, (unsigned long long) atomic_load (&made[i]),
            (unsigned long long) counted[MT_C_CALLS + i]);
  /* Every block was freed.  The logger path skips a signal handler's event whose bucket the call it
   * interrupted held, and says so (nested_table_busy): such a block of the handler's stays listed. */
  if (mode != MODE_SAMPLED && mt_live_occupied () > counted[MT_C_NESTED_TABLE_BUSY])
    FAIL ("%llu entries left in the live table after every block was freed (%llu events skipped)",
          (unsigned long long) mt_live_occupied (), (unsigned long long) counted[MT_C_NESTED_TABLE_BUSY]);
  if (mode != MODE_SAMPLED && mt_drain_info.tracked_bytes != 1000 * mt_live_occupied ())
    FAIL ("%llu tracked bytes left after every block was freed", (unsigned long long) mt_drain_info.tracked_bytes);
  {
    guint64 gen, bad = mt_probe_index_check (&gen);
    if (bad != 0)
      FAIL ("the stack index lost or misplaced stack %llu", (unsigned long long) (bad - 1));
    if (mode == MODE_STACKED && gen < 3)
      FAIL ("the stack index never grew (generation %llu): the growth went untested", (unsigned long long) gen);
  }
  printf ("harness %s: %llu calls, %llu counted, peak %llu B, %d failures\n", argv[1],
          (unsigned long long) made_total, (unsigned long long) calls,
          (unsigned long long) mt_drain_info.peak_bytes, atomic_load (&failures));
  return atomic_load (&failures) == 0 ? 0 : 1;
}
