/*
 * memtrace agent core, what a hooked call does with a block: per-stack aggregate rows and the peak,
 * counting every call, tracking a block (its stack, its live-table entry, its row, its event
 * record), its release and temporaries, nested calls (signal handlers, the allocator inside its
 * own entries) and the call sites of aliased entries.  Compiled after core.c in the same CModule
 * (malloc: core.c, track.c, drain.c, malloc.c); docs/agents.md ("The malloc core") tells the
 * whole story.
 */

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

/* Rows are lane-major: lane l of row r is at (l * rows + r) * MT_AGG_HOT (its cold fields at the same
 * place in mt_agg_cold, times MT_AGG_COLD), rows being
 * stack_mask + 1 + MT_N_PSEUDO_STACKS.  A stack only one thread touches then costs one row of
 * resident memory (its other lanes' pages are never written), and ids are dense, so rows pack. */
static inline guint64
mt_agg_rows (void)
{
  return mt_config.stack_mask + 1 + MT_N_PSEUDO_STACKS;
}

static inline volatile guint64 *
mt_agg_lane (MtSlot * s, guint64 row)
{
  return &mt_agg[((guint64) s->lane * mt_agg_rows () + row) * MT_AGG_HOT];
}

/* The thread's lane of a row's cold fields (field f at [f - MT_AGG_HOT]), the row marked as having
 * some first: the drain reads cold lanes only for marked rows (a row's dirty flag, set after the add,
 * makes the drain look at it again), and the marks only once any is set (a run with none -- every
 * block tracked, no sampling, no failed call -- never maps a page of them, not even the zero page). */
static inline volatile guint64 *
mt_agg_cold_lane (MtSlot * s, guint64 row)
{
  if (mt_agg_cold_rows[row] == 0)
  {
    mt_agg_cold_rows[row] = 1;
    if (mt_core.any_cold == 0)
      mt_core.any_cold = 1;
  }
  return &mt_agg_cold[((guint64) s->lane * mt_agg_rows () + row) * MT_AGG_COLD];
}

/* Field f of a row's cold lane c. */
#define MT_COLD(c, f) (&(c)[(f) - MT_AGG_HOT])

/* An add to the thread's lane of a row: where the lane is the thread's own and a signal handler
 * cannot tear the add (MT_LIGHT_HOOKS: one `add` to memory), a plain add -- the lock prefix of
 * an atomic one was most of a tracked allocation's cost; a signal handler's nested call on the
 * same thread adds atomically, which the plain add cannot interleave with.  A shared lane adds
 * atomically. */
static inline void
mt_lane_add (MtSlot * s, volatile guint64 * p, guint64 v)
{
  if (MT_LIGHT_HOOKS && !s->lane_shared)
    mt_bump ((guint64 *) p, v);
  else
    MT_ADD64 (p, v);
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

/* The allocator's usable size of a block (malloc_usable_size, Darwin's malloc_size), or NULL. */
extern gsize (* volatile mt_usable_size) (gconstpointer);

static inline void mt_ncount (MtSlot * s, guint index, guint64 v);

/* memtrace's own thread allocated (or released) a block: its usable bytes, kept apart so the
 * calibration can take them out of the allocator's in-use figures. */
static void
mt_own_alloc (MtSlot * s, guint64 p)
{
  gsize (* size_of) (gconstpointer) = mt_usable_size;
  if (p != 0 && size_of != NULL)
    mt_ncount (s, MT_C_OWN_BYTES, size_of ((gconstpointer) p));
}

static void
mt_own_release (MtSlot * s, guint64 p)
{
  gsize (* size_of) (gconstpointer) = mt_usable_size;
  if (p != 0 && size_of != NULL)
    mt_ncount (s, MT_C_OWN_FREED_BYTES, size_of ((gconstpointer) p));
}

/* Raises the peak to `bytes`.  With gcc, lock-free: a compare-and-swap loop never gives up and
 * never waits for another thread (one preempted, or the very thread a signal handler
 * interrupted); two threads raising it at once each bump the epoch, and the later mark wins.
 * TinyCC has no compare-and-swap: a lock whose holder may be the interrupted thread itself can
 * only be tried for a while; a raise that gives up is counted (peak_missed) so the peak is never
 * left low silently.  No clock is read here: a heap that keeps growing raises the peak on nearly
 * every allocation, and the time-stamp counter alone cost ~27 ns a read on the project's machine
 * (a virtual one), ~30 % of a tracked allocation in a growing heap; the drains place the peak in
 * time instead (drain.c, mt_place_peak). */
#ifdef __TINYC__
static inline void mt_ncount (MtSlot * s, guint index, guint64 v);
#endif
static void
mt_raise_peak (guint64 bytes)
{
#ifdef __TINYC__
  guint spins;
  MtSlot * s;
  for (spins = 0; spins != 4096; spins++)
  {
    if (bytes <= mt_core.peak_bytes)
      return;
    if (MT_ADD32 (&mt_core.peak_lock, 1) == 0)
    {
      if (bytes > mt_core.peak_bytes)
      {
        mt_core.peak_bytes = bytes;
        mt_store_release (&mt_core.peak_epoch, mt_core.peak_epoch + 1);
      }
      MT_ADD32 (&mt_core.peak_lock, -1);
      return;
    }
    MT_ADD32 (&mt_core.peak_lock, -1);
  }
  if (bytes > mt_core.peak_bytes && (s = mt_slot ()) != NULL)
    mt_ncount (s, MT_C_PEAK_MISSED, 1);
#else
  guint64 cur = __atomic_load_n (&mt_core.peak_bytes, __ATOMIC_ACQUIRE);
#if MT_SOLO
  if (mt_core.solo == MT_SOLO_ON)
  {
    /* The only writer (and its own signal handlers: each store whole, the epoch's add one instruction). */
    if (bytes > cur)
    {
      mt_core.peak_bytes = bytes;
      mt_xadd_solo (&mt_core.peak_epoch, 1);
    }
    return;
  }
#endif
  while (bytes > cur)
  {
    if (__atomic_compare_exchange_n (&mt_core.peak_bytes, &cur, bytes, FALSE, __ATOMIC_SEQ_CST,
        __ATOMIC_ACQUIRE))
    {
      MT_ADD64 (&mt_core.peak_epoch, 1);
      return;
    }
  }
#endif
}

/* `held`: credit (below) already in the total that the caller's thread has not spent -- taken off
 * the figure the peak is compared with, so that a signal handler's allocation on a thread holding
 * credit does not raise its peak by that credit. */
static inline void
mt_tracked_add (gint64 delta, gint64 held)
{
  gint64 now;
#if MT_SOLO
  if (mt_core.solo == MT_SOLO_ON)
    now = (gint64) mt_xadd_solo ((volatile guint64 *) &mt_core.tracked_bytes, (guint64) delta) + delta;
  else
#endif
    now = (gint64) MT_ADD64 (&mt_core.tracked_bytes, delta) + delta;
  now -= held;
  /* (now > 0: a free counted on another thread before its allocation can leave the total below
   * zero for a moment, which as unsigned would read as a peak of ~2^64.) */
  if (delta > 0 && now > 0 && (guint64) now > mt_core.peak_bytes)
    mt_raise_peak ((guint64) now);
}

/* The tracked-bytes change of a thread's own, outermost call (never a nested one: a signal handler
 * may interrupt this between its read and its write of the credit).  With several threads every
 * change was a locked add to the one tracked_bytes line, which the threads then fought over: 26-74 %
 * of a 4-thread malloc/free storm's samples sat on that add.  So a thread keeps the bytes it frees
 * as a credit instead, up to MT_TRACKED_CREDIT_MAX, and its next allocations spend the credit
 * before they add anything: a thread that frees and allocates small blocks in turn no longer
 * writes the shared line at all.  tracked_bytes is then never below the bytes really tracked
 * (only frees wait), so the peak is never missed; with several threads it may read high by at most
 * the credit other threads hold at that instant (MT_TRACKED_CREDIT_MAX each).  A lone thread
 * raises the peak only with no credit left: the single-threaded peak stays exact to the byte.
 * The drains show tracked bytes less every thread's credit; an exited thread's credit is folded
 * in when its slot is retired. */
#define MT_TRACKED_CREDIT_MAX 4096

static inline void
mt_tracked_add_own (MtSlot * s, gint64 delta)
{
  gint64 credit;
#if MT_SOLO
  if (mt_core.solo == MT_SOLO_ON)
  {
    mt_tracked_add (delta, 0);
    return;
  }
#endif
  credit = mt_credit_get (&s->tracked_credit);
  if (delta < 0)
  {
    credit -= delta;
    if (credit <= MT_TRACKED_CREDIT_MAX)
    {
      mt_credit_set (&s->tracked_credit, credit);
      return;
    }
    mt_credit_set (&s->tracked_credit, 0);
    mt_tracked_add (-credit, 0);
    return;
  }
  if (credit >= delta)
  {
    mt_credit_set (&s->tracked_credit, credit - delta);
    return;
  }
  /* What the credit does not cover goes to the total, with no credit left: the peak compares it. */
  mt_credit_set (&s->tracked_credit, 0);
  mt_tracked_add (delta - credit, 0);
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

/* The stack of a call that came through Interceptor.replace (a slow kind): our caller is
 * Frida's trampoline, and the caller's return address on the stack is Frida's.  The walk starts
 * from the registers the hooked entry was called with instead (its caller's return address, the
 * stack pointer after that return, the frame pointer then): a caller without frame pointers
 * (libstdc++'s operator new(size_t, align_val_t), which calls aligned_alloc) is walked through
 * by its unwind table, exactly as the fast hooks' callers are.  0: no invocation to start from. */
static guint
mt_walk_invocation (MtSlot * s, guint64 * frames, guint max, gboolean * truncated, MtHashed * hashed)
{
  GumInvocationContext * ic = gum_interceptor_get_current_invocation ();
  guint64 lo = (guint64) &ic, hi = s->stack_hi, ra, sp, fp;
  guint n = 0;
  *truncated = FALSE;
  if (ic == NULL || ic->cpu_context == NULL)
    return 0;
  ra = (guint64) (gsize) gum_invocation_context_get_return_address (ic) & mt_config.code_mask;
#if defined(__x86_64__)
  sp = ic->cpu_context->rsp + 8;
  fp = ic->cpu_context->rbp;
#elif defined(__aarch64__)
  /* ARCH-UNVERIFIED: arm64 is not run by the tests (no return address pushed: sp as it was). */
  sp = ic->cpu_context->sp;
  fp = ic->cpu_context->fp;
#else
  return 0;
#endif
  if (hi == 0 || sp < lo || sp > hi || ra < 4096)
    return 0;
#ifdef MT_UNWIND
  if (mt_unwind_count != 0)
  {
    MtFrameCache * fc = mt_frame_cache (s);
    n = mt_unwind_walk_regs (ra, sp, fp, hi, frames, max, truncated, &s->ucache, fc);
    if (fc != NULL)
    {
      s->counters[MT_C_FRAME_CACHE_WALKS] += fc->reused;
      mt_fc_hashed (fc, n, hashed);
    }
    return n;
  }
#endif
  frames[n++] = ra;
  return mt_walk_fp_chain (fp, sp, hi, frames, n, max, truncated);
}

/* What the thread's stack memo knows of the stack mt_call_stack_hashed gave: its id (MT_NO_STACK: not
 * yet), and the entry it came from or went into (1 + its index; 0: none), where mt_intern_known notes
 * the id once the stack is interned. */
typedef struct
{
  guint32 id;
  guint32 memo;
} MtKnownStack;

/* The stack of the call being hooked: frames[0] is the caller's return address; *hash its identity;
 * *known what the memo knows of it.  With id_enough, a stack whose id the memo knows is not copied
 * into frames (the caller only wants the id): the count is still returned. */
static guint
mt_call_stack_hashed (MtSlot * s, guint kind, gpointer fp, guint64 * frames, guint16 * flags, guint64 * hash,
    MtKnownStack * known, gboolean id_enough)
{
  gboolean truncated;
  guint n = 0, walked;
  MtHashed hashed;
  gboolean slow = kind < 64 && (mt_slow_kinds & (1ULL << kind)) != 0;
#ifdef MT_UNWIND
  MtFrameCache * fc = NULL;
  guint64 hi = s->stack_hi;
#endif
  known->id = MT_NO_STACK;
  known->memo = 0;
#ifdef MT_UNWIND
  /* A fast hook's call from a path this thread walked before: its stack from the memo (unwind.c).
   * (A slow kind's walk starts from Interceptor's invocation, not from fp: never memoized.) */
  if (!slow && mt_unwind_count != 0 && hi != 0 && (fc = mt_frame_cache (s)) != NULL)
  {
    const MtStackMemo * e = mt_memo_find (fc, (guint64) fp, (guint64) &truncated, hi, (guint) mt_config.max_frames);
    if (e != NULL)
    {
      guint k;
      n = e->n;
      if (!id_enough || e->stack_id == MT_NO_STACK)
        for (k = 0; k != n; k++)
          frames[k] = e->frames[k];
      if ((e->flags & MT_MEMO_TRUNCATED) != 0)
      {
        *flags |= MT_FLAG_TRUNCATED;
        s->counters[MT_C_TRUNCATED_STACKS]++;
      }
      s->counters[MT_C_STACK_MEMO_HITS]++;
      *hash = e->hash;
      known->id = e->stack_id;
      known->memo = 1 + (guint32) (e - fc->memo);
      return n;
    }
  }
#endif
  hashed.ok = FALSE;
  hashed.sum = 0;
  hashed.pw_n = 0;
  if (slow)
    n = mt_walk_invocation (s, frames, (guint) mt_config.max_frames, &truncated, &hashed);
  if (n == 0)
  {
    hashed.ok = FALSE;
    n = mt_walk (s, fp, frames, (guint) mt_config.max_frames, &truncated, &hashed);
    if (n > 0 && kind < 64 && (mt_slow_kinds & (1ULL << kind)) != 0)
    {
      GumInvocationContext * ic = gum_interceptor_get_current_invocation ();
      hashed.ok = FALSE;
      if (ic != NULL)
        frames[0] = (guint64) (gsize) gum_invocation_context_get_return_address (ic) & mt_config.code_mask;
    }
  }
  walked = n;
  if (truncated)
  {
    /* The innermost frames are kept; a last pseudo frame says the outer ones were cut (room for it:
     * max_frames < MT_MAX_FRAMES), so the stack itself is marked, not only its events. */
    *flags |= MT_FLAG_TRUNCATED;
    s->counters[MT_C_TRUNCATED_STACKS]++;
    if (n < MT_MAX_FRAMES)
    {
      frames[n] = MT_TRUNCATED_FRAME;
      hashed.sum += mt_hash_g (MT_TRUNCATED_FRAME) * hashed.pw_n;
      n++;
    }
    else
      hashed.ok = FALSE;
  }
  *hash = hashed.ok ? mt_hash_final (hashed.sum, n) : mt_hash_frames (frames, n);
#ifdef MT_UNWIND
  if (fc != NULL)
    known->memo = mt_memo_store (fc, (guint64) fp, hi, (guint) mt_config.max_frames, frames, n, walked, truncated,
        *hash);
#endif
  return n;
}

static guint
mt_call_stack (MtSlot * s, guint kind, gpointer fp, guint64 * frames, guint16 * flags)
{
  guint64 hash;
  MtKnownStack known;
  return mt_call_stack_hashed (s, kind, fp, frames, flags, &hash, &known, FALSE);
}

/* The id of the stack mt_call_stack_hashed just gave: the memo's, else interned (and then memoized
 * with it: ids never move, and a dropped stack is not remembered, so that it is tried again). */
static guint32
mt_intern_known (MtSlot * s, const guint64 * frames, guint n, guint64 hash, const MtKnownStack * known)
{
  guint32 id;
  if (known->id != MT_NO_STACK)
    return known->id;
  id = mt_intern_hashed (s, frames, n, hash);
#ifdef MT_UNWIND
  if (id <= mt_config.stack_mask && known->memo != 0)
    mt_frame_cache (s)->memo[known->memo - 1].stack_id = id;
#endif
  return id;
}

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
  volatile guint64 * a, * c;

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

  /* The block's live-table lines, asked for before the stack: a fresh part of the table is a miss
   * (a growing heap's every allocation), which the stack's memo check or walk then overlaps. */
  {
    const guint8 * e = (const guint8 *) mt_live_entries (mt_live_bucket (p));
    MT_PREFETCH_W (e);
    MT_PREFETCH_W (e + 64);
  }

  if (want_stack)
  {
    guint64 frames[MT_MAX_FRAMES];
    guint64 hash;
    MtKnownStack known;
    guint n = mt_call_stack_hashed (s, kind, fp, frames, &flags, &hash, &known, TRUE);
    stack_id = mt_intern_known (s, frames, n, hash, &known);
  }

  /* The row's lines (a program with thousands of stacks seldom finds its row in the cache), asked
   * for before the live table's lines, so that their misses overlap. */
  row = mt_row_of (stack_id);
  a = mt_agg_lane (s, row);
  MT_PREFETCH_W (a);
  MT_PREFETCH_W (a + 8);
  MT_PREFETCH_W (&mt_agg_dirty[row]);
  /* Every block with a stack is tracked, whatever its size: its free must find its row. */
  tracked = mt_live_insert (p, size, stack_id, k, 4096);
  /* (The row's cold fields only for a sampled block or one the table had no room for.) */
  c = (k != 0 || !tracked) ? mt_agg_cold_lane (s, row) : NULL;
  if (tracked)
  {
    flags |= MT_FLAG_LIVE;
    mt_agg_touch (a);
    mt_lane_add (s, &a[MT_A_ALLOCS], 1);
    mt_lane_add (s, &a[MT_A_BYTES], size);
    if (k != 0)
      mt_lane_add (s, MT_COLD (c, MT_A_EXTRA_WEIGHT), weight - size);
  }
  else
  {
    s->counters[MT_C_LIVE_TABLE_FULL]++;
    mt_lane_add (s, MT_COLD (c, MT_A_UNTRACKED), 1);
    mt_lane_add (s, MT_COLD (c, MT_A_UNTRACKED_BYTES), size);
  }
  if (k != 0)
  {
    mt_lane_add (s, MT_COLD (c, MT_A_SAMPLED), 1);
    mt_lane_add (s, MT_COLD (c, MT_A_SAMPLED_BYTES), size);
    mt_lane_add (s, MT_COLD (c, MT_A_SAMPLED_WEIGHT), weight);
    mt_lane_add (s, MT_COLD (c, MT_A_SAMPLED_COUNT_FP), (weight << MT_AGG_FP_SHIFT) / (size != 0 ? size : 1));
  }
  mt_agg_dirty_row (row);
  if (tracked)
    mt_tracked_add_own (s, (gint64) size);

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
  /* (With MT_LIGHT_HOOKS a signal handler's allocation could land between these two stores and
   * leave its size with this block: a temporary's bytes would be off, never its count.) */
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

/* A tracked block went away: its row's frees (and temporaries), tracked bytes.  `own`: the thread's
 * own outermost call (its credit may be used), not a nested or shared slot's. */
static void
mt_release_tracked (MtSlot * s, const MtLiveMeta * m, gboolean temporary, gboolean own)
{
  guint64 row = mt_row_of (m->stack_id);
  volatile guint64 * a = mt_agg_lane (s, row);
  guint k = m->k;
  mt_agg_touch (a);
  mt_lane_add (s, &a[MT_A_FREES], 1);
  mt_lane_add (s, &a[MT_A_FREED_BYTES], m->size);
  if (k != 0)
    mt_lane_add (s, MT_COLD (mt_agg_cold_lane (s, row), MT_A_EXTRA_WEIGHT_FREED),
        (guint64) k * mt_config.sample_interval - m->size);
  if (temporary)
  {
    mt_lane_add (s, &a[MT_A_TEMP], 1);
    mt_lane_add (s, &a[MT_A_TEMP_BYTES], m->size);
  }
  mt_agg_dirty_row (row);
  if (own)
    mt_tracked_add_own (s, -(gint64) m->size);
  else
    mt_tracked_add (-(gint64) m->size, 0);
}

/* In events mode, the FREE record of a tracked block (a full ring drops it and counts the drop). */
static void
mt_emit_free (MtSlot * s, guint kind, guint64 p, guint64 size)
{
  MtFreeRecord * rec;
  if (!mt_config.events)
    return;
  rec = (MtFreeRecord *) mt_ring_reserve (s, sizeof (MtFreeRecord));
  if (rec == NULL)
    return;
  rec->type = MT_REC_FREE;
  rec->kind = (guint8) kind;
  rec->flags = 0;
  rec->reserved = 0;
  rec->ptr = p;
  rec->size = size;
  mt_ring_commit (s, sizeof (MtFreeRecord));
}

/* A tracked block leaves the live table: its row, and the event record in events mode.  (b, i):
 * where the hook's look found it (mt_live_find), so the table is not searched twice. */
static MT_NOINLINE void
mt_release_live (MtSlot * s, guint kind, guint64 p, guint64 size, gboolean temporary, guint64 b, gint i)
{
  MtLiveMeta m;
  if (!mt_live_remove_found (p, b, i, &m))
    return;
  s->counters[MT_C_TRACKED_FREES]++;
  mt_release_tracked (s, &m, temporary, TRUE);
  mt_emit_free (s, kind, p, size);
}

/* A block goes away (free, or the old half of a realloc); counting the call is the caller's job.
 * `from_hook`: p comes from a hooked entry of the C library itself (so, on glibc, it has a chunk
 * header), not from a logger event. */
static inline gboolean
mt_check_temporary (MtSlot * s, guint64 p)
{
  if (p == 0 || p != s->last_ptr)
    return FALSE;
  /* No other allocation on this thread since this one: a temporary allocation. */
  mt_bump (&s->counters[MT_C_TEMP_CALLS], 1);
  mt_bump (&s->counters[MT_C_TEMP_BYTES], s->last_size);
  /* last_ptr stays: p is gone, and only an allocation can give this address out again. */
  return TRUE;
}

static inline void
mt_on_release (MtSlot * s, guint kind, gpointer p, guint64 size, gboolean from_hook)
{
  gboolean temporary;
  guint64 chunk_min, b;
  gint way;
  if (p == NULL)
    return;
  /* When every block is tracked (chunk_min 0), a free is mostly a cache miss in the live table
   * (blocks are freed in another order than they were allocated) and one in the block's chunk
   * header, which glibc's free reads and writes next: asked for together here, they overlap
   * instead of coming one after the other. */
  b = mt_live_bucket ((guint64) p);
  chunk_min = mt_config.chunk_min;
  if (chunk_min == 0)
  {
    MT_PREFETCH (mt_live_entries (b));
    MT_PREFETCH ((const guint8 *) mt_live_entries (b) + 64);
    if (from_hook)
      MT_PREFETCH_W ((const guint8 *) p - 8);
  }
  temporary = mt_check_temporary (s, (guint64) p);
  /* glibc: the chunk size sits in the word before the block (its free reads it next), and a
   * tracked block's chunk is larger than track_min: most frees end here without a table lookup. */
  if (from_hook && chunk_min != 0 && (((const guint64 *) p)[-1] & ~(guint64) 7) < chunk_min)
    return;
  if ((way = mt_live_find ((guint64) p, &b)) >= 0)
  {
    gint prev = mt_guard (s);
    mt_release_live (s, kind, (guint64) p, size, temporary, b, way);
    mt_set_busy (s, prev);
  }
}

/* ---- nested calls ----------------------------------------------------- */

/* A nested count: where one `add` to memory cannot be torn by a signal handler (MT_LIGHT_HOOKS),
 * a plain add to the thread's own slot -- a compound entry's nested calls (glibc's realloc (NULL, n)
 * calls malloc: CPython) each cost a dozen locked adds, counted and then reconciled away; the shared
 * slot, which threads without one of their own add to at once, adds atomically. */
static inline void
mt_ncount (MtSlot * s, guint index, guint64 v)
{
  if (MT_LIGHT_HOOKS && s->busy != MT_BUSY_SHARED)
    mt_bump ((guint64 *) &s->ncount[index], v);
  else
    MT_ADD64 (&s->ncount[index], v);
}

static void
mt_nested_count (MtSlot * s, guint kind, guint64 size, gboolean alloc, gint sign)
{
  guint64 one = sign > 0 ? 1 : (guint64) -1;
  guint64 bytes = sign > 0 ? size : (guint64) 0 - size;
  /* The shared slot's calls are not nested in anything: they are said as unslotted instead. */
  gboolean shared = s->busy == MT_BUSY_SHARED;
  mt_ncount (s, MT_C_CALLS + kind, one);
  mt_ncount (s, shared ? MT_C_UNSLOTTED_CALLS : MT_C_NESTED_CALLS, one);
  if (alloc)
  {
    guint t = mt_tier (size);
    mt_ncount (s, MT_C_BYTES + kind, bytes);
    mt_ncount (s, MT_C_TIER_CALLS + t, one);
    mt_ncount (s, MT_C_TIER_BYTES + t, bytes);
    if (!shared)
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
    /* A free comes here before the real free (the block is still there to be sized); a
     * realloc after its real call, its old block already sized (mt_own_release). */
    if (alloc)
      mt_own_alloc (s, p);
    else
      mt_own_release (s, old);
    return;
  }
  mt_nested_count (s, kind, size, alloc, 1);
  s->last_ptr = 0;
  if (old != 0 && mt_live_remove (old, &m))
  {
    mt_ncount (s, MT_C_TRACKED_FREES, 1);
    mt_release_tracked (s, &m, FALSE, FALSE);
  }
  if (busy == MT_BUSY_COMPOUND)
  {
#if MT_LIGHT_HOOKS
    gssize i = (gssize) mt_bump_fetch ((guint64 *) &s->nested_seq, 1);   /* only this thread's calls add */
#else
    gssize i = (gssize) MT_ADD64 (&s->nested_seq, 1);
#endif
    MtNested * e = &s->nested[i & (MT_NESTED_LOG - 1)];
    e->kind = alloc ? kind : kind | 0x100;
    e->ptr = p;
    e->old_ptr = old;
    e->size = size;
    return;
  }
  if (alloc && p != 0 && (size >= mt_config.live_threshold || size >= mt_config.stack_threshold))
  {
    /* A thread without a slot of its own would have had its stack: it was dropped, and said. */
    guint32 pseudo = busy == MT_BUSY_SHARED ? MT_DROPPED_STACK : MT_NESTED_STACK;
    guint64 row = mt_row_of (pseudo);
    volatile guint64 * a = mt_agg_lane (s, row);
    if (pseudo == MT_DROPPED_STACK && size >= mt_config.stack_threshold)
      mt_ncount (s, MT_C_DROPPED_STACKS, 1);
    if (mt_live_insert (p, size, pseudo, 0, 16))
    {
      mt_agg_touch (a);
      MT_ADD64 (&a[MT_A_ALLOCS], 1);
      MT_ADD64 (&a[MT_A_BYTES], size);
      mt_agg_dirty_row (row);
      /* (The shared slot holds no credit: only a thread's own outermost calls keep one.) */
      mt_tracked_add ((gint64) size, busy == MT_BUSY_SHARED ? 0 : mt_credit_get (&s->tracked_credit));
    }
    else
    {
      volatile guint64 * c = mt_agg_cold_lane (s, row);
      mt_ncount (s, MT_C_LIVE_TABLE_FULL, 1);
      MT_ADD64 (MT_COLD (c, MT_A_UNTRACKED), 1);
      MT_ADD64 (MT_COLD (c, MT_A_UNTRACKED_BYTES), size);
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
