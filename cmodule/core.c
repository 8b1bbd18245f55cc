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
 *     at the peak (see "the peak" below).
 * The drain ships the stack definitions, the rows changed since the last drain (their running
 * totals), the composition at the peak when it moved, and at the end the live table.  With
 * MtConfig.events set it also streams one record per tracked event through per-thread rings,
 * as before the aggregates existed.
 *
 * A drained batch is a sequence of chunks: MtChunkHeader, then records (tid 0: the core's own
 * records; otherwise one thread's events).  STACK records are followed by u64 frames[nframes],
 * AGG records by u64 values[nvalues]; a PAD record says how many bytes to skip.
 */
#include <glib.h>
#include <gum/guminterceptor.h>

#define MT_SLOT_FREE 0
#define MT_SLOT_LIVE 1
#define MT_SLOT_DEAD 2

/* What the thread's slot is doing (MtSlot.busy); a hooked call that finds it non-zero is nested:
 * made by a signal handler, by the allocator inside one of its own entries, or by memtrace. */
#define MT_BUSY_OWN 1        /* memtrace's own thread set-up (mt_assign): its calls are not the target's */
#define MT_BUSY_HOOK 2       /* inside a hook: a nested call is a signal handler's, counted */
#define MT_BUSY_COMPOUND 3   /* inside the real call of an entry that may call the family itself */

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
  gint has_ring;
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
};

struct _MtGlobals
{
  volatile gint stack_lock;
  volatile gint rings_claimed;
  volatile gint slots_hw;          /* high-water mark of slot indices used */
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
  volatile guint64 peak_t_us;
  volatile gint peak_lock;
  gint pad1a;
  guint64 pad1[4];
  /* read by every tracked allocation (the block's birth), written by the drain */
  volatile guint64 tick;
  guint64 pad2[7];
  /* stack definitions: produced under mt_globals.stack_lock, consumed by the drain */
  volatile guint64 defs_head;
  volatile guint64 defs_tail;
  volatile guint64 n_stacks;       /* entries in mt_stack_list */
  volatile gint sites_lock;
  gint pad3a;
  volatile guint64 n_sites;        /* entries of mt_sites in use */
  guint64 pad3[3];
  /* the drain's own */
  guint64 shipped_epoch;
  guint64 composition_us;          /* when the last composition was shipped */
  gint64 live_blocks;              /* tracked blocks, from the shipped rows */
  guint64 live_cursor;             /* the final drain's walk through the live table */
  guint64 live_done;
  guint64 live_dumped;
};

extern MtConfig mt_config;
extern MtGlobals mt_globals;
extern MtCore mt_core;
extern MtSlot mt_slots[];
extern guint8 mt_ring_pool[];
extern volatile guint64 mt_stack_table[];
extern volatile guint32 mt_stack_list[];      /* interned stack ids, in interning order */
extern guint8 mt_defs[];                      /* STACK records, a ring of defs_size bytes */
extern volatile guint64 mt_live_table[];
extern MtLiveMeta mt_live_meta[];             /* beside each live-table key */
extern volatile gint mt_live_occupancy[];
extern volatile gint mt_live_locks[];
/* (stack slots + MT_N_PSEUDO_STACKS) rows x agg_lanes lanes x MT_AGG_STRIDE counters */
extern volatile guint64 mt_agg[];
extern volatile guint8 mt_agg_dirty[];        /* per row: changed since the drain last looked */
extern guint64 mt_agg_shipped[];              /* per row: the totals last shipped (drain only) */
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

extern gpointer pthread_getspecific (guint key);
extern gint pthread_setspecific (guint key, gconstpointer value);
extern gpointer pthread_self (void);
extern gint sched_yield (void);
#ifdef MT_DARWIN
extern gpointer pthread_get_stackaddr_np (gpointer thread);
extern gsize pthread_get_stacksize_np (gpointer thread);
extern gint pthread_threadid_np (gpointer thread, guint64 * tid);
#else
extern gint pthread_getattr_np (gpointer thread, gpointer attr);
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
#else
# define MT_LIGHT_HOOKS 0
# define mt_bump(p, v) (*(p) += (v))
#endif

static gint64 mt_next_gap (MtSlot * s);

#define MT_CFG (&mt_config)
#define MT_G (&mt_globals)

static inline void
mt_barrier (void)
{
  g_atomic_int_add (&mt_globals.fence, 0);
}

/* A store that earlier loads and stores may not pass (a row's snapshot before its epoch). */
static inline void
mt_store_release (volatile guint64 * p, guint64 v)
{
#ifdef __TINYC__
  mt_barrier ();
  *p = v;
#else
  __atomic_store_n (p, v, __ATOMIC_RELEASE);
#endif
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
  guint64 tid = 0;
  pthread_threadid_np (NULL, &tid);
  return tid;
#else
  return (guint64) syscall ((glong) mt_config.gettid_nr);
#endif
}

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

/* Called when pthread_getspecific() gave NULL.  pthread_setspecific may itself
 * allocate (glibc, keys >= 32): a nested call on this thread finds its stack
 * address registered in `assigning` and passes straight through. */
static MtSlot *
mt_assign (void)
{
  guint64 here = (guint64) &here;
  guint i, marker = 64;
  MtSlot * s = NULL;
  gint ring;

  for (i = 0; i != 64; i++)
  {
    guint64 a = mt_globals.assigning[i];
    if (a != 0 && here <= a && a - here < 65536)
      return NULL;
  }
  /* 64 threads assigning at once is rare: spin until a marker frees up. */
  while (marker == 64)
  {
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
  mt_barrier ();

  for (i = 0; i != mt_config.n_slots; i++)
  {
    MtSlot * c = &mt_slots[i];
    if (c->claim != 0)
      continue;
    if (g_atomic_int_add (&c->claim, 1) == 0)
    {
      s = c;
      if ((gint) i >= mt_globals.slots_hw)
        g_atomic_int_add (&mt_globals.slots_hw, (gint) i + 1 - mt_globals.slots_hw);
      break;
    }
    g_atomic_int_add (&c->claim, -1);
  }

  if (s != NULL)
  {
    guint j;
    for (j = 0; j != MT_N_COUNTERS; j++)
      s->counters[j] = 0;
    s->busy = 1;
    s->head = 0;
    s->tail = 0;
    ring = mt_claim_ring ();
    s->has_ring = ring >= 0;
    s->ring = (ring >= 0) ? mt_ring_pool + (guint64) ring * mt_config.ring_size : NULL;
    s->tid = mt_current_tid ();
    s->rng = (s->tid * 0x9e3779b97f4a7c15ULL) ^ (guint64) here ^ 0x2545f4914f6cdd1dULL;
    s->countdown = mt_config.sample_interval != 0 ? mt_next_gap (s) : 0;
    s->stack_lo = 0;
    s->stack_hi = 0;
    mt_barrier ();
    s->state = MT_SLOT_LIVE;
    pthread_setspecific ((guint) mt_config.tls_key, s);
    mt_fetch_stack_bounds (s);
    s->busy = 0;
  }

  else
  {
    /* Every slot is taken: the call goes uncounted, and says so. */
    g_atomic_pointer_add (&mt_globals.lost_calls, 1);
  }

  mt_globals.assigning[marker] = 0;
  g_atomic_int_add (&mt_globals.assigning_claim[marker], -1);
  return s;
}

/* pthread key destructor: the thread is going away.  The drain retires the
 * slot once its ring is empty. */
void
mt_thread_exit (gpointer value)
{
  MtSlot * s = value;
  if (s == NULL)
    return;
  mt_barrier ();
  s->state = MT_SLOT_DEAD;
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
  if (!s->has_ring || s->head - s->tail + len > size)
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
    if (s->head - s->tail + pad + len > size)
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
    s->head += pad;
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

static inline guint
mt_walk (MtSlot * s, gpointer fp0, guint64 * out, guint max, gboolean * truncated)
{
  guint n = 0;
  guint64 fp = (guint64) fp0;
  guint64 lo = (guint64) &n;
  guint64 hi = s->stack_hi;
  *truncated = FALSE;
  if (hi == 0)
    hi = lo + 16;   /* unknown stack: only our own frame is safe to read */
  while (fp >= lo && fp + 16 <= hi && (fp & 7) == 0)
  {
    guint64 next = ((guint64 *) fp)[0];
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

static inline guint64
mt_hash_frames (const guint64 * frames, guint n)
{
  guint64 h = 0xcbf29ce484222325ULL ^ n;
  guint i;
  for (i = 0; i != n; i++)
  {
    h ^= frames[i];
    h *= 0x100000001b3ULL;
    h ^= h >> 29;
  }
  return h | 1;
}

/* Room for a len-byte STACK record in the definitions buffer (caller holds the stack lock). */
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

/* A stack's id (its slot in the stack table), interning it on first sight: its definition goes
 * to the drain through mt_defs before the id is used, so no row is ever shipped without one. */
static guint32
mt_intern (MtSlot * s, const guint64 * frames, guint n)
{
  guint64 h = mt_hash_frames (frames, n);
  guint64 mask = mt_config.stack_mask;
  guint64 i;
  guint probe;
  guint32 result = MT_DROPPED_STACK;

  for (probe = 0; probe != 64; probe++)
  {
    i = (h + probe) & mask;
    guint64 v = mt_stack_table[i];
    if (v == h)
      return (guint32) i;
    if (v == 0)
      break;
  }

  if (!mt_lock_patiently (&mt_globals.stack_lock))
  {
    s->counters[MT_C_DROPPED_STACKS]++;
    return MT_DROPPED_STACK;
  }
  for (probe = 0; probe != 64; probe++)
  {
    i = (h + probe) & mask;
    guint64 v = mt_stack_table[i];
    if (v == h)
    {
      result = (guint32) i;
      break;
    }
    if (v == 0)
    {
      guint64 len = sizeof (MtStackRecord) + 8 * (guint64) n;
      guint8 * rec = mt_defs_reserve (len);
      if (rec != NULL)
      {
        MtStackRecord * r = (MtStackRecord *) rec;
        guint64 * out = (guint64 *) (rec + sizeof (MtStackRecord));
        guint k;
        r->type = MT_REC_STACK;
        r->nframes = (guint8) n;
        r->reserved = 0;
        r->stack_id = (guint32) i;
        for (k = 0; k != n; k++)
          out[k] = frames[k];
        mt_store_release (&mt_core.defs_head, mt_core.defs_head + len);
        mt_stack_list[mt_core.n_stacks] = (guint32) i;
        mt_store_release (&mt_core.n_stacks, mt_core.n_stacks + 1);
        mt_stack_table[i] = h;
        g_atomic_pointer_add (&mt_globals.stacks_interned, 1);
        result = (guint32) i;
      }
      break;
    }
  }
  mt_unlock (&mt_globals.stack_lock);
  if (result == MT_DROPPED_STACK)
    s->counters[MT_C_DROPPED_STACKS]++;
  return result;
}

/* ---- the live-pointer table ------------------------------------------ */

static inline guint64
mt_live_bucket (guint64 p)
{
  guint64 h = p * 0x9e3779b97f4a7c15ULL;
  return (h >> 32) & mt_config.live_mask;
}

static inline guint32
mt_tick_k (guint k)
{
  return ((guint32) mt_core.tick & ((1u << MT_LIVE_TICK_BITS) - 1)) | ((guint32) k << MT_LIVE_TICK_BITS);
}

/* Remembers block p (its size, stack and sampling multiplier k); FALSE when its bucket is full. */
static gboolean
mt_live_insert (guint64 p, guint64 size, guint32 stack_id, guint k, guint spins)
{
  guint64 b = mt_live_bucket (p);
  volatile guint64 * ways = &mt_live_table[b * MT_LIVE_WAYS];
  guint i;
#ifdef __TINYC__
  gboolean ok = FALSE;
  if (!mt_trylock (&mt_live_locks[b], spins))
    return FALSE;
  for (i = 0; i != MT_LIVE_WAYS; i++)
  {
    if (ways[i] == 0)
    {
      MtLiveMeta * m = &mt_live_meta[b * MT_LIVE_WAYS + i];
      m->size = size;
      m->stack_id = stack_id;
      m->tick_k = mt_tick_k (k);
      ways[i] = p;
      g_atomic_int_add (&mt_live_occupancy[b], 1);
      ok = TRUE;
      break;
    }
  }
  mt_unlock (&mt_live_locks[b]);
  return ok;
#else
  (void) spins;
  for (i = 0; i != MT_LIVE_WAYS; i++)
  {
    guint64 expected = 0;
    if (ways[i] == 0 && __atomic_compare_exchange_n (&ways[i], &expected, p, FALSE, __ATOMIC_SEQ_CST,
        __ATOMIC_RELAXED))
    {
      /* Only the thread that frees p reads this entry, and p is not handed out before we return. */
      MtLiveMeta * m = &mt_live_meta[b * MT_LIVE_WAYS + i];
      m->size = size;
      m->stack_id = stack_id;
      m->tick_k = mt_tick_k (k);
      __atomic_fetch_add (&mt_live_occupancy[b], 1, __ATOMIC_SEQ_CST);
      return TRUE;
    }
  }
  return FALSE;
#endif
}

/* Only the thread freeing p can remove p, and p cannot be handed out again
 * before the real free runs, so removal needs no lock. */
static inline gboolean
mt_live_remove (guint64 p, MtLiveMeta * out)
{
  guint64 b = mt_live_bucket (p);
  volatile guint64 * ways;
  guint i;
  if (mt_live_occupancy[b] == 0)
    return FALSE;
  ways = &mt_live_table[b * MT_LIVE_WAYS];
  for (i = 0; i != MT_LIVE_WAYS; i++)
  {
    if (ways[i] == p)
    {
      *out = mt_live_meta[b * MT_LIVE_WAYS + i];
      /* The entry is read before the way is offered to another insert. */
      mt_store_release (&ways[i], 0);
      MT_ADD32 (&mt_live_occupancy[b], -1);
      return TRUE;
    }
  }
  return FALSE;
}

/* ---- aggregates -------------------------------------------------------- */

/* Stack ids and pseudo ids (NO_STACK, DROPPED_STACK, NESTED_STACK) to aggregate rows and back. */
static inline guint64
mt_row_of (guint32 stack_id)
{
  if (stack_id <= mt_config.stack_mask)
    return stack_id;
  return mt_config.stack_mask + 1 + (0xFFFFFFFFu - stack_id);
}

static inline guint32
mt_id_of_row (guint64 row)
{
  if (row <= mt_config.stack_mask)
    return (guint32) row;
  return 0xFFFFFFFFu - (guint32) (row - mt_config.stack_mask - 1);
}

static inline volatile guint64 *
mt_agg_lane (MtSlot * s, guint64 row)
{
  guint64 lanes = mt_config.agg_lanes;
  return &mt_agg[(row * lanes + (mt_slot_index (s) & (lanes - 1))) * MT_AGG_STRIDE];
}

/* The peak.  mt_core.peak_epoch counts the times tracked bytes reached a new high.  Before a lane
 * of a row changes, if its snapshot belongs to an older epoch, the lane saves its live value as
 * the value at the current peak (the epoch has not moved since that peak, so nothing in the lane
 * changed since).  A row's value at the peak is then its snapshot where the snapshot's epoch is
 * the current one, and its live value elsewhere: raising the peak costs O(1), however many
 * stacks there are.
 *
 * What is exact: everything one thread does (its changes and the peaks they cause are in
 * program order), so a single-threaded burst is exact to the byte.  With several threads, a
 * change another thread makes between one thread's add to tracked_bytes and its bump of the
 * epoch is counted at the peak although it came just after it (or is missed, for a change
 * whose row was touched before the add and committed after the bump): the composition is off
 * by at most the blocks that were in flight on other threads at that instant, and the peak
 * bytes themselves are a true high-water mark of tracked_bytes. */
static inline void
mt_agg_touch (volatile guint64 * a)
{
  guint64 e = mt_core.peak_epoch;
  if (G_UNLIKELY (a[MT_A_SNAP_EPOCH] != e))
  {
    a[MT_A_SNAP_BYTES] = a[MT_A_BYTES] - a[MT_A_FREED_BYTES];
    a[MT_A_SNAP_COUNT] = a[MT_A_ALLOCS] - a[MT_A_FREES];
    mt_store_release (&a[MT_A_SNAP_EPOCH], e);
  }
}

/* After the row's counters changed: the drain clears the flag before it reads the row. */
static inline void
mt_agg_dirty_row (guint64 row)
{
  if (mt_agg_dirty[row] == 0)
    mt_agg_dirty[row] = 1;
}

static void
mt_raise_peak (guint64 bytes)
{
  guint spins;
  for (spins = 0; spins != 4096; spins++)
  {
    if (bytes <= mt_core.peak_bytes)
      return;
    if (MT_ADD32 (&mt_core.peak_lock, 1) == 0)
    {
      if (bytes > mt_core.peak_bytes)
      {
        mt_core.peak_bytes = bytes;
        mt_core.peak_t_us = (guint64) g_get_monotonic_time ();
        mt_store_release (&mt_core.peak_epoch, mt_core.peak_epoch + 1);
      }
      MT_ADD32 (&mt_core.peak_lock, -1);
      return;
    }
    MT_ADD32 (&mt_core.peak_lock, -1);
  }
}

static inline void
mt_tracked_add (gint64 delta)
{
  gint64 now = (gint64) MT_ADD64 (&mt_core.tracked_bytes, delta) + delta;
  if (delta > 0 && (guint64) now > mt_core.peak_bytes)
    mt_raise_peak ((guint64) now);
}

/* ---- events ----------------------------------------------------------- */

static inline guint64
mt_next_random (MtSlot * s)
{
  guint64 x = s->rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  s->rng = x;
  return x;
}

/* Natural logarithm without libm: x = m * 2^e, ln x = e ln 2 + 2 atanh((m-1)/(m+1)). */
static gdouble
mt_ln (gdouble x)
{
  union { gdouble d; guint64 u; } v;
  gint e;
  gdouble m, t, t2, sum;
  v.d = x;
  e = (gint) ((v.u >> 52) & 0x7ff) - 1023;
  v.u = (v.u & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL;
  m = v.d;
  if (m > 1.41421356237)
  {
    m *= 0.5;
    e++;
  }
  t = (m - 1.0) / (m + 1.0);
  t2 = t * t;
  sum = t * (1.0 + t2 * (1.0 / 3 + t2 * (1.0 / 5 + t2 * (1.0 / 7 + t2 * (1.0 / 9 + t2 * (1.0 / 11))))));
  return e * 0.69314718055994530942 + 2.0 * sum;
}

/* Exponentially distributed gap (mean = interval) between sampled bytes. */
static gint64
mt_next_gap (MtSlot * s)
{
  gdouble u = ((gdouble) (gint64) (mt_next_random (s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  gint64 gap = (gint64) (-mt_ln (u) * (gdouble) (gint64) mt_config.sample_interval);
  return gap > 0 ? gap : 1;
}

/* The stack of the call being hooked: frames[0] is the caller's return address. */
static guint
mt_call_stack (MtSlot * s, guint kind, gpointer fp, guint64 * frames, guint16 * flags)
{
  gboolean truncated;
  guint n = mt_walk (s, fp, frames, (guint) mt_config.max_frames, &truncated);
  if (n > 0 && kind < 64 && (mt_slow_kinds & (1ULL << kind)) != 0)
  {
    GumInvocationContext * ic = gum_interceptor_get_current_invocation ();
    if (ic != NULL)
      frames[0] = (guint64) (gsize) gum_invocation_context_get_return_address (ic) & mt_config.code_mask;
  }
  if (truncated)
  {
    *flags |= MT_FLAG_TRUNCATED;
    s->counters[MT_C_TRUNCATED_STACKS]++;
  }
  return n;
}

#ifdef __TINYC__
# define MT_NOINLINE
#else
# define MT_NOINLINE __attribute__ ((noinline))
#endif

/* A block of a tracked size was allocated: its stack, its live-table entry, its row. */
static MT_NOINLINE void
mt_track_alloc (MtSlot * s, guint kind, guint64 p, guint64 size, gpointer fp)
{
  guint16 flags = 0;
  guint64 weight = size;
  guint k = 0;
  gboolean want_stack, want_live, tracked;
  guint32 stack_id = MT_NO_STACK;
  guint64 row;
  volatile guint64 * a;

  want_stack = size >= mt_config.stack_threshold;
  want_live = size >= mt_config.live_threshold;

  /* Byte-weighted Poisson sampling (heapprofd) over the bytes the stack layer
   * does not already capture exactly. */
  if (!want_stack && mt_config.sample_interval != 0)
  {
    if (size >= mt_config.sample_interval)
    {
      want_stack = TRUE;
      flags |= MT_FLAG_SAMPLED;   /* sampled with certainty: its weight is its size */
    }
    else
    {
      s->countdown -= (gint64) size;
      if (s->countdown <= 0)
      {
        guint64 n = 0;
        while (s->countdown <= 0)
        {
          s->countdown += mt_next_gap (s);
          n++;
        }
        k = n > 255 ? 255 : (guint) n;
        weight = (guint64) k * mt_config.sample_interval;
        want_stack = TRUE;
        flags |= MT_FLAG_SAMPLED;
      }
    }
    if (flags & MT_FLAG_SAMPLED)
      s->counters[MT_C_SAMPLED]++;
  }

  if (!want_stack && !want_live)
    return;

  if (want_stack)
  {
    guint64 frames[MT_MAX_FRAMES];
    guint n = mt_call_stack (s, kind, fp, frames, &flags);
    stack_id = mt_intern (s, frames, n);
  }

  /* Every block with a stack is tracked, whatever its size: its free must find its row. */
  tracked = mt_live_insert (p, size, stack_id, k, 4096);
  row = mt_row_of (stack_id);
  a = mt_agg_lane (s, row);
  if (tracked)
  {
    flags |= MT_FLAG_LIVE;
    mt_agg_touch (a);
    MT_ADD64 (&a[MT_A_ALLOCS], 1);
    MT_ADD64 (&a[MT_A_BYTES], size);
    if (k != 0)
      MT_ADD64 (&a[MT_A_EXTRA_WEIGHT], weight - size);
  }
  else
  {
    s->counters[MT_C_LIVE_TABLE_FULL]++;
    MT_ADD64 (&a[MT_A_UNTRACKED], 1);
    MT_ADD64 (&a[MT_A_UNTRACKED_BYTES], size);
  }
  if (k != 0)
  {
    MT_ADD64 (&a[MT_A_SAMPLED], 1);
    MT_ADD64 (&a[MT_A_SAMPLED_BYTES], size);
    MT_ADD64 (&a[MT_A_SAMPLED_WEIGHT], weight);
    MT_ADD64 (&a[MT_A_SAMPLED_COUNT_FP], (weight << MT_AGG_FP_SHIFT) / (size != 0 ? size : 1));
  }
  mt_agg_dirty_row (row);
  if (tracked)
    mt_tracked_add ((gint64) size);

  if (mt_config.events)
  {
    MtAllocRecord * rec = (MtAllocRecord *) mt_ring_reserve (s, sizeof (MtAllocRecord));
    if (rec != NULL)
    {
      rec->type = MT_REC_ALLOC;
      rec->kind = (guint8) kind;
      rec->flags = flags;
      rec->stack_id = stack_id;
      rec->ptr = p;
      rec->size = size;
      rec->weight = weight;
      mt_ring_commit (s, sizeof (MtAllocRecord));
    }
  }
}

/* Every allocation of every kind goes through here: exact counts first. */
static inline void
mt_count_call (MtSlot * s, guint kind, guint64 size)
{
  guint t = mt_tier (size);
  mt_bump (&s->counters[MT_C_CALLS + kind], 1);
  mt_bump (&s->counters[MT_C_BYTES + kind], size);
  mt_bump (&s->counters[MT_C_TIER_CALLS + t], 1);
  mt_bump (&s->counters[MT_C_TIER_BYTES + t], size);
}

/* After an allocation whose call is counted already. */
static inline void
mt_on_allocated (MtSlot * s, guint kind, gpointer p, guint64 size, gpointer fp)
{
  if (G_UNLIKELY (p == NULL))
  {
    mt_bump (&s->counters[MT_C_FAILED_ALLOCS], 1);
    s->last_ptr = 0;
    return;
  }
  s->last_size = size;
  s->last_ptr = (guint64) p;
  /* track_min: the smallest size anything is kept for (0 while sampling). */
  if (G_UNLIKELY (size >= mt_config.track_min))
  {
    gint prev = mt_guard (s);
    mt_track_alloc (s, kind, (guint64) p, size, fp);
    mt_set_busy (s, prev);
  }
}

static inline void
mt_on_alloc (MtSlot * s, guint kind, gpointer p, guint64 size, gpointer fp)
{
  mt_count_call (s, kind, size);
  mt_on_allocated (s, kind, p, size, fp);
}

/* A tracked block went away: its row's frees (and temporaries), tracked bytes. */
static void
mt_release_tracked (MtSlot * s, const MtLiveMeta * m, gboolean temporary)
{
  guint64 row = mt_row_of (m->stack_id);
  volatile guint64 * a = mt_agg_lane (s, row);
  guint k = m->tick_k >> MT_LIVE_TICK_BITS;
  mt_agg_touch (a);
  MT_ADD64 (&a[MT_A_FREES], 1);
  MT_ADD64 (&a[MT_A_FREED_BYTES], m->size);
  if (k != 0)
    MT_ADD64 (&a[MT_A_EXTRA_WEIGHT_FREED], (guint64) k * mt_config.sample_interval - m->size);
  if (temporary)
  {
    MT_ADD64 (&a[MT_A_TEMP], 1);
    MT_ADD64 (&a[MT_A_TEMP_BYTES], m->size);
  }
  mt_agg_dirty_row (row);
  mt_tracked_add (-(gint64) m->size);
}

/* A tracked block leaves the live table: its row, and the event record in events mode. */
static MT_NOINLINE void
mt_release_live (MtSlot * s, guint kind, guint64 p, guint64 size, gboolean temporary)
{
  MtLiveMeta m;
  if (!mt_live_remove (p, &m))
    return;
  s->counters[MT_C_TRACKED_FREES]++;
  mt_release_tracked (s, &m, temporary);
  if (mt_config.events)
  {
    MtFreeRecord * rec = (MtFreeRecord *) mt_ring_reserve (s, sizeof (MtFreeRecord));
    if (rec != NULL)
    {
      rec->type = MT_REC_FREE;
      rec->kind = (guint8) kind;
      rec->flags = 0;
      rec->reserved = 0;
      rec->ptr = p;
      rec->size = size;
      mt_ring_commit (s, sizeof (MtFreeRecord));
    }
  }
}

/* A block goes away (free, or the old half of a realloc); counting the call is the caller's job.
 * `from_hook`: p comes from a hooked entry of the C library itself (so, on glibc, it has a chunk
 * header), not from a logger event. */
static inline void
mt_on_release (MtSlot * s, guint kind, gpointer p, guint64 size, gboolean from_hook)
{
  gboolean temporary = FALSE;
  guint64 chunk_min;
  if (p == NULL)
    return;
  if ((guint64) p == s->last_ptr)
  {
    /* No other allocation on this thread since this one: a temporary allocation. */
    temporary = TRUE;
    mt_bump (&s->counters[MT_C_TEMP_CALLS], 1);
    mt_bump (&s->counters[MT_C_TEMP_BYTES], s->last_size);
    /* last_ptr stays: p is gone, and only an allocation can give this address out again. */
  }
  /* glibc: the chunk size sits in the word before the block (its free reads it next), and a
   * tracked block's chunk is larger than track_min: most frees end here without a table lookup. */
  chunk_min = mt_config.chunk_min;
  if (from_hook && chunk_min != 0 && (((const guint64 *) p)[-1] & ~(guint64) 7) < chunk_min)
    return;
  if (mt_live_occupancy[mt_live_bucket ((guint64) p)] != 0)
  {
    gint prev = mt_guard (s);
    mt_release_live (s, kind, (guint64) p, size, temporary);
    mt_set_busy (s, prev);
  }
}

/* ---- nested calls ----------------------------------------------------- */

static inline void
mt_ncount (MtSlot * s, guint index, guint64 v)
{
  MT_ADD64 (&s->ncount[index], v);
}

static void
mt_nested_count (MtSlot * s, guint kind, guint64 size, gboolean alloc, gint sign)
{
  guint64 one = sign > 0 ? 1 : (guint64) -1;
  guint64 bytes = sign > 0 ? size : (guint64) 0 - size;
  mt_ncount (s, MT_C_CALLS + kind, one);
  mt_ncount (s, MT_C_NESTED_CALLS, one);
  if (alloc)
  {
    guint t = mt_tier (size);
    mt_ncount (s, MT_C_BYTES + kind, bytes);
    mt_ncount (s, MT_C_TIER_CALLS + t, one);
    mt_ncount (s, MT_C_TIER_BYTES + t, bytes);
    mt_ncount (s, MT_C_NESTED_BYTES, bytes);
  }
}

/* A call made while the thread's slot was busy.  Inside memtrace's own set-up it is ours and not
 * counted.  Otherwise it is the target's (a signal handler, or the allocator itself inside a
 * compound entry, told apart in mt_reconcile): counted by kind, bytes and tier like any call,
 * its release applied to the live table, its block tracked without a stack (walking it, interning
 * it and the events ring are what the interrupted call may be in the middle of). */
static MT_NOINLINE void
mt_nested (MtSlot * s, guint kind, guint64 p, guint64 size, guint64 old, gboolean alloc)
{
  gint busy = s->busy;
  MtLiveMeta m;
  if (busy == MT_BUSY_OWN)
  {
    mt_ncount (s, MT_C_OWN_CALLS, 1);
    return;
  }
  mt_nested_count (s, kind, size, alloc, 1);
  s->last_ptr = 0;
  if (old != 0 && mt_live_remove (old, &m))
  {
    mt_ncount (s, MT_C_TRACKED_FREES, 1);
    mt_release_tracked (s, &m, FALSE);
  }
  if (busy == MT_BUSY_COMPOUND)
  {
    gssize i = (gssize) MT_ADD64 (&s->nested_seq, 1);
    MtNested * e = &s->nested[i & (MT_NESTED_LOG - 1)];
    e->kind = alloc ? kind : kind | 0x100;
    e->ptr = p;
    e->old_ptr = old;
    e->size = size;
    return;
  }
  if (alloc && p != 0 && (size >= mt_config.live_threshold || size >= mt_config.stack_threshold))
  {
    guint64 row = mt_row_of (MT_NESTED_STACK);
    volatile guint64 * a = mt_agg_lane (s, row);
    if (mt_live_insert (p, size, MT_NESTED_STACK, 0, 16))
    {
      mt_agg_touch (a);
      MT_ADD64 (&a[MT_A_ALLOCS], 1);
      MT_ADD64 (&a[MT_A_BYTES], size);
      mt_agg_dirty_row (row);
      mt_tracked_add ((gint64) size);
    }
    else
    {
      mt_ncount (s, MT_C_LIVE_TABLE_FULL, 1);
      MT_ADD64 (&a[MT_A_UNTRACKED], 1);
      MT_ADD64 (&a[MT_A_UNTRACKED_BYTES], size);
      mt_agg_dirty_row (row);
    }
  }
}

/* After a compound entry's real call returned: the nested calls it made itself (the block it
 * returns, or the block it was given) are the allocator's own and leave the counts again. */
static void
mt_reconcile (MtSlot * s, gssize seq0, guint64 result, guint64 old)
{
  gssize end = s->nested_seq;
  gssize i;
  if (end == seq0)
    return;
  if (end - seq0 > MT_NESTED_LOG)
  {
    mt_ncount (s, MT_C_NESTED_UNRECONCILED, (guint64) (end - seq0 - MT_NESTED_LOG));
    seq0 = end - MT_NESTED_LOG;
  }
  for (i = seq0; i != end; i++)
  {
    MtNested * e = &s->nested[i & (MT_NESTED_LOG - 1)];
    if ((e->ptr != 0 && e->ptr == result) || (e->old_ptr != 0 && e->old_ptr == old))
    {
      mt_nested_count (s, (guint) (e->kind & 0xff), e->size, (e->kind & 0x100) == 0, -1);
      mt_ncount (s, MT_C_NESTED_INTERNAL, 1);
    }
  }
}

/* ---- call sites of aliased entries ------------------------------------- */

/* Counts a call of an aliased entry by its call site (the return address); the agent reads the
 * sites, tells from each site's call instruction which name it called, and moves the counts.
 * Sites are few and these calls rare: a short array in order of first sight (the agent reads
 * mt_core.n_sites entries), searched linearly. */
static void
mt_note_site (guint kind, gpointer fp, guint64 size)
{
  guint64 ra = ((guint64 *) fp)[1] & mt_config.code_mask;
  guint64 i, n;
  if ((mt_slow_kinds & (1ULL << kind)) != 0)
  {
    GumInvocationContext * ic = gum_interceptor_get_current_invocation ();
    if (ic != NULL)
      ra = (guint64) (gsize) gum_invocation_context_get_return_address (ic) & mt_config.code_mask;
  }
  if (ra == 0)
    return;
  for (;;)
  {
    n = mt_load_acquire (&mt_core.n_sites);
    for (i = 0; i != n; i++)
    {
      MtSite * site = &mt_sites[i];
      if (site->ra == ra && site->kind == kind)
      {
        MT_ADD64 (&site->calls, 1);
        MT_ADD64 (&site->bytes, size);
        return;
      }
    }
    if (n == MT_N_SITES || !mt_trylock (&mt_core.sites_lock, 4096))
      return;   /* the agent leaves such calls with the hooked name */
    if (mt_core.n_sites == n)
    {
      mt_sites[n].ra = ra;
      mt_sites[n].kind = kind;
      mt_sites[n].calls = 0;
      mt_sites[n].bytes = 0;
      mt_store_release (&mt_core.n_sites, n + 1);
    }
    mt_unlock (&mt_core.sites_lock);
  }
}

/* ---- host side: drain and snapshot ------------------------------------ */

static void
mt_retire (MtSlot * s)
{
  guint j;
  for (j = 0; j != MT_N_COUNTERS; j++)
  {
    mt_globals.retired[j] += s->counters[j] + s->ncount[j];
    s->ncount[j] = 0;
  }
  s->last_ptr = 0;
  s->nested_seq = 0;
  if (s->has_ring && s->ring != NULL)
  {
    if (mt_trylock (&mt_globals.ring_free_lock, 100000))
    {
      mt_globals.ring_owner_free[mt_globals.ring_free_top++] =
          (gint) ((guint64) (s->ring - mt_ring_pool) / mt_config.ring_size);
      mt_unlock (&mt_globals.ring_free_lock);
    }
  }
  s->has_ring = 0;
  s->ring = NULL;
  s->state = MT_SLOT_FREE;
  mt_barrier ();
  s->claim = 0;
}

/* Copies [tail, head) of a ring into out; returns the bytes copied. */
static guint64
mt_copy_ring (guint8 * out, const guint8 * ring, guint64 size, guint64 tail, guint64 n)
{
  guint64 off = tail & (size - 1);
  guint64 first = MIN (n, size - off);
  guint64 k;
  for (k = 0; k + 8 <= first; k += 8)
    *(guint64 *) (out + k) = *(const guint64 *) (ring + off + k);
  for (; k < first; k++)
    out[k] = ring[off + k];
  for (k = 0; k + 8 <= n - first; k += 8)
    *(guint64 *) (out + first + k) = *(const guint64 *) (ring + k);
  for (; k < n - first; k++)
    out[first + k] = ring[k];
  return n;
}

/* Every thread's pending event records (events mode), as chunks; retires exited threads. */
static guint64
mt_drain_rings (guint8 * out, guint64 cap, guint64 used)
{
  gint i, hw = mt_globals.slots_hw;
  guint64 size = mt_config.ring_size;

  for (i = 0; i < hw; i++)
  {
    MtSlot * s = &mt_slots[i];
    gint state = s->state;
    guint64 head, tail, n;
    if (state == MT_SLOT_FREE || !s->has_ring)
    {
      if (state == MT_SLOT_DEAD)
        mt_retire (s);
      continue;
    }
    head = (guint64) g_atomic_pointer_add (&s->head, 0);
    tail = s->tail;
    n = head - tail;
    if (n != 0)
    {
      MtChunkHeader * chunk = (MtChunkHeader *) (out + used);   /* written only if it fits */
      if (used + sizeof (MtChunkHeader) + n > cap)
      {
        mt_drain_info.more = 1;
        break;
      }
      chunk->tid = (guint32) s->tid;
      chunk->length = (guint32) n;
      used += sizeof (MtChunkHeader);
      used += mt_copy_ring (out + used, s->ring, size, tail, n);
      g_atomic_pointer_add (&s->tail, (gssize) n);
    }
    if (state == MT_SLOT_DEAD)
      mt_retire (s);
  }
  return used;
}

/* A row's running totals: the sum of its lanes. */
static void
mt_row_totals (guint64 row, guint64 * out)
{
  guint64 lanes = mt_config.agg_lanes;
  volatile guint64 * a = &mt_agg[row * lanes * MT_AGG_STRIDE];
  guint64 l;
  guint f;
  for (f = 0; f != MT_AGG_STRIDE; f++)
    out[f] = 0;
  for (l = 0; l != lanes; l++)
    for (f = 0; f != MT_AGG_STRIDE; f++)
      out[f] += a[l * MT_AGG_STRIDE + f];
}

static inline guint64
mt_rows (void)
{
  return mt_config.stack_mask + 1 + MT_N_PSEUDO_STACKS;
}

/* The row at position i of the drain's walk: interned stacks in order, then the pseudo stacks. */
static inline guint64
mt_walk_row (guint64 i, guint64 n_stacks)
{
  return i < n_stacks ? mt_stack_list[i] : mt_config.stack_mask + 1 + (i - n_stacks);
}

/* Changed rows as AGG records (their running totals, changed fields only). */
static guint64
mt_drain_rows (guint8 * out, guint64 cap, guint64 used)
{
  guint64 n_stacks = mt_load_acquire (&mt_core.n_stacks);
  guint64 i, total = n_stacks + MT_N_PSEUDO_STACKS;
  guint64 start = used;
  MtChunkHeader * chunk = (MtChunkHeader *) (out + used);
  if (used + sizeof (MtChunkHeader) > cap)
  {
    mt_drain_info.more = 1;
    return used;
  }
  used += sizeof (MtChunkHeader);
  for (i = 0; i != total; i++)
  {
    guint64 row = mt_walk_row (i, n_stacks);
    guint64 now[MT_AGG_STRIDE];
    guint64 * shipped = &mt_agg_shipped[row * MT_AGG_STRIDE];
    guint32 mask = 0;
    guint nvalues = 0, f;
    MtAggRecord * r;
    guint64 * values;
    if (mt_agg_dirty[row] == 0)
      continue;
    mt_agg_dirty[row] = 0;
    mt_barrier ();
    mt_row_totals (row, now);
    for (f = 0; f != MT_AGG_STRIDE; f++)
    {
      if (((guint32) MT_AGG_SHIPPED_MASK & (1u << f)) != 0 && now[f] != shipped[f])
      {
        mask |= 1u << f;
        nvalues++;
      }
    }
    if (mask == 0)
      continue;
    if (used + sizeof (MtAggRecord) + 8 * (guint64) nvalues > cap)
    {
      mt_agg_dirty[row] = 1;
      mt_drain_info.more = 1;
      break;
    }
    r = (MtAggRecord *) (out + used);
    values = (guint64 *) (out + used + sizeof (MtAggRecord));
    r->type = MT_REC_AGG;
    r->nvalues = (guint8) nvalues;
    r->reserved = 0;
    r->stack_id = mt_id_of_row (row);
    r->mask = mask;
    r->reserved2 = 0;
    nvalues = 0;
    for (f = 0; f != MT_AGG_STRIDE; f++)
    {
      if ((mask & (1u << f)) != 0)
        values[nvalues++] = now[f];
    }
    used += sizeof (MtAggRecord) + 8 * (guint64) nvalues;
    mt_core.live_blocks += (gint64) ((now[MT_A_ALLOCS] - now[MT_A_FREES])
        - (shipped[MT_A_ALLOCS] - shipped[MT_A_FREES]));
    for (f = 0; f != MT_AGG_STRIDE; f++)
      shipped[f] = now[f];
  }
  if (used == start + sizeof (MtChunkHeader))
    return start;
  chunk->tid = 0;
  chunk->length = (guint32) (used - start - sizeof (MtChunkHeader));
  return used;
}

/* A row's (bytes, count) at the peak of epoch e: per lane, its snapshot if that was taken in
 * epoch e, else its live value (which cannot have changed since the peak without a snapshot:
 * the counters are read before the epoch, and a writer stores the epoch before it changes them). */
static void
mt_row_at_peak (guint64 row, guint64 e, gint64 * bytes, gint64 * count)
{
  guint64 lanes = mt_config.agg_lanes;
  volatile guint64 * a = &mt_agg[row * lanes * MT_AGG_STRIDE];
  guint64 l;
  *bytes = 0;
  *count = 0;
  for (l = 0; l != lanes; l++, a += MT_AGG_STRIDE)
  {
    guint64 b = a[MT_A_BYTES] - a[MT_A_FREED_BYTES];
    guint64 c = a[MT_A_ALLOCS] - a[MT_A_FREES];
    if (mt_load_acquire (&a[MT_A_SNAP_EPOCH]) == e)
    {
      b = a[MT_A_SNAP_BYTES];
      c = a[MT_A_SNAP_COUNT];
    }
    *bytes += (gint64) b;
    *count += (gint64) c;
  }
}

/* The composition at the peak (a PEAK_HEAD, then one PEAK per row with bytes there), when the
 * peak moved: at most once a second while the window runs, always in the final drain. */
static guint64
mt_drain_peak (guint8 * out, guint64 cap, guint64 used, gboolean final)
{
  guint64 e = mt_load_acquire (&mt_core.peak_epoch);
  guint64 now_us = (guint64) g_get_monotonic_time ();
  guint attempt;
  if (e == 0 || e == mt_core.shipped_epoch)
    return used;
  if (!final && now_us - mt_core.composition_us < 1000000)
    return used;
  for (attempt = 0; attempt != (final ? 8u : 1u); attempt++)
  {
    guint64 start = used, pos, n_stacks, i, total, peak_bytes, peak_t;
    MtChunkHeader * chunk = (MtChunkHeader *) (out + start);
    MtPeakHeadRecord * head;
    guint32 nstacks = 0;
    gint64 count_sum = 0;
    e = mt_load_acquire (&mt_core.peak_epoch);
    peak_bytes = mt_core.peak_bytes;
    peak_t = mt_core.peak_t_us;
    n_stacks = mt_load_acquire (&mt_core.n_stacks);
    total = n_stacks + MT_N_PSEUDO_STACKS;
    pos = start + sizeof (MtChunkHeader) + sizeof (MtPeakHeadRecord);
    if (pos > cap)
    {
      mt_drain_info.more = 1;
      return used;
    }
    for (i = 0; i != total; i++)
    {
      guint64 row = mt_walk_row (i, n_stacks);
      gint64 b, c;
      MtPeakRecord * r;
      mt_row_at_peak (row, e, &b, &c);
      if (b == 0 && c == 0)
        continue;
      if (pos + sizeof (MtPeakRecord) > cap)
      {
        mt_drain_info.more = 1;
        return used;
      }
      r = (MtPeakRecord *) (out + pos);
      r->type = MT_REC_PEAK;
      r->reserved = 0;
      r->reserved2 = 0;
      r->stack_id = mt_id_of_row (row);
      r->bytes = (guint64) b;
      r->count = (guint64) c;
      pos += sizeof (MtPeakRecord);
      nstacks++;
      count_sum += c;
    }
    if (mt_load_acquire (&mt_core.peak_epoch) != e)
      continue;   /* a new peak while we read: the values are of no single instant */
    head = (MtPeakHeadRecord *) (out + start + sizeof (MtChunkHeader));
    head->type = MT_REC_PEAK_HEAD;
    head->reserved = 0;
    head->reserved2 = 0;
    head->nstacks = nstacks;
    head->epoch = e;
    head->bytes = peak_bytes;
    head->count = (guint64) count_sum;
    head->t_us = peak_t;
    chunk->tid = 0;
    chunk->length = (guint32) (pos - start - sizeof (MtChunkHeader));
    mt_core.shipped_epoch = e;
    mt_core.composition_us = now_us;
    return pos;
  }
  return used;
}

/* The final drain: every block still in the live table, as LIVE records. */
static guint64
mt_drain_live (guint8 * out, guint64 cap, guint64 used)
{
  guint64 start = used;
  guint64 n = (mt_config.live_mask + 1) * MT_LIVE_WAYS;
  guint64 i;
  MtChunkHeader * chunk = (MtChunkHeader *) (out + used);
  if (used + sizeof (MtChunkHeader) > cap)
  {
    mt_drain_info.more = 1;
    return used;
  }
  used += sizeof (MtChunkHeader);
  for (i = mt_core.live_cursor; i != n; i++)
  {
    guint64 p = mt_live_table[i];
    MtLiveMeta * m;
    MtLiveRecord * r;
    if (p == 0)
      continue;
    if (used + sizeof (MtLiveRecord) > cap)
    {
      mt_drain_info.more = 1;
      break;
    }
    m = &mt_live_meta[i];
    r = (MtLiveRecord *) (out + used);
    r->type = MT_REC_LIVE;
    r->k = (guint8) (m->tick_k >> MT_LIVE_TICK_BITS);
    r->reserved = 0;
    r->stack_id = m->stack_id;
    r->ptr = p;
    r->size = m->size;
    r->tick = m->tick_k & ((1u << MT_LIVE_TICK_BITS) - 1);
    r->reserved2 = 0;
    used += sizeof (MtLiveRecord);
    mt_core.live_dumped++;
  }
  mt_core.live_cursor = i;
  if (i == n)
    mt_core.live_done = 1;
  if (used == start + sizeof (MtChunkHeader))
    return start;
  chunk->tid = 0;
  chunk->length = (guint32) (used - start - sizeof (MtChunkHeader));
  return used;
}

/* The TOP_STACKS rows with the most live bytes, from the shipped totals. */
static void
mt_top_rows (void)
{
  guint64 n_stacks = mt_load_acquire (&mt_core.n_stacks);
  guint64 i, total = n_stacks + MT_N_PSEUDO_STACKS, n = 0;
  for (i = 0; i != total; i++)
  {
    guint64 row = mt_walk_row (i, n_stacks);
    guint64 * sh = &mt_agg_shipped[row * MT_AGG_STRIDE];
    gint64 live = (gint64) (sh[MT_A_BYTES] - sh[MT_A_FREED_BYTES]);
    guint64 j;
    if (live <= 0)
      continue;
    if (n == MT_TOP_STACKS && live <= (gint64) mt_top[2 * (n - 1) + 1])
      continue;
    j = n < MT_TOP_STACKS ? n++ : n - 1;
    while (j > 0 && (gint64) mt_top[2 * (j - 1) + 1] < live)
    {
      mt_top[2 * j] = mt_top[2 * (j - 1)];
      mt_top[2 * j + 1] = mt_top[2 * (j - 1) + 1];
      j--;
    }
    mt_top[2 * j] = mt_id_of_row (row);
    mt_top[2 * j + 1] = (guint64) live;
  }
  mt_drain_info.n_top = n;
}

/* One drain into out (at most cap bytes): stack definitions, events (events mode), changed rows,
 * the peak's composition when it moved, and with `final` the live table.  mt_drain_info says
 * whether to call again (the buffer filled up) and what the core holds now.  Returns the bytes
 * written. */
guint64
mt_drain (guint8 * out, guint64 cap, guint64 final)
{
  guint64 used = 0;
  guint64 head = mt_load_acquire (&mt_core.defs_head);
  guint64 tail = mt_core.defs_tail;
  MtDrainInfo * info = &mt_drain_info;

  info->more = 0;
  mt_core.tick++;

  if (head != tail && sizeof (MtChunkHeader) + (head - tail) <= cap)
  {
    MtChunkHeader * chunk = (MtChunkHeader *) out;
    chunk->tid = 0;
    chunk->length = (guint32) (head - tail);
    used = sizeof (MtChunkHeader);
    used += mt_copy_ring (out + used, mt_defs, mt_config.defs_size, tail, head - tail);
    mt_store_release (&mt_core.defs_tail, head);
  }
  else if (head != tail)
  {
    info->more = 1;
  }

  used = mt_drain_rings (out, cap, used);
  used = mt_drain_rows (out, cap, used);
  used = mt_drain_peak (out, cap, used, final != 0);
  if (final && !mt_core.live_done && !info->more)
    used = mt_drain_live (out, cap, used);

  mt_top_rows ();
  info->now_us = (guint64) g_get_monotonic_time ();
  info->tracked_bytes = (guint64) mt_core.tracked_bytes;
  info->tracked_blocks = (guint64) mt_core.live_blocks;
  info->peak_epoch = mt_load_acquire (&mt_core.peak_epoch);
  info->peak_bytes = mt_core.peak_bytes;
  info->peak_t_us = mt_core.peak_t_us;
  info->stacks = mt_core.n_stacks;
  info->tick = mt_core.tick;
  info->live_dumped = mt_core.live_dumped;
  info->live_done = mt_core.live_done;
  return used;
}

/* Sums every slot's counters (plus retired threads) into out[MT_N_COUNTERS].
 * Slots are read without locks: each counter is an aligned 64-bit word
 * written by one thread, so a snapshot is at worst a few calls behind. */
void
mt_snapshot (guint64 * out)
{
  gint i, hw = mt_globals.slots_hw;
  guint j;
  for (j = 0; j != MT_N_COUNTERS; j++)
    out[j] = mt_globals.retired[j];
  for (i = 0; i < hw; i++)
  {
    MtSlot * s = &mt_slots[i];
    if (s->state == MT_SLOT_FREE)
      continue;
    for (j = 0; j != MT_N_COUNTERS; j++)
      out[j] += s->counters[j] + s->ncount[j];
  }
}

/* Zeroes every table the agent did not get fresh from the OS; called once before the hooks go in. */
void
mt_reset (void)
{
  guint64 i;
  guint8 * g = (guint8 *) &mt_globals;
  for (i = 0; i != sizeof (MtGlobals); i++)
    g[i] = 0;
  g = (guint8 *) &mt_core;
  for (i = 0; i != sizeof (MtCore); i++)
    g[i] = 0;
  g = (guint8 *) &mt_drain_info;
  for (i = 0; i != sizeof (MtDrainInfo); i++)
    g[i] = 0;
  g = (guint8 *) mt_sites;
  for (i = 0; i != MT_N_SITES * sizeof (MtSite); i++)
    g[i] = 0;
  for (i = 0; i != 2 * MT_TOP_STACKS; i++)
    mt_top[i] = 0;
  for (i = 0; i != mt_config.n_slots * sizeof (MtSlot); i++)
    ((guint8 *) mt_slots)[i] = 0;
  for (i = 0; i <= mt_config.stack_mask; i++)
    mt_stack_table[i] = 0;
  for (i = 0; i != (mt_config.live_mask + 1) * MT_LIVE_WAYS; i++)
    mt_live_table[i] = 0;
  for (i = 0; i <= mt_config.live_mask; i++)
  {
    mt_live_occupancy[i] = 0;
    mt_live_locks[i] = 0;
  }
}

guint64
mt_slot_size (void)
{
  return sizeof (MtSlot);
}

guint64
mt_globals_size (void)
{
  return sizeof (MtGlobals);
}

guint64
mt_core_size (void)
{
  return sizeof (MtCore);
}

guint64
mt_config_size (void)
{
  return sizeof (MtConfig);
}

guint64
mt_lost_calls (void)
{
  return (guint64) mt_globals.lost_calls;
}

guint64
mt_live_count (void)
{
  return (guint64) mt_core.live_blocks;
}

guint64
mt_stacks_interned (void)
{
  return (guint64) mt_globals.stacks_interned;
}

guint64
mt_sites_used (void)
{
  return mt_load_acquire (&mt_core.n_sites);
}

guint64
mt_monotonic_us (void)
{
  return (guint64) g_get_monotonic_time ();
}
