/*
 * memtrace agent core: per-thread slots, lock-free per-thread event rings,
 * stack interning, the live-pointer table and the drain that the agent's
 * JavaScript calls on a timer.  Compiled by Frida's CModule (TinyCC, or the
 * external gcc toolchain on Linux), so: no libc headers, no static writable
 * data (every writable global is an extern symbol the agent allocates), and
 * only g_atomic_int_add / g_atomic_pointer_add for atomics.
 *
 * The agent prepends "#define MT_DARWIN 1" or "#define MT_LINUX 1" and
 * "#define MT_ARM64 1" where relevant; memtrace.agentbuild puts the layout
 * header generated from memtrace/layout.py before this file: the record
 * structs (MtAllocRecord, MtFreeRecord, MtStackRecord, MtPadRecord,
 * MtChunkHeader), MtConfig, MT_REC_*, MT_FLAG_*, MT_K_* call kinds, MT_C_*
 * counter indexes, MT_TIER_MAX_*, MT_MAX_FRAMES, MT_LIVE_WAYS, MT_MAX_RINGS.
 * memtrace/capture.py reads the records with the same layout.
 *
 * A drained batch is a sequence of chunks: MtChunkHeader, then the thread's
 * records.  STACK records are followed by u64 frames[nframes]; a PAD record
 * says how many bytes to skip.
 */
#include <glib.h>
#include <gum/guminterceptor.h>

#define MT_SLOT_FREE 0
#define MT_SLOT_LIVE 1
#define MT_SLOT_DEAD 2

typedef struct _MtSlot MtSlot;
typedef struct _MtGlobals MtGlobals;

struct _MtSlot
{
  volatile gint claim;
  volatile gint state;
  gint busy;
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

extern MtConfig mt_config;
extern MtGlobals mt_globals;
extern MtSlot mt_slots[];
extern guint8 mt_ring_pool[];
extern volatile guint64 mt_stack_table[];
extern volatile guint64 mt_live_table[];
extern volatile gint mt_live_occupancy[];
extern volatile gint mt_live_locks[];
/* Kinds whose entry Frida could only redirect through a trampoline (Interceptor.replace):
 * there the caller's return address is off the frame-pointer chain; the invocation has it. */
extern volatile guint64 mt_slow_kinds;
/* Linux x86-64 glibc: byte offset of our key's value inside struct pthread, found by the
 * agent at start-up (0 = unknown: use pthread_getspecific).  Reading it through %fs saves
 * the call that was the single largest cost of an uninteresting malloc/free. */
extern volatile guint64 mt_tls_offset;

extern gpointer pthread_getspecific (guint key);
extern gint pthread_setspecific (guint key, gconstpointer value);
extern gpointer pthread_self (void);
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
# define G_LIKELY(x) (x)
# define G_UNLIKELY(x) (x)
#endif

static gint64 mt_next_gap (MtSlot * s);

#define MT_CFG (&mt_config)
#define MT_G (&mt_globals)

static inline void
mt_barrier (void)
{
  g_atomic_int_add (&mt_globals.fence, 0);
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

static inline guint
mt_tier (guint64 size)
{
  if (size <= MT_TIER_MAX_0) return 0;
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
  guint i, tries, marker = 64;
  MtSlot * s = NULL;
  gint ring;

  for (i = 0; i != 64; i++)
  {
    guint64 a = mt_globals.assigning[i];
    if (a != 0 && here <= a && a - here < 65536)
      return NULL;
  }
  /* 64 threads assigning at once is rare: retry a bounded number of times (a marker
   * left claimed by a thread that does not exist, in a fork child, must not hang us),
   * then give up on this call and count it lost. */
  for (tries = 0; marker == 64 && tries != 4096; tries++)
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
  if (marker == 64)
  {
    g_atomic_pointer_add (&mt_globals.lost_calls, 1);
    return NULL;
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
 * slot once its ring is empty.  The C library calls it through a stub in leaked
 * memory (agents/runtime/process.js): after the agent is torn down the stub
 * returns at once, so a thread exiting then never jumps into freed code. */
void
mt_thread_exit (gpointer value)
{
  MtSlot * s = value;
  if (s == NULL)
    return;
  mt_barrier ();
  s->state = MT_SLOT_DEAD;
}

/* Threads inside a hook right now: teardown waits for them to leave our code
 * before Frida frees it. */
guint64
mt_busy_slots (void)
{
  gint i, hw = mt_globals.slots_hw;
  guint64 n = 0;
  for (i = 0; i < hw; i++)
  {
    if (mt_slots[i].state == MT_SLOT_LIVE && mt_slots[i].busy)
      n++;
  }
  return n;
}

/* Returns the calling thread's slot marked busy, or NULL when this call is our
 * own (nested) or no slot can be had. */
static inline MtSlot *
mt_enter (void)
{
  MtSlot * s;
#if defined(MT_LINUX) && defined(__x86_64__) && !defined(__TINYC__)
  if (G_LIKELY (mt_tls_offset != 0))
  {
    guint64 self;
    __asm__ ("mov %%fs:0x10, %0" : "=r" (self));
    s = *(MtSlot * volatile *) (self + mt_tls_offset);
  }
  else
#endif
    s = pthread_getspecific ((guint) mt_config.tls_key);
  if (G_UNLIKELY (s == NULL))
  {
    s = mt_assign ();
    if (s == NULL)
      return NULL;
  }
  if (G_UNLIKELY (s->busy))
  {
    s->counters[MT_C_NESTED_CALLS]++;
    return NULL;
  }
  s->busy = 1;
  return s;
}

static inline void
mt_leave (MtSlot * s)
{
  s->busy = 0;
}

/* ---- the ring --------------------------------------------------------- */

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

  if (!mt_trylock (&mt_globals.stack_lock, 4096))
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
      guint8 * rec = mt_ring_reserve (s, len);
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
        mt_ring_commit (s, len);
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

static gboolean
mt_live_insert (guint64 p)
{
  guint64 b = mt_live_bucket (p);
  volatile guint64 * ways = &mt_live_table[b * MT_LIVE_WAYS];
  guint i;
  gboolean ok = FALSE;
  if (!mt_trylock (&mt_live_locks[b], 4096))
    return FALSE;
  for (i = 0; i != MT_LIVE_WAYS; i++)
  {
    if (ways[i] == 0)
    {
      ways[i] = p;
      g_atomic_int_add (&mt_live_occupancy[b], 1);
      ok = TRUE;
      break;
    }
  }
  mt_unlock (&mt_live_locks[b]);
  if (ok)
    g_atomic_pointer_add (&mt_globals.live_count, 1);
  return ok;
}

/* Only the thread freeing p can remove p, and p cannot be handed out again
 * before the real free runs, so removal needs no lock. */
static inline gboolean
mt_live_remove (guint64 p)
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
      ways[i] = 0;
      g_atomic_int_add (&mt_live_occupancy[b], -1);
      g_atomic_pointer_add (&mt_globals.live_count, -1);
      return TRUE;
    }
  }
  return FALSE;
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

static void
mt_record_alloc (MtSlot * s, guint kind, guint64 p, guint64 size, gpointer fp)
{
  guint16 flags = 0;
  guint64 weight = size;
  gboolean want_stack, want_live;
  guint32 stack_id = MT_NO_STACK;
  MtAllocRecord * rec;

  want_stack = size >= mt_config.stack_threshold;
  want_live = size >= mt_config.live_threshold;

  /* Byte-weighted Poisson sampling (heapprofd) over the bytes the stack layer
   * does not already capture exactly. */
  if (!want_stack && mt_config.sample_interval != 0)
  {
    if (size >= mt_config.sample_interval)
    {
      want_stack = TRUE;
      want_live = TRUE;
      flags |= MT_FLAG_SAMPLED;
    }
    else
    {
      s->countdown -= (gint64) size;
      if (s->countdown <= 0)
      {
        guint64 k = 0;
        while (s->countdown <= 0)
        {
          s->countdown += mt_next_gap (s);
          k++;
        }
        weight = k * mt_config.sample_interval;
        want_stack = TRUE;
        want_live = TRUE;
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
      flags |= MT_FLAG_TRUNCATED;
      s->counters[MT_C_TRUNCATED_STACKS]++;
    }
    stack_id = mt_intern (s, frames, n);
  }

  if (want_live)
  {
    if (mt_live_insert (p))
      flags |= MT_FLAG_LIVE;
    else
      s->counters[MT_C_LIVE_TABLE_FULL]++;
  }

  rec = (MtAllocRecord *) mt_ring_reserve (s, sizeof (MtAllocRecord));
  if (rec == NULL)
  {
    /* The host never learns of this block: forget it so its free stays quiet. */
    if (flags & MT_FLAG_LIVE)
      mt_live_remove (p);
    return;
  }
  rec->type = MT_REC_ALLOC;
  rec->kind = (guint8) kind;
  rec->flags = flags;
  rec->stack_id = stack_id;
  rec->ptr = p;
  rec->size = size;
  rec->weight = weight;
  mt_ring_commit (s, sizeof (MtAllocRecord));
}

/* Every allocation of every kind goes through here: exact counts first. */
static inline void
mt_count_call (MtSlot * s, guint kind, guint64 size)
{
  guint t = mt_tier (size);
  s->counters[MT_C_CALLS + kind]++;
  s->counters[MT_C_BYTES + kind] += size;
  s->counters[MT_C_TIER_CALLS + t]++;
  s->counters[MT_C_TIER_BYTES + t] += size;
}

static inline void
mt_on_alloc (MtSlot * s, guint kind, gpointer p, guint64 size, gpointer fp)
{
  mt_count_call (s, kind, size);
  if (G_UNLIKELY (p == NULL))
  {
    s->counters[MT_C_FAILED_ALLOCS]++;
    return;
  }
  if (size >= mt_config.live_threshold || size >= mt_config.stack_threshold || mt_config.sample_interval != 0)
    mt_record_alloc (s, kind, (guint64) p, size, fp);
}

/* A block goes away (free, or the old half of a realloc).  Only blocks in the
 * live table produce a record; counting the call is the caller's job. */
static inline void
mt_on_release (MtSlot * s, guint kind, gpointer p, guint64 size)
{
  MtFreeRecord * rec;
  if (p == NULL || mt_globals.live_count == 0)
    return;
  if (!mt_live_remove ((guint64) p))
    return;
  s->counters[MT_C_TRACKED_FREES]++;
  rec = (MtFreeRecord *) mt_ring_reserve (s, sizeof (MtFreeRecord));
  if (rec == NULL)
    return;
  rec->type = MT_REC_FREE;
  rec->kind = (guint8) kind;
  rec->flags = 0;
  rec->reserved = 0;
  rec->ptr = (guint64) p;
  rec->size = size;
  mt_ring_commit (s, sizeof (MtFreeRecord));
}

/* ---- host side: drain and snapshot ------------------------------------ */

static void
mt_retire (MtSlot * s)
{
  guint j;
  for (j = 0; j != MT_N_COUNTERS; j++)
    mt_globals.retired[j] += s->counters[j];
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

/* Copies every thread's pending records into out as chunks (MtChunkHeader, then
 * the records).  Returns the number of bytes written; stops early
 * (leaving records for the next call) when out is full. */
guint64
mt_drain (guint8 * out, guint64 cap)
{
  guint64 used = 0;
  gint i, hw = mt_globals.slots_hw;
  guint64 size = mt_config.ring_size;

  for (i = 0; i < hw; i++)
  {
    MtSlot * s = &mt_slots[i];
    gint state = s->state;
    guint64 head, tail, n, off, first;
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
        break;
      chunk->tid = (guint32) s->tid;
      chunk->length = (guint32) n;
      used += sizeof (MtChunkHeader);
      off = tail & (size - 1);
      first = MIN (n, size - off);
      {
        guint64 k;
        for (k = 0; k + 8 <= first; k += 8)
          *(guint64 *) (out + used + k) = *(guint64 *) (s->ring + off + k);
        for (; k < first; k++)
          out[used + k] = s->ring[off + k];
        for (k = 0; k + 8 <= n - first; k += 8)
          *(guint64 *) (out + used + first + k) = *(guint64 *) (s->ring + k);
        for (; k < n - first; k++)
          out[used + first + k] = s->ring[k];
      }
      used += n;
      g_atomic_pointer_add (&s->tail, (gssize) n);
    }
    if (state == MT_SLOT_DEAD)
      mt_retire (s);
  }
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
      out[j] += s->counters[j];
  }
}

/* Zeroes every table; called once before the hooks go in. */
void
mt_reset (void)
{
  guint64 i;
  guint8 * g = (guint8 *) &mt_globals;
  for (i = 0; i != sizeof (MtGlobals); i++)
    g[i] = 0;
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
  return (guint64) mt_globals.live_count;
}

guint64
mt_stacks_interned (void)
{
  return (guint64) mt_globals.stacks_interned;
}
