/*
 * memtrace agent core: per-thread slots, stack interning, the live-pointer table, per-stack
 * aggregates (with the peak and temporary allocations) and the drain that the agent's
 * JavaScript calls on a timer.  Compiled by Frida's CModule (TinyCC, or the external gcc
 * toolchain on Linux), so: no libc headers, no static writable data (every writable global is
 * an extern symbol the agent allocates), and under TinyCC only g_atomic_int_add /
 * g_atomic_pointer_add for atomics (gcc builds use the __atomic builtins, inline).
 *
 * The agent prepends "#define MT_DARWIN 1" or "#define MT_LINUX 1" and
 * "#define MT_ARM64 1" where relevant; memtrace.agentbuild puts the layout
 * header generated from memtrace/layout.py before this file: the record
 * structs (MtAllocRecord, MtFreeRecord, MtStackRecord, MtPadRecord, MtAggRecord,
 * MtPeakHeadRecord, MtPeakRecord, MtLiveRecord, MtChunkHeader), MtConfig, MtLiveMeta,
 * MtDrainInfo, MtSite, MT_REC_*, MT_FLAG_*, MT_K_* call kinds, MT_C_* counter indexes,
 * MT_A_* aggregate fields, MT_TIER_MAX_*, MT_MAX_FRAMES, MT_LIVE_WAYS, MT_MAX_RINGS.
 * memtrace/capture.py reads the records with the same layout.
 *
 * What is kept where:
 *   - every call: per-thread counters (kind, bytes, size tier), exact, no atomics;
 *   - every "tracked" block (one with a stack, or at least the live threshold): an entry in
 *     the live table (address -> size, stack, birth tick), so that its free finds its stack;
 *   - every stack: aggregate rows (allocations, frees, live, temporaries, sampled weights),
 *     one row per lane so that threads running at once seldom share a cache line;
 *   - the bytes in tracked blocks and their high-water mark (the peak), with each row's value
 *     at the peak (see "the peak" in track.c).
 * This file: the shared state, slots, the events ring, stacks, the live table.  track.c: rows,
 * peak, what a hooked call does; drain.c: the host's side.  The drain ships the stack definitions, the rows changed since the last drain (their running
 * totals), the composition at the peak when it moved, and at the end the live table.  With
 * MtConfig.events set it also streams one record per tracked event through per-thread rings,
 * as before the aggregates existed.
 *
 * A drained batch is a sequence of chunks: MtChunkHeader, then records (tid 0: the core's own
 * records; otherwise one thread's events).  STACK records are followed by u64 frames[nframes],
 * STACK_TAIL records by their inner frames (the host makes them STACK records: mt_def_shared), AGG
 * records by u64 values[nvalues]; a PAD record says how many bytes to skip.
 */
#include <glib.h>
#include <gum/guminterceptor.h>

#define MT_SLOT_FREE 0
#define MT_SLOT_LIVE 1
#define MT_SLOT_DEAD 2

/* What the thread's slot is doing (MtSlot.busy); a hooked call that finds it non-zero is nested:
 * made by a signal handler, by the allocator inside one of its own entries, or by memtrace. */
#define MT_BUSY_OWN 1        /* mt_assign's set-up, and Frida's threads for good: their calls are not the target's */
#define MT_BUSY_HOOK 2       /* inside a hook: a nested call is a signal handler's, counted */
#define MT_BUSY_COMPOUND 3   /* inside the real call of an entry that may call the family itself */
#define MT_BUSY_SHARED 4     /* the shared slot (mt_slots[n_slots]): for good, see mt_shared_slot */

/* Slots and shared groups start on their own cache line: a thread's counters never share one with
 * another thread's slot. */
#ifdef __TINYC__
# define MT_LINE_ALIGNED
#else
# define MT_LINE_ALIGNED __attribute__ ((aligned (64)))
#endif

/* Aggregate lanes at most (the agent sizes agg_lanes, a power of two, up to this). */

typedef struct _MtSlot MtSlot;
typedef struct _MtGlobals MtGlobals;
typedef struct _MtCore MtCore;
typedef struct _MtNested MtNested;

/* A nested call made while the thread was inside a compound entry's real call, kept until the
 * entry returns and can tell its allocator's own calls from a signal handler's. */
struct _MtNested
{
  guint64 kind;
  guint64 ptr;          /* the block it returned (allocations) */
  guint64 old_ptr;      /* the block it released (free, realloc) */
  guint64 size;
};

struct _MtSlot
{
  volatile gint claim;
  volatile gint state;
  volatile gint busy;
  volatile gint has_ring;       /* read by the drain (mt_drain_rings) once the state is published */
  /* The aggregate lane this thread adds to (lane-major rows, track.c): its own while lanes last
   * (plain adds), else shared with other threads by slot index (atomic adds). */
  gint lane;
  gint lane_shared;
  guint64 tid;
  guint64 stack_lo;
  guint64 stack_hi;
  gint64 countdown;
  guint64 rng;
  guint8 * ring;
  volatile guint64 head;
  volatile guint64 tail;
  guint64 counters[MT_N_COUNTERS];
  /* Nested calls' counts: added atomically, since a signal handler's call may interrupt the
   * thread halfway through a plain update of `counters`. */
  volatile guint64 ncount[MT_N_COUNTERS];
  guint64 last_ptr;     /* the thread's latest allocation: a free of it is a temporary */
  guint64 last_size;
  gssize nested_seq;          /* added to atomically (a signal handler may add) */
  MtNested nested[MT_NESTED_LOG];
#ifdef MT_UNWIND
  MtUnwindCache ucache;       /* the walk's rules by return address (unwind.c) */
#endif
  /* Bytes this thread freed that tracked_bytes does not yet show (mt_tracked_add_own): at most
   * MT_TRACKED_CREDIT_MAX, written by the thread alone outside any nested call; read by the drain
   * (relaxed loads and stores, mt_credit_*).  Last, so that the hot fields above keep the offsets
   * they were measured with. */
  volatile gint64 tracked_credit;
} MT_LINE_ALIGNED;

struct _MtGlobals
{
  volatile gint stack_lock;
  volatile gint rings_claimed;
  volatile gint slots_hw;          /* high-water mark of slot indices used */
  volatile gint slots_hw_lock;
  volatile gint ring_free_lock;
  volatile gssize lost_calls;      /* calls with no slot at all (thread table full) */
  volatile gssize live_count;
  volatile gssize stacks_interned;
  guint64 retired[MT_N_COUNTERS];  /* counters folded in from exited threads */
  volatile guint64 assigning[64];  /* stack addresses of threads inside mt_assign */
  volatile gint assigning_claim[64];
  volatile gint ring_owner_free[MT_MAX_RINGS]; /* recycled ring indices, -1 terminated stack */
  volatile gint ring_free_top;
  volatile gint fence;
  volatile gint lane_claim[MT_MAX_LANES];   /* 1: the lane belongs to one live thread */
  /* Lanes [0, lanes_hw) may hold counts (never less; a race may leave it past the highest lane used,
   * which costs the drain a lane of zeros, nothing else): the drain sums only those, where summing
   * every lane of every changed row cost a single-threaded program 8 cache lines (and pages) a row. */
  volatile gint lanes_hw;
  /* The live table's blocks of 4 GiB or more (core.c, mt_live_big_add): (address, size) pairs, size 0
   * for a free pair, under big_lock. */
  volatile gint big_lock;
  volatile guint64 live_big[2 * MT_LIVE_BIG_BLOCKS];
  /* The last stack defined (under stack_lock, mt_intern_hashed): its id, its frame count and its
   * frames right-aligned (its outermost at last_def[MT_MAX_FRAMES - 1]), so that the next
   * definition finds the outer frames they share where they are, and rewrites only the rest. */
  guint64 last_def_id;
  guint64 last_def_n;
  guint64 last_def_epoch;          /* mt_core.defs_epoch when it was defined */
  guint64 last_def[MT_MAX_FRAMES];
};

/* The aggregate core's shared state, each group on its own cache line. */
struct _MtCore
{
  /* written by every tracked allocation and free */
  volatile gint64 tracked_bytes;
  guint64 pad0[7];
  /* read on every row change, written when the peak moves */
  volatile guint64 peak_epoch;
  volatile guint64 peak_bytes;
  volatile gint peak_lock;         /* TinyCC only (gcc raises the peak with a compare-and-swap) */
  gint pad1a;
  guint64 pad1[5];
  /* read by every tracked allocation (the block's birth), written by the drain */
  volatile guint64 tick;
  /* solo mode (above): its state (MT_SOLO_*), read by every tracked allocation and free (not on
   * tracked_bytes' line: with several threads that line is theirs to fight over), the solo thread's
   * slot index + 1, and how many of the target's threads were ever given a slot of their own */
  volatile guint64 solo;
  volatile guint64 solo_slot;
  volatile guint64 target_slots;
  guint64 pad2[4];
  /* stack definitions: produced under mt_globals.stack_lock, consumed by the drain */
  volatile guint64 defs_head;
  volatile guint64 defs_tail;
  volatile guint64 n_stacks;       /* stacks interned: ids 0 .. n_stacks - 1 */
  volatile gint sites_lock;
  gint pad3a;
  volatile guint64 n_sites;        /* entries of mt_sites in use */
  volatile guint64 index_gen;      /* the stack index's generation: its current size (mt_index_entries) */
  volatile guint64 defs_stalled;   /* defs_tail + 1 when a wait for the drain gave up (mt_defs_wait) */
  volatile guint64 stack_unlocks;  /* times the stack lock was let go of (by its holder) */
  volatile guint64 stack_stalled;  /* stack_unlocks + 1 when a patient wait for it gave up */
  volatile guint64 any_cold;       /* some row had a cold add (mt_agg_cold_rows is worth reading) */
  volatile guint64 defs_epoch;     /* drains so far: a STACK_TAIL never names a stack of an earlier one */
  /* the drain's own */
  guint64 shipped_epoch;
  guint64 composition_us;          /* when the last composition was shipped */
  gint64 live_blocks;              /* tracked blocks, from the shipped rows */
  guint64 live_cursor;             /* the final drain's walk through the live table */
  guint64 live_done;
  guint64 live_dumped;
  /* When the peak was reached, placed by the drains (drain.c, mt_place_peak): no clock is read where
   * it is raised. */
  guint64 peak_seen_bytes;         /* the peak bytes the agent last looked at */
  guint64 peak_us;                 /* the middle of the interval between two looks they were reached in */
  guint64 peak_seen_us;            /* when it last looked */
  guint64 pagemap_fd1;             /* /proc/self/pagemap's fd + 1 for the final live walk (0: none) */
  guint64 page_size;
  guint64 shipped_rows;            /* 1 + the stack rows of mt_agg_shipped and mt_agg_live written (drain.c) */
  guint64 rows_swept;              /* the final drain marked every row dirty (mt_sweep_rows) */
};

extern MtConfig mt_config;
extern MtGlobals mt_globals;
extern MtCore mt_core;
extern MtSlot mt_slots[];
extern guint8 mt_ring_pool[];
/* The stack index: (hash, id) u64 pairs, grown by doubling (mt_intern); ids are dense, in interning
 * order (0, 1, 2 ...), so a stack's aggregate rows are packed, whatever its hash.  The agent reserves
 * 4 * (stack_mask + 1) pairs: every generation's table, one after the other (mt_index_table). */
extern volatile guint64 mt_stack_table[];
extern guint8 mt_defs[];                      /* STACK and STACK_TAIL records (and the logger path's VM
                                               * events), a ring of defs_size bytes */
/* The live table: bucket b is MT_LIVE_WAYS MtLiveEntry (12 bytes each: a compressed key, the block's
 * size, its stack id and sampling multiplier), two cache lines at most at mt_live_table + b *
 * MT_LIVE_BUCKET_BYTES ("the live-pointer table", below). */
extern guint8 mt_live_table[];
extern volatile gint mt_live_locks[];
/* Per bucket: 1 once the bucket, full, sent a block to one of its alternates (mt_live_alt); a miss in
 * a bucket reads its alternates only then.  Never cleared. */
extern volatile guint8 mt_live_spill[];
/* (stack slots + MT_N_PSEUDO_STACKS) rows x agg_lanes lanes x MT_AGG_HOT counters (layout.py, AGG_HOT) */
extern volatile guint64 mt_agg[];
/* The same rows' cold fields (MT_AGG_COLD each, field f at f - MT_AGG_HOT), and a byte per row: 0 none
 * ever added, 1 some added (the drain reads the row's cold lanes), 2 read, its shipped copy written. */
extern volatile guint64 mt_agg_cold[];
extern volatile guint8 mt_agg_cold_rows[];
extern volatile guint8 mt_agg_dirty[];        /* per row: changed since the drain last looked */
extern guint64 mt_agg_shipped[];              /* per row: its hot fields' totals last shipped (drain only) */
extern guint64 mt_agg_shipped_cold[];         /* per row: its cold fields' (written once the row has any) */
extern gint64 mt_agg_live[];                  /* per row: its live bytes as last shipped (drain only) */
extern MtDrainInfo mt_drain_info;
extern guint64 mt_top[];                      /* 2 * MT_TOP_STACKS: (stack id, live bytes) */
extern MtSite mt_sites[];                     /* MT_N_SITES call sites of aliased entries */
/* Kinds whose entry Frida could only redirect through a trampoline (Interceptor.replace):
 * there the caller's return address is off the frame-pointer chain; the invocation has it. */
extern volatile guint64 mt_slow_kinds;
/* Kinds whose entry point several names share (glibc: memalign is aligned_alloc too): their
 * call sites are recorded so that the agent can tell the names apart. */
extern volatile guint64 mt_alias_kinds;
/* Linux x86-64 glibc: byte offset of our key's value inside struct pthread, found by the
 * agent at start-up (0 = unknown: use pthread_getspecific).  Reading it through %fs saves
 * the call that was the single largest cost of an uninteresting malloc/free. */
extern volatile guint64 mt_tls_offset;
/* Frida's own threads, told apart when a thread gets its slot (mt_own_thread; layout.py, OWN_*). */
extern volatile guint64 mt_own_threads[];

extern gpointer pthread_getspecific (guint key);
extern gint pthread_setspecific (guint key, gconstpointer value);
extern gpointer pthread_self (void);
extern gint sched_yield (void);
#ifdef MT_DARWIN
extern gpointer pthread_get_stackaddr_np (gpointer thread);
extern gsize pthread_get_stacksize_np (gpointer thread);
extern guint pthread_mach_thread_np (gpointer thread);
#else
extern gint pthread_getattr_np (gpointer thread, gpointer attr);
/* [lo, hi) of the main thread's stack and the main thread's id (the process id), or zeros. */
extern volatile guint64 mt_main_stack[3];
/* glibc's main arena and the offset of a thread's arena pointer from pthread_self(), or zeros
 * (agents/runtime/core.js, mainArenaCell). */
extern volatile guint64 mt_main_arena[2];
extern gint pthread_attr_getstack (gpointer attr, gpointer * addr, gsize * size);
extern gint pthread_attr_destroy (gpointer attr);
extern glong syscall (glong number, ...);
#endif

#ifndef G_UNLIKELY
# ifdef __TINYC__
#  define G_LIKELY(x) (x)
#  define G_UNLIKELY(x) (x)
# else
#  define G_LIKELY(x) __builtin_expect (!!(x), 1)
#  define G_UNLIKELY(x) __builtin_expect (!!(x), 0)
# endif
#endif

/* Atomics.  TinyCC has only glib's (calls); gcc inlines the builtins.  Every read-modify-write
 * is sequentially consistent, so a row's snapshot (stored first) is visible before the change
 * that follows it on every architecture. */
#ifdef __TINYC__
# define MT_ADD64(p, v) ((guint64) g_atomic_pointer_add ((p), (gssize) (v)))
# define MT_ADD32(p, v) g_atomic_int_add ((p), (v))
# define MT_COMPILER_BARRIER() do { } while (0)
#else
# define MT_ADD64(p, v) __atomic_fetch_add ((p), (guint64) (v), __ATOMIC_SEQ_CST)
# define MT_ADD32(p, v) __atomic_fetch_add ((p), (v), __ATOMIC_SEQ_CST)
# define MT_COMPILER_BARRIER() __asm__ __volatile__ ("" ::: "memory")
#endif

/* Solo mode (x86-64 Linux, gcc; MtCore.solo).  While only one of the target's threads has ever had a slot, the
 * read-modify-writes every tracked allocation and free makes on shared state -- the live table's
 * compare-and-swap, tracked bytes, the peak -- are made without the lock prefix: one instruction
 * each, still whole against a signal handler on the same thread, but no longer a full barrier that
 * waits for every store before it (the `lock xadd` on tracked bytes alone was ~2.5 % of CPython's
 * time under the default capture).  A second thread ends it for good, before its own first tracked
 * call: it marks solo mode over, makes every thread of the process pass a full barrier
 * (membarrier(2), private expedited: the solo thread pays nothing for it), then waits until the solo
 * thread is outside its tracking work -- which it marks in its slot's `busy` before reading the mode.
 * Either the solo thread read the mode after the barrier (and sees it over) or it is inside tracking
 * work the waiter sees and waits out, its lock-free writes then visible to all (x86 keeps stores in
 * order).  Without membarrier (an old kernel, a seccomp filter) solo mode never starts. */
#if defined(MT_LINUX) && defined(__x86_64__) && !defined(__TINYC__)
# define MT_SOLO 1
#else
# define MT_SOLO 0
#endif
#define MT_SOLO_NOT_YET 0
#define MT_SOLO_ON 1
#define MT_SOLO_OVER 2
#define MT_NR_MEMBARRIER 324                    /* x86-64 */
#define MT_MEMBARRIER_GLOBAL 1
#define MT_MEMBARRIER_PRIVATE_EXPEDITED 8
#define MT_MEMBARRIER_REGISTER_PRIVATE_EXPEDITED 16

#if MT_SOLO
/* *p += v in one instruction, no lock prefix: the old value. */
static inline guint64
mt_xadd_solo (volatile guint64 * p, guint64 v)
{
  __asm__ __volatile__ ("xaddq %0, %1" : "+r" (v), "+m" (*p) : : "memory");
  return v;
}

/* Compare-and-swap in one instruction, no lock prefix. */
static inline gboolean
mt_cas_solo (volatile guint64 * p, guint64 expected, guint64 desired)
{
  guint64 prev = expected;
  __asm__ __volatile__ ("cmpxchgq %2, %1" : "+a" (prev), "+m" (*p) : "r" (desired) : "memory", "cc");
  return prev == expected;
}

/* The same on 32 bits (a live-table key). */
static inline gboolean
mt_cas_solo32 (volatile guint32 * p, guint32 expected, guint32 desired)
{
  guint32 prev = expected;
  __asm__ __volatile__ ("cmpxchgl %2, %1" : "+a" (prev), "+m" (*p) : "r" (desired) : "memory", "cc");
  return prev == expected;
}
#endif

/* Kept out of its callers' code (a rare path out of a hot one). */
#ifdef __TINYC__
# define MT_NOINLINE
#else
# define MT_NOINLINE __attribute__ ((noinline))
#endif

/* A hint that a line will be read (or written) soon, so that two cache misses run side by side
 * instead of one after the other; never faults.  Nothing under TinyCC. */
#ifdef __TINYC__
# define MT_PREFETCH(p) do { } while (0)
# define MT_PREFETCH_W(p) do { } while (0)
#else
# define MT_PREFETCH(p) __builtin_prefetch ((const void *) (p), 0, 3)
# define MT_PREFETCH_W(p) __builtin_prefetch ((const void *) (p), 1, 3)
#endif

/* Where a signal handler cannot tear a counter update in two (x86-64 with gcc: one `add` to
 * memory), malloc's and free's hot paths leave the slot unmarked: a handler's call made meanwhile
 * is an outermost call like any other, and marking the slot twice per call was the largest cost
 * of an untracked malloc/free.  The tracking path (stack table, live table, rows, events ring)
 * always marks it.  Elsewhere (TinyCC, arm64) every hook marks the slot for its whole call. */
#if defined(__x86_64__) && !defined(__TINYC__)
# define MT_LIGHT_HOOKS 1
static inline void
mt_bump (guint64 * p, guint64 v)
{
  __asm__ __volatile__ ("addq %1, %0" : "+m" (*p) : "er" (v));
}

/* The same for a fetch-and-add: one `xadd`, without the lock prefix only another thread needs. */
static inline guint64
mt_bump_fetch (guint64 * p, guint64 v)
{
  __asm__ __volatile__ ("xaddq %0, %1" : "+r" (v), "+m" (*p));
  return v;
}
#else
# define MT_LIGHT_HOOKS 0
# define mt_bump(p, v) (*(p) += (v))
#endif

static gint64 mt_next_gap (MtSlot * s);

#define MT_CFG (&mt_config)
#define MT_G (&mt_globals)

/* A full fence, ordering plain loads and stores on both sides (the drain's snapshot protocol).
 * glib's atomic add is an acquire-release read-modify-write: on x86 a locked instruction, a full
 * fence; on arm64 it orders only around its own location.  TinyCC's arm64 backend has no inline
 * assembler, so there the agent passes a function that is one `dmb ish` (libSystem's
 * OSMemoryBarrier on Darwin; runtime/core.js).  DEVICE-UNVERIFIED on arm64. */
#if defined (__TINYC__) && defined (MT_ARM64)
extern void mt_full_fence (void);
#endif

static inline void
mt_barrier (void)
{
#if defined (MT_TSAN)
  /* The sanitizer harness (tests/native): an RMW of one word, which ThreadSanitizer can see. */
  __atomic_fetch_add (&mt_globals.fence, 0, __ATOMIC_SEQ_CST);
#elif !defined (__TINYC__)
  __atomic_thread_fence (__ATOMIC_SEQ_CST);
#elif defined (MT_ARM64)
  mt_full_fence ();
#else
  g_atomic_int_add (&mt_globals.fence, 0);
#endif
}

/* A store that earlier loads and stores may not pass (a row's snapshot before its epoch), of a word
 * of any size (a live-table key is 32 bits). */
#ifdef __TINYC__
# define MT_STORE_RELEASE(p, v) do { mt_barrier (); *(p) = (v); } while (0)
#else
# define MT_STORE_RELEASE(p, v) __atomic_store_n ((p), (v), __ATOMIC_RELEASE)
#endif

static inline void
mt_store_release (volatile guint64 * p, guint64 v)
{
  MT_STORE_RELEASE (p, v);
}

/* A load that later loads may not pass (the drain reads a row's counters, then its epoch). */
static inline guint64
mt_load_acquire (volatile guint64 * p)
{
#ifdef __TINYC__
  guint64 v = *p;
  mt_barrier ();
  return v;
#else
  return __atomic_load_n (p, __ATOMIC_ACQUIRE);
#endif
}

/* A thread's tracked-bytes credit (track.c, mt_tracked_add_own): its owner writes it, the drain
 * reads it; whole-word relaxed accesses (a plain `mov` on x86-64) that the sanitizers can see. */
static inline gint64
mt_credit_get (volatile gint64 * p)
{
#ifdef __TINYC__
  return *p;
#else
  return __atomic_load_n (p, __ATOMIC_RELAXED);
#endif
}

static inline void
mt_credit_set (volatile gint64 * p, gint64 v)
{
#ifdef __TINYC__
  *p = v;
#else
  __atomic_store_n (p, v, __ATOMIC_RELAXED);
#endif
}

static gboolean
mt_trylock (volatile gint * lock, guint spins)
{
  guint i;
  for (i = 0; i <= spins; i++)
  {
    if (g_atomic_int_add (lock, 1) == 0)
      return TRUE;
    g_atomic_int_add (lock, -1);
  }
  return FALSE;
}

static inline void
mt_unlock (volatile gint * lock)
{
  g_atomic_int_add (lock, -1);
}

/* A lock whose holder may be preempted (a 2-CPU machine with 4 busy threads): spin, then give
 * the CPU away, and give up after a bounded wait (the caller drops what it wanted and counts it). */
static gboolean
mt_lock_patiently (volatile gint * lock)
{
  guint i;
  if (mt_trylock (lock, 256))
    return TRUE;
  for (i = 0; i != 2000; i++)
  {
    sched_yield ();
    if (mt_trylock (lock, 16))
      return TRUE;
  }
  return FALSE;
}

/* The stack lock, taken patiently -- unless a patient wait already gave up and nobody has let go
 * of the lock since: then one short try.  Its holder may never let go (a thread that does not
 * exist in a fork child that allocates through the hooks before memtrace's atfork handler has put
 * libc's bytes back; a holder preempted for long on a loaded machine): without this every new
 * stack would wait the whole patience again -- a fork child allocating 200 new stacks hung for
 * minutes under ThreadSanitizer on a loaded machine (tests/native). */
static gboolean
mt_stack_lock (void)
{
  guint64 unlocks = mt_core.stack_unlocks;
  if (mt_core.stack_stalled == unlocks + 1)
    return mt_trylock (&mt_globals.stack_lock, 64);
  if (mt_lock_patiently (&mt_globals.stack_lock))
    return TRUE;
  mt_core.stack_stalled = unlocks + 1;
  return FALSE;
}

static inline void
mt_stack_unlock (void)
{
  mt_core.stack_unlocks++;      /* by the holder only: no other writer */
  mt_unlock (&mt_globals.stack_lock);
}

static inline guint
mt_tier (guint64 size)
{
  if (G_LIKELY (size <= MT_TIER_MAX_0)) return 0;
  if (size <= MT_TIER_MAX_1) return 1;
  if (size <= MT_TIER_MAX_2) return 2;
  if (size <= MT_TIER_MAX_3) return 3;
  if (size <= MT_TIER_MAX_4) return 4;
  return 5;
}

/* ---- per-thread slots ------------------------------------------------- */

static guint64
mt_current_tid (void)
{
#ifdef MT_DARWIN
  /* The thread's Mach port name: what Frida's Process.getCurrentThreadId() and its thread lists
   * report on Darwin, so the C records' thread ids and the JavaScript tracers' agree (and fit the
   * chunk header's u32, which pthread_threadid_np's 64-bit id does not).  DEVICE-UNVERIFIED. */
  return (guint64) pthread_mach_thread_np (pthread_self ());
#else
  return (guint64) syscall ((glong) mt_config.gettid_nr);
#endif
}

/* A thread's descriptor farther than this above its stack pointer is not taken as its stack's top. */
#define MT_THREAD_STACK_MAX (1ULL << 30)

static void
mt_fetch_stack_bounds (MtSlot * s)
{
#ifdef MT_DARWIN
  gpointer self = pthread_self ();
  guint64 hi = (guint64) pthread_get_stackaddr_np (self);
  s->stack_hi = hi;
  s->stack_lo = hi - (guint64) pthread_get_stacksize_np (self);
#else
  guint64 attr[16];
  gpointer addr = NULL;
  gsize size = 0;
  /* The main thread's bounds come from the agent (/proc/self/maps at start): glibc's
   * pthread_getattr_np reads that file with fopen -- malloc -- for the main thread, which a first
   * hooked call made from a signal handler (or inside fork's arena-locked window) must not do. */
  if (mt_main_stack[1] != 0 && s->tid == mt_main_stack[2])
  {
    s->stack_lo = mt_main_stack[0];
    s->stack_hi = mt_main_stack[1];
    return;
  }
  /* Any other thread pthread_create made has its descriptor (pthread_self ()) at the top of its
   * stack block, above its static TLS and every frame (glibc's allocatestack.c, for a stack the
   * caller gave too): a bound the walk can use, read with no lock.  pthread_getattr_np holds the
   * thread's own lock while it reallocs, so a thread whose first hooked call came from inside it
   * (a Rust thread's stack guard, Frida's loader thread injecting a second session) waited for
   * ever on that lock here.  Only a thread not laid out so (the main thread without the agent's
   * bounds, a stack above its descriptor) still asks pthread_getattr_np. */
  {
    guint64 self = (guint64) pthread_self (), here = (guint64) &self;
    if (self > here && self - here < MT_THREAD_STACK_MAX)
    {
      s->stack_lo = 0;             /* unknown, and unused: the walk starts at its own frame */
      s->stack_hi = self;
      return;
    }
  }
  if (pthread_getattr_np (pthread_self (), attr) == 0)
  {
    if (pthread_attr_getstack (attr, &addr, &size) == 0)
    {
      s->stack_lo = (guint64) addr;
      s->stack_hi = (guint64) addr + size;
    }
    pthread_attr_destroy (attr);
  }
#endif
}

static gint
mt_claim_ring (void)
{
  gint idx;
  if (mt_trylock (&mt_globals.ring_free_lock, 1000))
  {
    idx = -1;
    if (mt_globals.ring_free_top > 0)
    {
      mt_globals.ring_free_top--;
      idx = mt_globals.ring_owner_free[mt_globals.ring_free_top];
    }
    mt_unlock (&mt_globals.ring_free_lock);
    if (idx >= 0)
      return idx;
  }
  idx = g_atomic_int_add (&mt_globals.rings_claimed, 1);
  if ((guint64) idx >= mt_config.n_rings)
    return -1;
  return idx;
}

/* Raises slots_hw to at least hw, under its own lock: two threads claiming slots at once can
 * neither lower it nor push it past the slots actually claimed (an add of a stale difference
 * did both).  Once per thread, so the lock costs nothing that matters. */
static void
mt_raise_slots_hw (gint hw)
{
  while (!mt_trylock (&mt_globals.slots_hw_lock, 4096))
    sched_yield ();
  if (mt_globals.slots_hw < hw)
    mt_globals.slots_hw = hw;
  mt_unlock (&mt_globals.slots_hw_lock);
}

/* Lane l is used from now on: lanes_hw covers it before the thread adds to it.  No compare-and-swap
 * (TinyCC has none): atomic increments until it covers l, so it never ends short of l + 1 (two
 * threads raising it at once may take it past: harmless). */
static void
mt_lane_seen (gint l)
{
  while (MT_ADD32 (&mt_globals.lanes_hw, 0) <= l)
    MT_ADD32 (&mt_globals.lanes_hw, 1);
}

/* The lanes threads share (atomically): the last quarter of them (at least one), never a lane a
 * thread owns.  An owner adds to its lane without a lock prefix, a load and a store: a sharer's
 * locked add landing between them was lost -- with more threads than lanes, a stack's counts
 * drifted (the native harness read -4 live blocks after every block was freed). */
static inline guint64
mt_shared_lanes (void)
{
  guint64 lanes = mt_config.agg_lanes;
  return lanes >= 4 ? lanes / 4 : 1;
}

static inline gint
mt_shared_lane (guint slot_index)
{
  guint64 shared = mt_shared_lanes ();
  return (gint) (mt_config.agg_lanes - shared + (slot_index & (shared - 1)));
}

/* A lane of the aggregate rows of the thread's own, while there are free ones: its adds then need
 * no lock prefix (track.c, mt_lane_add).  Otherwise it shares one of the shared lanes with
 * other threads, atomically.  The drain gives the lane back when it retires the slot. */
static void
mt_claim_lane (MtSlot * s, guint slot_index)
{
  guint64 l, lanes = mt_config.agg_lanes - mt_shared_lanes ();
  for (l = 0; l != lanes && l != MT_MAX_LANES; l++)
  {
    if (mt_globals.lane_claim[l] == 0 && g_atomic_int_add (&mt_globals.lane_claim[l], 1) == 0)
    {
      s->lane = (gint) l;
      s->lane_shared = 0;
      mt_lane_seen (s->lane);
      return;
    }
  }
  s->lane = mt_shared_lane (slot_index);
  s->lane_shared = 1;
  mt_lane_seen (s->lane);
}

/* The slot of threads that found none of their own (every one taken by a live thread, or 64
 * threads assigning at once): mt_slots[n_slots], marked MT_BUSY_SHARED for good, so that every
 * call through it takes the nested path: counted exactly by kind, bytes and tier (atomically, in
 * its ncount), counted again as unslotted_calls, its releases applied to the live table, its
 * blocks tracked under DROPPED_STACK (counted in dropped_stacks: no stack walk without a thread
 * of its own to bound it).  Thread capacity therefore has no silent ceiling: past it, calls lose
 * their stacks and temporaries and say so, never their counts. */
static MtSlot *
mt_shared_slot (void)
{
  MtSlot * s = &mt_slots[mt_config.n_slots];
  if (s->busy != MT_BUSY_SHARED)
  {
    s->lane = mt_shared_lane (0);
    s->lane_shared = 1;
    mt_lane_seen (s->lane);
    s->state = MT_SLOT_LIVE;
    mt_barrier ();
    s->busy = MT_BUSY_SHARED;
  }
  return s;
}

/* Whether the calling thread is Frida's own (the agent's JavaScript thread, its loader and main
 * loop, GLib's pool workers): its calls are then memtrace's, never the target's.  Frida's threads
 * allocate with the target's malloc too (the DTV of a thread they start, their libc calls), and a
 * GLib pool worker idle for 15 s exits, its glibc freeing its tcache's blocks (6 and 12 free calls
 * in a program that never calls free, counted as the program's).  Two signs, both set before the
 * hooks go in: the thread ids Frida cloaked then, and (glibc) a start routine inside Frida's code,
 * for the threads Frida starts afterwards.  glibc's exiting thread calls its key's destructor
 * before freeing its tcache, so such a thread is asked again for the slot it gets then. */
static gboolean
mt_own_thread (guint64 tid)
{
  volatile guint64 * own = mt_own_threads;
  guint64 i, n;
#ifndef MT_DARWIN
  guint64 off = own[MT_OWN_START_OFFSET];
  guint64 self = (guint64) pthread_self ();
# ifdef __x86_64__
  /* glibc's descriptor starts with its TCB header, whose first word points to itself: a thread
   * whose %fs is something else's (a runtime's own TLS) is not read through. */
  gboolean descriptor = self != 0 && *(volatile guint64 *) self == self;
# else
  gboolean descriptor = self != 0;
# endif
  if (off != 0 && descriptor)
  {
    guint64 start = *(volatile guint64 *) (self + off);
    n = MIN (own[MT_OWN_N_CODE], MT_OWN_CODE_RANGES);
    for (i = 0; i != n; i++)
    {
      if (start >= own[MT_OWN_CODE + 2 * i] && start < own[MT_OWN_CODE + 2 * i + 1])
        return TRUE;
    }
  }
#endif
  n = MIN (own[MT_OWN_N_TIDS], MT_OWN_TIDS);
  for (i = 0; i != n; i++)
  {
    if (own[MT_OWN_TID + i] == tid)
      return TRUE;
  }
  return FALSE;
}

/* Solo mode (above): the target's thread just given slot i.  The first one starts solo mode, once
 * its process is registered for membarrier; any other ends it. */
static gboolean mt_solo_end (void);
static inline void mt_ncount (MtSlot * s, guint index, guint64 v);

static void
mt_solo_joined (guint i)
{
#if MT_SOLO
  guint64 expected = MT_SOLO_NOT_YET;
  if (__atomic_add_fetch (&mt_core.target_slots, 1, __ATOMIC_SEQ_CST) != 1)
  {
    if (mt_solo_end ())
      mt_slots[i].counters[MT_C_SOLO_ENDED]++;
    return;
  }
  if (syscall (MT_NR_MEMBARRIER, MT_MEMBARRIER_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0)
    return;
  mt_core.solo_slot = (guint64) i + 1;
  /* (A second thread that ended it meanwhile left it OVER: then it stays over.) */
  if (__atomic_compare_exchange_n (&mt_core.solo, &expected, MT_SOLO_ON, FALSE, __ATOMIC_SEQ_CST,
      __ATOMIC_SEQ_CST))
    mt_slots[i].counters[MT_C_SOLO_STARTED]++;
#else
  (void) i;
#endif
}

/* Ends solo mode for good, before the calling thread's first tracked call: TRUE when it was on. */
static gboolean
mt_solo_end (void)
{
#if MT_SOLO
  MtSlot * solo;
  if (mt_core.solo == MT_SOLO_OVER
      || __atomic_exchange_n (&mt_core.solo, MT_SOLO_OVER, __ATOMIC_SEQ_CST) != MT_SOLO_ON)
    return FALSE;
  /* Private expedited where registered (a fork child inherits the mode, not the registration: the
   * global barrier then, slower, no registration needed). */
  if (syscall (MT_NR_MEMBARRIER, MT_MEMBARRIER_PRIVATE_EXPEDITED, 0, 0) != 0)
    syscall (MT_NR_MEMBARRIER, MT_MEMBARRIER_GLOBAL, 0, 0);
  solo = &mt_slots[mt_core.solo_slot - 1];
  while (solo->state == MT_SLOT_LIVE && solo->busy != 0 && solo->busy != MT_BUSY_OWN)
    sched_yield ();
  return TRUE;
#else
  return FALSE;
#endif
}

#ifndef MT_DARWIN
/* The thread that loaded the agent made the process's first call into malloc, so glibc gave it
 * the main arena, and it ended without handing the arena back; the program's main thread would get
 * an arena of its own on its first call -- an mmap'd heap grown a page at a time by mprotect (3,106
 * calls in the C++ bench program), a heap it never has without memtrace.  Its first call comes here
 * before the C library sees it, and the main thread is handed the main arena, as natively.  A
 * thread that already has an arena (a process attached to, a fork child) keeps it. */
static void
mt_adopt_main_arena (void)
{
  guint64 arena = mt_main_arena[0];
  gpointer volatile * mine;
  if (G_LIKELY (arena == 0) || mt_main_stack[2] == 0 || mt_current_tid () != mt_main_stack[2])
    return;
  mt_main_arena[0] = 0;
  mine = (gpointer volatile *) ((guint64) pthread_self () + mt_main_arena[1]);
  if (*mine == NULL)
    *mine = (gpointer) arena;
}
#endif

/* Called when pthread_getspecific() gave NULL.  pthread_setspecific may itself
 * allocate (glibc, keys >= 32): a nested call on this thread finds its stack
 * address registered in `assigning` and passes straight through. */
static MtSlot *
mt_assign (void)
{
  guint64 here = (guint64) &here;
  guint i, tries, marker = 64;
  MtSlot * s = NULL;
  gint ring;

  for (i = 0; i != 64; i++)
  {
    guint64 a = mt_globals.assigning[i];
    if (a != 0 && here <= a && a - here < 65536)
      return NULL;
  }
#ifndef MT_DARWIN
  mt_adopt_main_arena ();   /* before anything here can call malloc (pthread_setspecific may) */
#endif
  /* 64 threads assigning at once is rare: retry a bounded number of times (a marker
   * left claimed by a thread that does not exist, in a fork child, must not hang us),
   * then this call goes through the shared slot (counted, its stack dropped).  Thousands of
   * threads starting at once on a few CPUs can keep all 64 markers held by threads that are not
   * running: the CPU is given away between rounds, so that they can finish. */
  for (tries = 0; marker == 64 && tries != 4096; tries++)
  {
    if (tries != 0)
      sched_yield ();
    for (i = 0; i != 64; i++)
    {
      if (g_atomic_int_add (&mt_globals.assigning_claim[i], 1) == 0)
      {
        mt_globals.assigning[i] = here;
        marker = i;
        break;
      }
      g_atomic_int_add (&mt_globals.assigning_claim[i], -1);
    }
  }
  if (marker == 64)
    return mt_shared_slot ();   /* this call only: the thread tries for a slot of its own again */
  mt_barrier ();

  for (i = 0; i != mt_config.n_slots; i++)
  {
    MtSlot * c = &mt_slots[i];
    if (c->claim != 0)
      continue;
    if (g_atomic_int_add (&c->claim, 1) == 0)
    {
      s = c;
      mt_raise_slots_hw ((gint) i + 1);
      break;
    }
    g_atomic_int_add (&c->claim, -1);
  }

  if (s != NULL)
  {
    guint j;
    gboolean own;
    for (j = 0; j != MT_N_COUNTERS; j++)
      s->counters[j] = 0;
    s->busy = 1;
    s->head = 0;
    s->tail = 0;
    ring = mt_claim_ring ();
    s->has_ring = ring >= 0;
#ifdef MT_UNWIND
    s->ucache.gen = ~(guint64) 0;   /* a reused slot's rules may be another registry's: emptied first */
    if (mt_frame_cache_on != 0)
    {
      MtFrameCache * fc = (MtFrameCache *) (mt_frame_caches + (guint64) i * MT_FRAME_CACHE_BYTES);
      guint k;
      fc->gen = 0;
      fc->rgen = ~(guint64) 0;      /* its rules emptied as the slot's are */
      fc->memo_lookups = fc->memo_hits = fc->memo_mask = fc->memo_misses = 0;
      for (k = 0; k != MT_STACK_MEMO_ENTRIES; k++)
        fc->memo_tag[k] = 0;        /* and its memo: another thread's walks */
    }
#endif
    s->ring = (ring >= 0) ? mt_ring_pool + (guint64) ring * mt_config.ring_size : NULL;
    s->tid = mt_current_tid ();
    /* Frida's threads never add to a row (their calls are memtrace's): no lane of their own, so the
     * drain sums only the lanes of the target's threads (mt_lane_seen). */
    own = mt_own_thread (s->tid);
    if (own)
    {
      s->lane = mt_shared_lane (0);     /* (never added to; a shared lane all the same) */
      s->lane_shared = 1;
    }
    else
      mt_claim_lane (s, i);
    s->rng = (s->tid * 0x9e3779b97f4a7c15ULL) ^ (guint64) here ^ 0x2545f4914f6cdd1dULL;
    s->countdown = mt_config.sample_interval != 0 ? mt_next_gap (s) : 0;
    s->stack_lo = 0;
    s->stack_hi = 0;
    mt_barrier ();
    s->state = MT_SLOT_LIVE;
    pthread_setspecific ((guint) mt_config.tls_key, s);
    mt_fetch_stack_bounds (s);
    s->busy = own ? MT_BUSY_OWN : 0;
    if (!own)
      mt_solo_joined (i);
  }

  else
  {
    /* Every slot is taken by a live thread: this thread shares the overflow slot for good (a slot
     * freed later is not worth a scan of every slot on each of its calls). */
    if (mt_solo_end ())
      mt_ncount (mt_shared_slot (), MT_C_SOLO_ENDED, 1);
    s = mt_shared_slot ();
    pthread_setspecific ((guint) mt_config.tls_key, s);
  }

  mt_globals.assigning[marker] = 0;
  g_atomic_int_add (&mt_globals.assigning_claim[marker], -1);
  return s;
}

/* pthread key destructor: the thread is going away.  The drain retires the
 * slot once its ring is empty.  The C library calls it through a stub in leaked
 * memory (agents/runtime/process.js): after the agent is torn down the stub
 * returns at once, so a thread exiting then never jumps into freed code. */
void
mt_thread_exit (gpointer value)
{
  MtSlot * s = value;
  if (s == NULL || s == &mt_slots[mt_config.n_slots])
    return;   /* the shared slot outlives every thread that used it */
  mt_barrier ();
  s->state = MT_SLOT_DEAD;
}

/* Slots handed out so far, for a walk over them.  slots_hw is raised with add-only atomics (all
 * TinyCC has): two threads raising it at once each add their own difference and overshoot, so
 * every walk clamps it to the slot array. */
static inline gint
mt_slots_used (void)
{
  gint hw = mt_globals.slots_hw;
  return hw < (gint) mt_config.n_slots ? hw : (gint) mt_config.n_slots;
}

/* Threads inside a hook right now (not the agent's own thread, marked memtrace's for good):
 * teardown waits for them to leave our code before Frida frees it. */
guint64
mt_busy_slots (void)
{
  gint i, hw = mt_slots_used ();
  guint64 n = 0;
  for (i = 0; i < hw; i++)
  {
    gint busy = mt_slots[i].busy;
    if (mt_slots[i].state == MT_SLOT_LIVE && (busy == MT_BUSY_HOOK || busy == MT_BUSY_COMPOUND))
      n++;
  }
  return n;
}

/* The calling thread's slot (assigned on its first call), or NULL when no slot can be had or
 * the call is memtrace's own, made while assigning one. */
static inline MtSlot *
mt_slot (void)
{
  MtSlot * s;
#if defined(MT_LINUX) && defined(__x86_64__) && !defined(__TINYC__)
  guint64 off = mt_tls_offset;
  if (G_LIKELY (off != 0))
  {
    guint64 self;
    __asm__ ("mov %%fs:0x10, %0" : "=r" (self));
    s = *(MtSlot * volatile *) (self + off);
  }
  else
#endif
    s = pthread_getspecific ((guint) mt_config.tls_key);
  if (G_UNLIKELY (s == NULL))
    s = mt_assign ();
  return s;
}

/* Marks what the thread is doing; the compiler may move no counter update across it (a signal
 * handler's call reads `busy` to know whether it interrupted a hook). */
static inline void
mt_set_busy (MtSlot * s, gint what)
{
  MT_COMPILER_BARRIER ();
  s->busy = what;
  MT_COMPILER_BARRIER ();
}

/* Marks the slot for a stretch of tracking work; returns what to restore. */
static inline gint
mt_guard (MtSlot * s)
{
  gint prev = s->busy;
  mt_set_busy (s, MT_BUSY_HOOK);
  return prev;
}

static inline guint64
mt_slot_index (MtSlot * s)
{
  return (guint64) ((guint8 *) s - (guint8 *) mt_slots) / sizeof (MtSlot);
}

/* ---- the ring (events mode) ------------------------------------------- */

static inline guint8 *
mt_ring_reserve (MtSlot * s, guint64 len)
{
  guint64 size = mt_config.ring_size;
  guint64 off;
  /* Acquire: pairs with the drain's tail update, so the bytes it copied are not overwritten early. */
  guint64 tail = s->has_ring ? mt_load_acquire (&s->tail) : 0;
  if (!s->has_ring || s->head - tail + len > size)
  {
    s->counters[MT_C_DROPPED_RECORDS]++;
    s->counters[MT_C_DROPPED_RECORD_BYTES] += len;
    return NULL;
  }
  off = s->head & (size - 1);
  if (off + len > size)
  {
    guint64 pad = size - off;
    MtPadRecord * r = (MtPadRecord *) (s->ring + off);
    if (s->head - tail + pad + len > size)
    {
      s->counters[MT_C_DROPPED_RECORDS]++;
      s->counters[MT_C_DROPPED_RECORD_BYTES] += len;
      return NULL;
    }
    /* Records never wrap: a padding record fills the rest of the ring. */
    r->type = MT_REC_PAD;
    r->reserved = 0;
    r->reserved2 = 0;
    r->length = (guint32) pad;
    /* Release: the drain that sees the new head sees the padding record too (a plain store here
     * let it copy the ring's old bytes as the record: the sanitizer harness's events-mode race). */
    mt_store_release (&s->head, s->head + pad);
    off = 0;
  }
  return s->ring + off;
}

static inline void
mt_ring_commit (MtSlot * s, guint64 len)
{
  s->counters[MT_C_RECORDS]++;
  s->counters[MT_C_RECORD_BYTES] += len;
#ifdef __TINYC__
  g_atomic_pointer_add (&s->head, (gssize) len);
#else
  __atomic_store_n (&s->head, s->head + len, __ATOMIC_RELEASE);
#endif
}

/* ---- stacks ----------------------------------------------------------- */

/* The frame-pointer chain from fp within [lo, hi), appended to out[n, max): the frame count. */
static inline guint
mt_walk_fp_chain (guint64 fp, guint64 lo, guint64 hi, guint64 * out, guint n, guint max, gboolean * truncated)
{
  while (fp >= lo && fp + 16 <= hi && (fp & 7) == 0)
  {
    /* Swift sets bit 60 of the frame pointer an async frame saves: cleared to follow the chain. */
    guint64 next = ((guint64 *) fp)[0] & ~(1ULL << 60);
    guint64 ret = ((guint64 *) fp)[1] & mt_config.code_mask;
    if (ret < 4096)
      break;
    if (n == max)
    {
      *truncated = TRUE;
      break;
    }
    out[n++] = ret;
    if (next <= fp)
      break;
    fp = next;
  }
  return n;
}

#ifdef MT_UNWIND
/* The thread's frame cache (unwind.c), or NULL when the agent turned it off. */
static inline MtFrameCache *
mt_frame_cache (MtSlot * s)
{
  if (mt_frame_cache_on == 0)
    return NULL;
  return (MtFrameCache *) (mt_frame_caches + mt_slot_index (s) * (guint64) MT_FRAME_CACHE_BYTES);
}
#endif

static inline guint
mt_walk (MtSlot * s, gpointer fp0, guint64 * out, guint max, gboolean * truncated, MtHashed * hashed)
{
  guint64 fp = (guint64) fp0;
  guint64 lo = (guint64) &fp;
  guint64 hi = s->stack_hi;
  *truncated = FALSE;
  if (hi == 0)
    hi = lo + 16;   /* unknown stack: only our own frame is safe to read */
#ifdef MT_UNWIND
  /* Modules without frame pointers have unwind tables (unwind.c). */
  if (mt_unwind_count != 0)
  {
    MtFrameCache * fc = mt_frame_cache (s);
    guint n = mt_unwind_walk (fp, lo, hi, out, max, truncated, &s->ucache, fc);
    if (fc != NULL)
    {
      s->counters[MT_C_FRAME_CACHE_WALKS] += fc->reused;
      mt_fc_hashed (fc, n, hashed);
    }
    return n;
  }
#endif
  return mt_walk_fp_chain (fp, lo, hi, out, 0, max, truncated);
}

/* Room for a len-byte record (STACK, STACK_TAIL, a VM event) in the definitions buffer (caller holds
 * the stack lock). */
static guint8 *
mt_defs_reserve (guint64 len)
{
  guint64 size = mt_config.defs_size;
  guint64 head = mt_core.defs_head;
  guint64 tail = mt_load_acquire (&mt_core.defs_tail);
  guint64 off = head & (size - 1);
  if (off + len > size)
  {
    guint64 pad = size - off;
    MtPadRecord * r = (MtPadRecord *) (mt_defs + off);
    if (head - tail + pad + len > size)
      return NULL;
    r->type = MT_REC_PAD;
    r->reserved = 0;
    r->reserved2 = 0;
    r->length = (guint32) pad;
    head += pad;
    mt_store_release (&mt_core.defs_head, head);
    off = 0;
  }
  if (head - tail + len > size)
    return NULL;
  return mt_defs + off;
}

/* The smallest page size: a write every MT_PAGE_MIN bytes writes every page of a range on any
 * platform (larger pages only take a few more writes). */
#define MT_PAGE_MIN 4096ULL

/* The stack index grows: generation g is a table of mt_index_entries (g) (hash, id) pairs, laid out
 * after every earlier generation's in mt_stack_table (the agent reserves their sum, under
 * 4 * (stack_mask + 1) pairs, as pages resident only once written).  When interning an id would
 * fill the current table past half, the holder of the stack lock copies it into the next
 * generation's (fresh, zero pages) and publishes the generation with a release store: a reader
 * sees a table's entries before it can see its generation.  Old tables are never reused: a reader
 * still probing one finds no entry added since, misses, and takes the lock, which looks in the
 * current table.  Growth is a rare lock (log2 of the budget times in a run), never a copy of rows:
 * aggregate rows are by id, and ids never move. */
#ifndef MT_INDEX_MIN
# define MT_INDEX_MIN 4096ULL   /* pairs in the first generation (64 KiB) */
#endif

static inline guint64
mt_index_entries (guint64 gen)
{
  guint64 full = 2 * (mt_config.stack_mask + 1);
  guint64 e = MT_INDEX_MIN << gen;
  return (gen >= 40 || e > full) ? full : e;
}

static inline volatile guint64 *
mt_index_table (guint64 gen)
{
  /* Generations before a capped one are MT_INDEX_MIN << g pairs each: their sum is this. */
  return &mt_stack_table[2 * (MT_INDEX_MIN * ((1ULL << gen) - 1))];
}

/* Under the stack lock: the next generation, holding every entry of the current one. */
static void
mt_index_grow (void)
{
  guint64 gen = mt_core.index_gen;
  guint64 from_n = mt_index_entries (gen), to_n = mt_index_entries (gen + 1);
  volatile guint64 * from = mt_index_table (gen);
  volatile guint64 * to = mt_index_table (gen + 1);
  guint64 i, mask = to_n - 1;
  if (to_n == from_n)
    return;
  /* Every page of the new table written before the copy's probes read it: a first read maps the
   * kernel's zero page, and the write after it faults again and flushes the TLB of every CPU the
   * process runs on (102 samples of 840 in a 131,072-stack run).  A fourth of its pairs are about to
   * be filled, spread by hash: every page would be written anyway.  Nobody reads it before it is
   * published below. */
  for (i = 0; i < to_n; i += MT_PAGE_MIN / 16)
    to[2 * i] = 0;
  for (i = 0; i != from_n; i++)
  {
    guint64 h = from[2 * i];
    guint64 j;
    if (h == 0)
      continue;
    for (j = h & mask; to[2 * j] != 0; j = (j + 1) & mask)
      ;
    to[2 * j + 1] = from[2 * i + 1];
    to[2 * j] = h;
  }
  mt_store_release (&mt_core.index_gen, gen + 1);
}

/* Before a new stack takes the stack lock: a definitions buffer too full for it is waited on (the
 * drain empties it every 100 ms) rather than the stack dropped -- a burst of new stacks (a compiler's
 * first pass, a test making 200,000 paths) outruns one drain's worth of buffer.  Bounded: after half
 * a second the stack is dropped (and counted) as before, and until the drain moves again nobody
 * waits (a fork child without the agent's thread, a drain stopped at the end of the window, a
 * thread inside a JavaScript hook that the drain's thread waits for). */
static void
mt_defs_wait (guint64 len)
{
  guint64 size = mt_config.defs_size;
  guint64 tail = mt_load_acquire (&mt_core.defs_tail);
  gint64 give_up;
  /* room for the record and the padding of a wrap (shorter than the record) */
  if (G_LIKELY (mt_core.defs_head - tail + 2 * len <= size) || mt_core.defs_stalled == tail + 1)
    return;
  give_up = g_get_monotonic_time () + 500000;
  while (mt_core.defs_head - tail + 2 * len > size)
  {
    sched_yield ();
    if (g_get_monotonic_time () > give_up)
    {
      mt_core.defs_stalled = tail + 1;
      return;
    }
    tail = mt_load_acquire (&mt_core.defs_tail);
  }
}

/* Stack definitions are ~90 % of what a compiler's capture ships (cc1plus: 48,600 stacks of 36
 * frames, 14 MB), and each byte of them is written to the definitions ring, copied to the drain's
 * buffer and again by Frida's transport: pages the target faults in.  A stack and the one defined
 * just before it (on one thread: the same outer frames, main, the pass, the parser) share two
 * thirds of their frames, so a definition that shares at least MT_TAIL_MIN outer frames with the
 * last one is a STACK_TAIL record: its own inner frames and the count of the shared ones (the host
 * expands it, capture.StackTails: the capture holds STACK records as before). */
#define MT_TAIL_MIN 2

/* Outer frames the n frames (innermost first) share with the last stack defined (stack lock held),
 * if that one was defined since the last drain: each drain's first definition is whole, so a batch
 * the host never saw (its target killed mid-send, say) costs the stacks of that batch, never those of
 * every batch after it. */
static inline guint
mt_def_shared (const guint64 * frames, guint n, guint64 epoch)
{
  guint m = (guint) mt_globals.last_def_n, j = 0;
  const guint64 * last = &mt_globals.last_def[MT_MAX_FRAMES - 1];
  if (mt_globals.last_def_epoch != epoch)
    return 0;
  if (m > n)
    m = n;
  while (j != m && frames[n - 1 - j] == last[-(gint64) j])
    j++;
  return j;
}

/* The stack just defined becomes the last one: its frames not shared with the previous are written. */
static inline void
mt_def_remember (const guint64 * frames, guint n, guint shared, guint64 id, guint64 epoch)
{
  guint k;
  guint64 * at = &mt_globals.last_def[MT_MAX_FRAMES - n];
  for (k = 0; k != n - shared; k++)
    at[k] = frames[k];
  mt_globals.last_def_n = n;
  mt_globals.last_def_id = id;
  mt_globals.last_def_epoch = epoch;
}

/* A stack's id, interning it on first sight.  The definition goes to the drain through mt_defs before
 * the id is used, so no row is ever shipped without one.  When every id is taken (stack_mask + 1 of
 * them: the documented budget, docs/agents.md "Memory budget") or the definitions buffer is full, the
 * stack is DROPPED_STACK, counted in dropped_stacks and said in the summary. */
static guint32
mt_intern_hashed (MtSlot * s, const guint64 * frames, guint n, guint64 h)
{
  guint64 gen = mt_load_acquire (&mt_core.index_gen);
  volatile guint64 * table = mt_index_table (gen);
  guint64 mask = mt_index_entries (gen) - 1;
  guint64 i;
  guint probe;
  guint32 result = MT_DROPPED_STACK;

  for (probe = 0; probe != 64; probe++)
  {
    i = (h + probe) & mask;
    guint64 v = mt_load_acquire (&table[2 * i]);
    if (v == h)
      return (guint32) table[2 * i + 1];
    if (v == 0)
      break;
  }

  mt_defs_wait (sizeof (MtStackRecord) + 8 * (guint64) n);
  if (!mt_stack_lock ())
  {
    s->counters[MT_C_DROPPED_STACKS]++;
    return MT_DROPPED_STACK;
  }
  /* The id this stack would get: grow first if it would fill the table past half. */
  if (2 * (mt_core.n_stacks + 1) > mt_index_entries (mt_core.index_gen))
    mt_index_grow ();
  gen = mt_core.index_gen;
  table = mt_index_table (gen);
  mask = mt_index_entries (gen) - 1;
  for (probe = 0; probe != 64; probe++)
  {
    i = (h + probe) & mask;
    guint64 v = table[2 * i];
    if (v == h)
    {
      result = (guint32) table[2 * i + 1];
      break;
    }
    if (v == 0)
    {
      guint64 id = mt_core.n_stacks;
      guint64 epoch = mt_load_acquire (&mt_core.defs_epoch);
      guint shared = mt_def_shared (frames, n, epoch);
      gboolean tail = shared >= MT_TAIL_MIN;
      guint own = tail ? n - shared : n;
      guint64 head_len = tail ? sizeof (MtStackTailRecord) : sizeof (MtStackRecord);
      guint64 len = head_len + 8 * (guint64) own;
      guint8 * rec = id <= mt_config.stack_mask ? mt_defs_reserve (len) : NULL;
      if (rec != NULL)
      {
        /* A STACK_TAIL record is a STACK record's head and two more fields (layout.py). */
        MtStackRecord * r = (MtStackRecord *) rec;
        guint64 * out = (guint64 *) (rec + head_len);
        guint k;
        r->type = tail ? MT_REC_STACK_TAIL : MT_REC_STACK;
        r->nframes = (guint8) own;
        r->nframes_hi = (guint16) (own >> 8);
        r->stack_id = (guint32) id;
        if (tail)
        {
          ((MtStackTailRecord *) rec)->parent_id = (guint32) mt_globals.last_def_id;
          ((MtStackTailRecord *) rec)->shared = shared;
        }
        for (k = 0; k != own; k++)
          out[k] = frames[k];
        mt_def_remember (frames, n, shared, id, epoch);
        mt_store_release (&mt_core.defs_head, mt_core.defs_head + len);
        /* The new row's words, 0 and used by nobody yet, written before anything reads them (the
         * interning thread's lane, where its next add goes, and its dirty flag): a first read of a
         * fresh page maps the zero page, and the write after it faulted again and flushed every
         * CPU's TLB (86 samples of 840 in a 131,072-stack run, in the row's snapshot). */
        mt_agg[((guint64) s->lane * (mt_config.stack_mask + 1 + MT_N_PSEUDO_STACKS) + id) * MT_AGG_HOT] = 0;
        mt_agg_dirty[id] = 0;
        mt_store_release (&mt_core.n_stacks, id + 1);
        table[2 * i + 1] = id;
        mt_store_release (&table[2 * i], h);
        g_atomic_pointer_add (&mt_globals.stacks_interned, 1);
        result = (guint32) id;
      }
      break;
    }
  }
  mt_stack_unlock ();
  if (result == MT_DROPPED_STACK)
    s->counters[MT_C_DROPPED_STACKS]++;
  return result;
}

static guint32
mt_intern (MtSlot * s, const guint64 * frames, guint n)
{
  return mt_intern_hashed (s, frames, n, mt_hash_frames (frames, n));
}

/* ---- the live-pointer table ------------------------------------------ */

/* Key bits only the Darwin logger path sets (malloc.c, "the logger path's live-table entries"):
 * a block whose release is undecided or owed, and the VM regions' own namespace. */
#define MT_LIVE_SUSPECT 1
#define MT_LIVE_OWED 2
#define MT_LIVE_VM 4

/* Address bits one bucket spans: glibc's chunks are >= 32 B, so a 256-byte span holds at most 8 of a
 * window's blocks, the bucket's 8 ways; allocators with 16-byte blocks (Darwin's nano zone) keep 64
 * bytes, two windows' worth.  What the table costs is what of it the heap touches: 128 bytes of
 * table per 256 bytes of heap address space, half a byte per byte (1.5 with the 8-byte keys and
 * 128-byte spans before).  Each of those pages is one the target faults in, and on a machine that
 * hands fresh pages out slowly (a VM whose host backs guest memory on first touch: ~10 us a page
 * here) CPython's run spent a third of its overhead faulting in the 96 MiB the old layout touched. */
#ifdef MT_LINUX
# define MT_LIVE_SHIFT 8
#else
# define MT_LIVE_SHIFT 6
#endif
#define MT_LIVE_SPAN_MASK ((1u << MT_LIVE_SHIFT) - 1)
/* A key's top 3 bits: 0 for an entry in its home bucket, j for one in its j-th alternate (mt_live_alt). */
#define MT_LIVE_ALT_SHIFT MT_LIVE_KEY_ADDRESS_BITS      /* layout.py: the agent sizes the table by it */
#define MT_LIVE_ALTS 7
#define MT_LIVE_ALT_MASK (7u << MT_LIVE_ALT_SHIFT)
/* Windows a key can name: its bits above the span's and below the alternate's, less the one value
 * that would reach them. */
#define MT_LIVE_KEY_WINDOWS ((1u << (MT_LIVE_ALT_SHIFT - MT_LIVE_SHIFT)) - 1)

static inline guint64
mt_live_window_offset (guint64 window_q)
{
  return (window_q * 0x9e3779b97f4a7c15ULL) >> 32;
}

static inline guint64
mt_live_bucket (guint64 p)
{
  /* Neighbouring blocks in the same or neighbouring buckets: the address space is cut into windows
   * as large as the table spans (buckets << MT_LIVE_SHIFT bytes), each covering every bucket once
   * in address order from its own pseudo-random offset.  The blocks an allocator hands out one
   * after the other -- and frees in much the same order -- then share a bucket's lines and the
   * table's pages, where a fully hashed table made every tracked allocation and free of a large
   * heap two cache misses. */
  guint64 mask = mt_config.live_mask;
  guint64 q = p >> MT_LIVE_SHIFT;
  return (q + mt_live_window_offset (q & ~mask)) & mask;
}

/* The key of address p (its flag bits included) in its bucket: the number of p's window plus one
 * (0 is an empty way) above p's bits inside the span.  The bucket says the rest (mt_live_address).
 * 0 when p is past what a key can name (2^48 and up with the smallest table: a tagged pointer). */
static inline guint32
mt_live_key (guint64 p)
{
  guint64 w = (p >> MT_LIVE_SHIFT) >> mt_config.live_bits;
  if (G_UNLIKELY (w >= MT_LIVE_KEY_WINDOWS))
    return 0;
  return (guint32) (((w + 1) << MT_LIVE_SHIFT) | (p & MT_LIVE_SPAN_MASK));
}

/* The address (flag bits included) whose key in bucket b is `key` (not 0). */
static inline guint64
mt_live_address (guint64 b, guint32 key)
{
  guint64 wq = ((guint64) (key >> MT_LIVE_SHIFT) - 1) << mt_config.live_bits;
  guint64 q = wq | ((b - mt_live_window_offset (wq)) & mt_config.live_mask);
  return (q << MT_LIVE_SHIFT) | (key & MT_LIVE_SPAN_MASK);
}

/* The j-th alternate (1 ... MT_LIVE_ALTS) of the block keyed `key` (alternate bits clear) whose home
 * is bucket b: where its entry goes when the home's 8 ways are taken.  Dense parts of the heap do land
 * on the same buckets: glibc's thread arenas are heaps of 64 MiB on 64 MiB boundaries, all small
 * blocks at first, and each window starts at its own offset; 8 threads keeping 300,000 blocks of 24 B
 * each had half their blocks untracked with 8 ways and no second place, and ~14,000 with one
 * alternate -- which fails when it falls in another dense stretch, as full as the home.  Each
 * alternate is in the other half of the table at a place drawn from the key and j, so the blocks of a
 * crowded bucket scatter, and seven fail together about never.  XOR makes each its own inverse (the
 * drain finds the home from where the entry is and j).  The logger path's own flags (suspect, owed)
 * change on an entry in place: they are left out. */
static inline guint64
mt_live_alt (guint64 b, guint32 key, guint j)
{
  guint64 half = (mt_config.live_mask + 1) >> 1;
  guint64 k = (guint64) (key & ~(guint32) (MT_LIVE_SUSPECT | MT_LIVE_OWED)) | ((guint64) j << 32);
  guint64 h = (k * 0x9e3779b97f4a7c15ULL) ^ ((k * 0x9e3779b97f4a7c15ULL) >> 29);
  h = (h * 0xbf58476d1ce4e5b9ULL) >> 32;
  return b ^ ((h & (half - 1)) | half);
}

#define MT_LIVE_BUCKET_BYTES (MT_LIVE_WAYS * sizeof (MtLiveEntry))

static inline MtLiveEntry *
mt_live_entries (guint64 b)
{
  return (MtLiveEntry *) (mt_live_table + b * MT_LIVE_BUCKET_BYTES);
}

static inline volatile guint32 *
mt_live_key_at (MtLiveEntry * e)
{
  return (volatile guint32 *) &e->key;
}

/* Entry i of the whole table (bucket i / MT_LIVE_WAYS, way i % MT_LIVE_WAYS), for walks over it. */
#define MT_LIVE_ENTRY(i) (mt_live_entries ((i) / MT_LIVE_WAYS)[(i) % MT_LIVE_WAYS])

/* The address entry i holds (flag bits included), 0 for an empty way. */
static inline guint64
mt_live_entry_address (guint64 i)
{
  guint32 key = *mt_live_key_at (&MT_LIVE_ENTRY (i)), j;
  guint64 b = i / MT_LIVE_WAYS;
  if (key == 0)
    return 0;
  j = key >> MT_LIVE_ALT_SHIFT;
  if (j != 0)
  {
    key &= ~MT_LIVE_ALT_MASK;
    b = mt_live_alt (b, key, j);
  }
  return mt_live_address (b, key);
}

/* An entry's stack_k: the stack id's low MT_LIVE_STACK_BITS bits, the sampling multiplier k above. */
static inline guint32
mt_live_stack_k (guint32 stack_id, guint k)
{
  return (stack_id & ((1u << MT_LIVE_STACK_BITS) - 1)) | ((guint32) k << MT_LIVE_STACK_BITS);
}

/* The stack id of entry e: a real id is below 2^MT_LIVE_STACK_BITS - 16 (the agent bounds the stack
 * table), a pseudo stack's (0xFFFFFFFD ...) comes back from its low bits. */
static inline guint32
mt_live_entry_stack (const MtLiveEntry * e)
{
  guint32 v = e->stack_k & ((1u << MT_LIVE_STACK_BITS) - 1);
  return v >= (1u << MT_LIVE_STACK_BITS) - 16 ? v | ~((1u << MT_LIVE_STACK_BITS) - 1) : v;
}

static inline guint
mt_live_entry_k (const MtLiveEntry * e)
{
  return e->stack_k >> MT_LIVE_STACK_BITS;
}

/* ---- blocks of 4 GiB or more: their sizes in a side list --------------------------------------
 * An entry's size is 32 bits; a larger block's says MT_LIVE_SIZE_BIG and its size sits here, under
 * a lock, with its address (flag bits included).  Such blocks are few (a JIT's reservation, a
 * mapped database); past MT_LIVE_BIG_BLOCKS at once the block is not tracked (counted as a full
 * table).  In mt_globals, not the module's own static data (TinyCC's faults on its first write). */
#define mt_live_big (mt_globals.live_big)
#define mt_live_big_lock (mt_globals.big_lock)

/* The list knows a block by its address with its flag bits, as its entry does: the logger path's
 * "owed" block and a new block at the same address are two (mt_live_big_rename follows a change).
 * Every use takes the list's lock, bounded as every lock a hook takes: a signal handler on the
 * thread that holds it gives up. */

/* The pair listing p (the lock held), or MT_LIVE_BIG_BLOCKS. */
static guint
mt_live_big_pair (guint64 p)
{
  guint i;
  for (i = 0; i != MT_LIVE_BIG_BLOCKS; i++)
    if (mt_live_big[2 * i + 1] != 0 && mt_live_big[2 * i] == p)
      return i;
  return MT_LIVE_BIG_BLOCKS;
}

static gboolean
mt_live_big_add (guint64 p, guint64 size)
{
  guint i;
  if (!mt_lock_patiently (&mt_live_big_lock))
    return FALSE;
  /* A pair still listed at p is stale (its removal could not have the lock): p is this block now. */
  i = mt_live_big_pair (p);
  if (i == MT_LIVE_BIG_BLOCKS)
    for (i = 0; i != MT_LIVE_BIG_BLOCKS && mt_live_big[2 * i + 1] != 0; i++)
      ;
  if (i != MT_LIVE_BIG_BLOCKS)
  {
    mt_live_big[2 * i] = p;
    mt_live_big[2 * i + 1] = size;
  }
  mt_unlock (&mt_live_big_lock);
  return i != MT_LIVE_BIG_BLOCKS;
}

/* Big block `from` is listed as `to` from now on (the logger path changed its entry's flags). */
static void
mt_live_big_rename (guint64 from, guint64 to)
{
  guint i;
  if (!mt_lock_patiently (&mt_live_big_lock))
    return;
  if ((i = mt_live_big_pair (from)) != MT_LIVE_BIG_BLOCKS)
    mt_live_big[2 * i] = to;
  mt_unlock (&mt_live_big_lock);
}

/* The size of big block p, taken out of the list when `take` (its entry leaves the table); 0 if the
 * list's lock could not be had. */
static guint64
mt_live_big_size (guint64 p, gboolean take)
{
  guint i;
  guint64 size = 0;
  if (!mt_lock_patiently (&mt_live_big_lock))
    return 0;
  if ((i = mt_live_big_pair (p)) != MT_LIVE_BIG_BLOCKS)
  {
    size = mt_live_big[2 * i + 1];
    if (take)
      mt_live_big[2 * i + 1] = 0;
  }
  mt_unlock (&mt_live_big_lock);
  return size;
}

/* The whole size of entry e (holding p); `take`: the entry is leaving (a big block leaves the list). */
static inline guint64
mt_live_size_of (const MtLiveEntry * e, guint64 p, gboolean take)
{
  return G_LIKELY (e->size != MT_LIVE_SIZE_BIG) ? e->size : mt_live_big_size (p, take);
}

/* Entry e (holding p) as the core's functions hand it over, its whole size. */
static inline void
mt_live_meta_of (const MtLiveEntry * e, guint64 p, MtLiveMeta * out, gboolean take)
{
  out->size = mt_live_size_of (e, p, take);
  out->stack_id = mt_live_entry_stack (e);
  out->k = mt_live_entry_k (e);
}

/* The stack id of entry i, for walks over the table. */
static inline guint32
mt_live_entry_stack_id (guint64 i)
{
  return mt_live_entry_stack (&MT_LIVE_ENTRY (i));
}

/* The whole size of entry i (holding p), for walks over the table. */
static inline guint64
mt_live_entry_size (guint64 i, guint64 p)
{
  return mt_live_size_of (&MT_LIVE_ENTRY (i), p, FALSE);
}

/* Takes an empty way of bucket b for `key`: its entry, or NULL when the 8 are taken. */
static MtLiveEntry *
mt_live_claim (guint64 b, guint32 key, guint spins)
{
  MtLiveEntry * e = mt_live_entries (b);
  guint i;
#ifdef __TINYC__
  MtLiveEntry * got = NULL;
  if (!mt_trylock (&mt_live_locks[b], spins))
    return NULL;
  for (i = 0; i != MT_LIVE_WAYS; i++)
  {
    if (*mt_live_key_at (&e[i]) == 0)
    {
      *mt_live_key_at (&e[i]) = key;
      got = &e[i];
      break;
    }
  }
  mt_unlock (&mt_live_locks[b]);
  return got;
#else
  (void) spins;
  gboolean solo = MT_SOLO && mt_core.solo == MT_SOLO_ON;
  for (i = 0; i != MT_LIVE_WAYS; i++)
  {
    guint32 expected = 0;
    volatile guint32 * kp = mt_live_key_at (&e[i]);
    /* The first way is tried with the swap itself, not read first: a table page's first touch is
     * then a write, one page fault, where a read mapped the kernel's zero page and the write after
     * it faulted again (a sparse heap -- sqlite3's -- touches a table page per block) -- and, with
     * several threads, flushed the TLB of every CPU the process runs on: two threads growing their
     * heaps spent 39 % of their samples in those faults and 18 % in the flushes' interrupts. */
    if (i != 0 && *kp != 0)
      continue;
#if MT_SOLO
    if (solo ? mt_cas_solo32 (kp, 0, key)
        : __atomic_compare_exchange_n (kp, &expected, key, FALSE, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
#else
    if (__atomic_compare_exchange_n (kp, &expected, key, FALSE, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
#endif
      return &e[i];
  }
  return NULL;
#endif
}

/* Remembers block p (its size, stack and sampling multiplier k) in its bucket, else in the first of
 * its alternates with room; FALSE when all are full (or p cannot be keyed, or the big blocks' list is
 * full). */
static gboolean
mt_live_insert (guint64 p, guint64 size, guint32 stack_id, guint k, guint spins)
{
  guint64 b = mt_live_bucket (p);
  guint32 key = mt_live_key (p), size32 = (guint32) size;
  MtLiveEntry * e;
  if (G_UNLIKELY (key == 0))
    return FALSE;
  if (G_UNLIKELY (size >= MT_LIVE_SIZE_BIG))
  {
    if (!mt_live_big_add (p, size))
      return FALSE;
    size32 = MT_LIVE_SIZE_BIG;
  }
  e = mt_live_claim (b, key, spins);
  if (G_UNLIKELY (e == NULL))
  {
    guint j;
    /* Said before the entry is anywhere: the only lookup of p is its own free, after this returns,
     * but the logger path's lock-free look (mt_live_surely_absent) may come from another thread.
     * Stored without a look first: a page of spill bytes first read maps the kernel's zero page,
     * and the store after it faults again ("Pages written before they are read", docs/agents.md). */
    mt_live_spill[b] = 1;
    for (j = 1; j <= MT_LIVE_ALTS && e == NULL; j++)
      e = mt_live_claim (mt_live_alt (b, key, j), key | (j << MT_LIVE_ALT_SHIFT), spins);
  }
  if (G_UNLIKELY (e == NULL))
  {
    if (size32 == MT_LIVE_SIZE_BIG)
      mt_live_big_size (p, TRUE);
    return FALSE;
  }
  /* Only the thread that frees p reads this entry, and p is not handed out before we return (the
   * drain, which walks the table, reads entries the hooks no longer change: at the window's end). */
  e->size = size32;
  e->stack_k = mt_live_stack_k (stack_id, k);
  return TRUE;
}

/* The way of bucket b whose key is `key`, or -1.  A bucket's keys sit 12 bytes apart in its two
 * lines: reading them is what a per-bucket occupancy count cost (and every insert and removal no
 * longer pays an atomic add to keep one). */
static inline gint
mt_live_way_of_key (guint64 b, guint32 key)
{
  MtLiveEntry * e = mt_live_entries (b);
  gint i;
  for (i = 0; i != MT_LIVE_WAYS; i++)
    if (*mt_live_key_at (&e[i]) == key)
      return i;
  return -1;
}

/* The alternates of home bucket b, for the block keyed `key`: out of line, so that the hooks' inlined
 * lookup stays a home scan (a free on a large heap is a cache miss there; its code is the free's). */
static MT_NOINLINE gint
mt_live_find_spilled (guint64 b, guint32 key, guint64 * at)
{
  guint j;
  gint i;
  for (j = 1; j <= MT_LIVE_ALTS; j++)
  {
    guint64 a = mt_live_alt (b, key, j);
    if ((i = mt_live_way_of_key (a, key | (j << MT_LIVE_ALT_SHIFT))) >= 0)
    {
      *at = a;
      return i;
    }
  }
  return -1;
}

/* Where address v (flag bits included) is listed: its way, and in *at its bucket (its home, or one of
 * its alternates); -1 when it is not.  A block in the table is almost always in its home: the
 * alternates are read only on a miss there, and only when the home ever sent a block away. */
static inline gint
mt_live_find (guint64 v, guint64 * at)
{
  guint32 key = mt_live_key (v);
  guint64 b = mt_live_bucket (v);
  gint i;
  if (G_UNLIKELY (key == 0))
    return -1;
  if (G_LIKELY ((i = mt_live_way_of_key (b, key)) >= 0))
  {
    *at = b;
    return i;
  }
  if (G_LIKELY (mt_live_spill[b] == 0))
    return -1;
  return mt_live_find_spilled (b, key, at);
}

static inline gboolean
mt_live_bucket_empty (guint64 b)
{
  MtLiveEntry * e = mt_live_entries (b);
  gint i;
  for (i = 0; i != MT_LIVE_WAYS; i++)
    if (*mt_live_key_at (&e[i]) != 0)
      return FALSE;
  return TRUE;
}

/* Whether nothing at address v can be listed, whatever the logger path's flags on it: its home is
 * empty and never sent a block to an alternate (a look before taking a bucket lock). */
static inline gboolean
mt_live_surely_absent (guint64 v)
{
  guint64 b = mt_live_bucket (v);
  return mt_live_key (v) == 0 || (mt_live_spill[b] == 0 && mt_live_bucket_empty (b));
}

/* Takes way i of bucket b (holding v) out of the table: its entry is read before the way is offered
 * to another insert. */
static inline void
mt_live_take (guint64 b, gint i, guint64 v, MtLiveMeta * out)
{
  MtLiveEntry * e = &mt_live_entries (b)[i];
  mt_live_meta_of (e, v, out, TRUE);
  MT_STORE_RELEASE (mt_live_key_at (e), 0u);
}

/* Only the thread freeing p can remove p, and p cannot be handed out again
 * before the real free runs, so removal needs no lock. */
static inline gboolean
mt_live_remove (guint64 p, MtLiveMeta * out)
{
  guint64 b = 0;
  gint i = mt_live_find (p, &b);
  if (i < 0)
    return FALSE;
  mt_live_take (b, i, p, out);
  return TRUE;
}

/* mt_live_remove where a look a moment ago found p in its home bucket b at way i: taken there if the
 * way still holds p's key (a signal handler's call in between may have changed the bucket; entries
 * never move, but the check costs one load from a line in L1), else looked for again. */
static inline gboolean
mt_live_remove_found (guint64 p, guint64 b, gint i, MtLiveMeta * out)
{
  guint32 key = mt_live_key (p);
  if (G_LIKELY (b == mt_live_bucket (p) && *mt_live_key_at (&mt_live_entries (b)[i]) == key))
  {
    mt_live_take (b, i, p, out);
    return TRUE;
  }
  return mt_live_remove (p, out);
}

/* Pages resident in a mincore() vector (bit 0 of each byte), for calibration's count of the agent's
 * own tables: the stack budget's reservations are millions of pages, too many for a JavaScript
 * loop at the target's exit. */
guint64
mt_count_resident (const guint8 * vec, guint64 n)
{
  guint64 i, count = 0;
  for (i = 0; i != n; i++)
    count += vec[i] & 1;
  return count;
}
