/*
 * memtrace agent core, the host's side: the drain the agent's JavaScript calls on a timer (stack
 * definitions, events rings, changed aggregate rows, the peak's composition, the live table at
 * the end), the counters' snapshot, the reset, and the sizes the agent checks.  Compiled after
 * core.c in the same CModule (malloc: core.c, drain.c, malloc.c); everything here runs on the
 * agent's thread, never on a hooked call.
 */

static inline void mt_top_note (guint64 row);
static void mt_place_peak (guint64 bytes);

static void
mt_retire (MtSlot * s)
{
  guint j;
  gint64 credit;
  for (j = 0; j != MT_N_COUNTERS; j++)
  {
    mt_globals.retired[j] += s->counters[j] + s->ncount[j];
    s->ncount[j] = 0;
  }
  s->last_ptr = 0;
  s->nested_seq = 0;
  /* The frees the thread kept as credit (track.c, mt_tracked_add_own) reach the total now. */
  credit = mt_credit_get (&s->tracked_credit);
  if (credit != 0)
  {
    MT_ADD64 (&mt_core.tracked_bytes, -credit);
    mt_credit_set (&s->tracked_credit, 0);
  }
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
  /* Its own lane goes back to the pool (a shared one was never taken). */
  if (!s->lane_shared && s->lane >= 0 && s->lane < MT_MAX_LANES)
    g_atomic_int_add (&mt_globals.lane_claim[s->lane], -1);
  s->lane_shared = 1;
  s->state = MT_SLOT_FREE;
  /* The dead owner's claim given back with an atomic add (a release): storing 0 would wipe the +1
   * of a thread trying the slot right now, whose -1 then left the claim at -1, the slot lost. */
  g_atomic_int_add (&s->claim, -1);
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
  gint i, hw = mt_slots_used ();
  guint64 size = mt_config.ring_size;

  for (i = 0; i < hw; i++)
  {
    MtSlot * s = &mt_slots[i];
    gint state = s->state;
    guint64 head, tail, n;
    /* Pairs with the barrier before mt_assign's and mt_thread_exit's state store: the slot's
     * ring and final counts are seen as of that state (a relaxed load alone allows older ones). */
    mt_barrier ();
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

/* The lanes that may hold counts (core.c, mt_lane_seen).  Read after the drain saw a row's change
 * (its dirty flag, then a barrier): a thread stores its lane's mark before it adds to the lane. */
static inline guint64
mt_lanes_used (void)
{
  guint64 hw = (guint64) (gint64) mt_globals.lanes_hw;
  return hw < mt_config.agg_lanes ? hw : mt_config.agg_lanes;
}

/* The lanes of the rows' cold fields that may hold anything, for calibration's count of their
 * resident pages (runtime/core.js, the cold tables' extent): none while no row had a cold add. */
guint64
mt_cold_lanes (void)
{
  return mt_core.any_cold != 0 ? mt_lanes_used () : 0;
}

/* The drain's live block count as reported: a sum read while threads run can be a free ahead of
 * its allocation (mt_row_totals), never below zero, as it is once the hooks are out. */
static inline guint64
mt_live_blocks_reported (void)
{
  gint64 blocks = mt_core.live_blocks;
  return blocks > 0 ? (guint64) blocks : 0;
}

/* The fields a free adds to: read before the fields an allocation adds to (mt_row_totals). */
#define MT_FREE_SIDE ((1u << MT_A_FREES) | (1u << MT_A_FREED_BYTES) | (1u << MT_A_TEMP) \
    | (1u << MT_A_TEMP_BYTES) | (1u << MT_A_EXTRA_WEIGHT_FREED))

/* One side of a row's lanes (the free side's fields, or the allocation side's) added into out; its
 * cold fields too when `cold`. */
static void
mt_row_side (guint64 row, guint64 * out, guint64 lanes, gboolean free_side, gboolean cold)
{
  guint64 hot_stride = mt_agg_rows () * MT_AGG_HOT;     /* one lane to the next (lane-major) */
  guint64 cold_stride = mt_agg_rows () * MT_AGG_COLD;
  volatile guint64 * a = &mt_agg[row * MT_AGG_HOT];
  volatile guint64 * c = &mt_agg_cold[row * MT_AGG_COLD];
  guint64 l;
  guint f;
  for (l = 0; l != lanes; l++)
  {
    for (f = 0; f != MT_AGG_HOT; f++)
      if (((MT_FREE_SIDE & (1u << f)) != 0) == free_side)
        out[f] += a[l * hot_stride + f];
    if (cold)
      for (f = MT_AGG_HOT; f != MT_AGG_STRIDE; f++)
        if (((MT_FREE_SIDE & (1u << f)) != 0) == free_side)
          out[f] += c[l * cold_stride + f - MT_AGG_HOT];
  }
}

/* A row's running totals: the sum of its lanes, read while the program's threads add to them.
 * Every lane's free side is read first, then (after a fence) the allocation side: a free counted
 * here had its allocation counted before it -- in program order on its own thread, the common
 * case -- so a row never reads more frees than allocations from a thread that allocated and freed
 * between two reads (256 churning threads read -1 live blocks, issue 21).  A free on another
 * thread can still come first: the allocating thread counts after its block is in the live table
 * (track.c), so the drain clamps what it reports (mt_drain). */
static void
mt_row_totals (guint64 row, guint64 * out, gboolean cold)
{
  guint f;
  for (f = 0; f != MT_AGG_STRIDE; f++)
    out[f] = 0;
  mt_row_side (row, out, mt_lanes_used (), TRUE, cold);
  mt_barrier ();
  /* (Again: a lane a new thread took since, whose allocation a free above may have followed;
   * lanes are only ever added.) */
  mt_row_side (row, out, mt_lanes_used (), FALSE, cold);
}

/* The row at position i of the drain's walk: interned stacks in order (ids are dense), then the
 * pseudo stacks. */
static inline guint64
mt_walk_row (guint64 i, guint64 n_stacks)
{
  return i < n_stacks ? i : mt_config.stack_mask + 1 + (i - n_stacks);
}

/* A chunk of records the drain writes at out[*used]: its header's room taken (FALSE, and another
 * drain asked for, when there is none), then closed over what was written after it — or given
 * back when nothing was. */
static gboolean
mt_chunk_open (guint64 cap, guint64 * used)
{
  if (*used + sizeof (MtChunkHeader) > cap)
  {
    mt_drain_info.more = 1;
    return FALSE;
  }
  *used += sizeof (MtChunkHeader);
  return TRUE;
}

static guint64
mt_chunk_close (guint8 * out, guint64 start, guint64 used)
{
  MtChunkHeader * chunk = (MtChunkHeader *) (out + start);
  if (used == start + sizeof (MtChunkHeader))
    return start;
  chunk->tid = 0;
  chunk->length = (guint32) (used - start - sizeof (MtChunkHeader));
  return used;
}

/* Writes 0 to the first word of [lo, hi) and to every page start inside it: words of rows never
 * shipped, 0 already. */
static void
mt_touch_for_write (volatile guint64 * lo, volatile guint64 * hi)
{
  guint64 a;
  if (lo >= hi)
    return;
  *lo = 0;
  for (a = ((guint64) lo + MT_PAGE_MIN) & ~(MT_PAGE_MIN - 1); a < (guint64) hi; a += MT_PAGE_MIN)
    *(volatile guint64 *) a = 0;
}

/* A stack row the drain has not shipped yet (nor written: its words are 0, its page maybe unread). */
static inline gboolean
mt_row_unshipped (guint64 row)
{
  return row <= mt_config.stack_mask && row + 1 >= mt_core.shipped_rows;
}

/* mt_agg_shipped and mt_agg_live are the drain's alone, and each of their pages is written before it
 * is first read.  A first read maps the kernel's shared zero page, and the write after it faults a
 * second time and flushes the TLB of every CPU the process runs on -- an interrupt of the target's
 * own threads: 13 ms of the drain's time on CPython's benchmark (its tens of thousands of stacks),
 * all in do_wp_page.  Stack rows are shipped in id order: mt_core.shipped_rows is 1 + the rows
 * [0, n) written so far, 0 before the first drain, which writes the pseudo stacks' rows (at the end). */
static void
mt_ship_rows_writable (guint64 row)
{
  guint64 from;
  if (mt_core.shipped_rows == 0)
  {
    guint64 pseudo = mt_config.stack_mask + 1;
    mt_touch_for_write (&mt_agg_shipped[pseudo * MT_AGG_SHIPPED_HOT],
        &mt_agg_shipped[(pseudo + MT_N_PSEUDO_STACKS) * MT_AGG_SHIPPED_HOT]);
    mt_touch_for_write ((volatile guint64 *) &mt_agg_live[pseudo],
        (volatile guint64 *) &mt_agg_live[pseudo + MT_N_PSEUDO_STACKS]);
    mt_core.shipped_rows = 1;
  }
  from = mt_core.shipped_rows - 1;
  if (row > mt_config.stack_mask || row < from)
    return;
  mt_touch_for_write (&mt_agg_shipped[from * MT_AGG_SHIPPED_HOT], &mt_agg_shipped[(row + 1) * MT_AGG_SHIPPED_HOT]);
  mt_touch_for_write ((volatile guint64 *) &mt_agg_live[from], (volatile guint64 *) &mt_agg_live[row + 1]);
  mt_core.shipped_rows = row + 2;
}

/* Every row marked dirty, once, for the final drain: a hook adds to its row with a plain add and
 * skips the dirty flag when it reads it set, and on x86 that read may pass the add still in its
 * store buffer while the drain clears the flag, fences and reads the old total -- the change then
 * waits for the row's next one, and a row's last change before the end could never be shipped.  By
 * the final drain the hooks are out and no thread is inside one: every row is compared with what was
 * shipped (rows whose totals did not move cost a read, no record). */
static void
mt_sweep_rows (void)
{
  guint64 n_stacks = mt_load_acquire (&mt_core.n_stacks), i;
  if (mt_core.rows_swept)
    return;
  mt_core.rows_swept = 1;
  for (i = 0; i != n_stacks + MT_N_PSEUDO_STACKS; i++)
    mt_agg_dirty[mt_walk_row (i, n_stacks)] = 1;
  mt_barrier ();
}

/* Changed rows as AGG records (their running totals, changed fields only). */
static guint64
mt_drain_rows (guint8 * out, guint64 cap, guint64 used)
{
  guint64 n_stacks = mt_load_acquire (&mt_core.n_stacks);
  guint64 i, total = n_stacks + MT_N_PSEUDO_STACKS;
  guint64 start = used;
  if (!mt_chunk_open (cap, &used))
    return start;
  if (mt_core.shipped_rows == 0)
    mt_ship_rows_writable (mt_config.stack_mask + 1);     /* (the pseudo stacks' rows) */
  for (i = 0; i != total; i++)
  {
    guint64 row = mt_walk_row (i, n_stacks);
    guint64 now[MT_AGG_STRIDE];
    guint64 * shipped = &mt_agg_shipped[row * MT_AGG_SHIPPED_HOT];
    guint64 * shipped_cold = &mt_agg_shipped_cold[row * MT_AGG_COLD];
    guint8 cold;
    guint32 mask = 0;
    guint nvalues = 0, f;
    MtAggRecord * r;
    guint64 * values;
    if (mt_agg_dirty[row] == 0)
      continue;
    mt_agg_dirty[row] = 0;
    mt_barrier ();
    if (mt_row_unshipped (row))
      mt_ship_rows_writable (row);
    /* Its cold lanes are read only if it ever had a cold add (the mark is set before the add it
     * stands for, and the add before the row's dirty flag, cleared above).  A first mark: its cold
     * shipped copy written before it is first read ("Pages written before they are read"); a hook's
     * late mark of 1 over this 2 only writes zeros again, and the next record carries the cold
     * totals once more -- totals are what AGG records carry. */
    cold = mt_core.any_cold != 0 ? mt_agg_cold_rows[row] : 0;
    if (cold == 1)
    {
      for (f = 0; f != MT_AGG_COLD; f++)
        shipped_cold[f] = 0;
      mt_agg_cold_rows[row] = 2;
    }
    mt_row_totals (row, now, cold != 0);
    for (f = 0; f != MT_AGG_STRIDE; f++)
    {
      guint64 was;
      if (((guint32) MT_AGG_SHIPPED_MASK & (1u << f)) == 0)
        continue;
      if (f < MT_AGG_HOT)
        was = shipped[f];
      else if (cold != 0)
        was = shipped_cold[f - MT_AGG_HOT];
      else
        continue;             /* (no cold add yet: its cold totals are 0, never shipped) */
      if (now[f] != was)
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
    for (f = 0; f != MT_AGG_SHIPPED_HOT; f++)
      shipped[f] = now[f];
    if (cold != 0)
      for (f = MT_AGG_HOT; f != MT_AGG_STRIDE; f++)
        shipped_cold[f - MT_AGG_HOT] = now[f];
    mt_agg_live[row] = (gint64) (now[MT_A_BYTES] - now[MT_A_FREED_BYTES]);
    mt_top_note (row);
  }
  return mt_chunk_close (out, start, used);
}

/* A row's (bytes, count) at the peak of epoch e: per lane, its snapshot if that was taken in
 * epoch e, else its live value (which cannot have changed since the peak without a snapshot:
 * the counters are read before the epoch, and a writer stores the epoch before it changes them). */
static void
mt_row_at_peak (guint64 row, guint64 e, gint64 * bytes, gint64 * count)
{
  guint64 lanes = mt_lanes_used ();
  volatile guint64 * a = &mt_agg[row * MT_AGG_HOT];
  guint64 l;
  *bytes = 0;
  *count = 0;
  for (l = 0; l != lanes; l++, a += mt_agg_rows () * MT_AGG_HOT)
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
    peak_bytes = mt_load_acquire (&mt_core.peak_bytes);
    mt_place_peak (peak_bytes);         /* the time shipped is these bytes' */
    peak_t = mt_core.peak_us;
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

/* Linux: the agent opens /proc/self/pagemap for the final drain (fd + 1; 0 closes it here). */
void
mt_live_pagemap (guint64 fd1, guint64 page_size)
{
  mt_core.pagemap_fd1 = fd1;
  mt_core.page_size = page_size;
}

#ifndef MT_DARWIN
extern gssize pread (gint fd, gpointer buf, gsize count, gint64 offset);
#endif

/* Pages of the live table one read of /proc/self/pagemap covers (8 bytes each: 4 KiB a read). */
#define MT_PAGE_WINDOW 512

/* The pagemap bits of MT_PAGE_WINDOW pages from `first` (valid: read), for the final live walk. */
typedef struct
{
  gboolean valid;
  guint64 first;
  guint64 bits[MT_PAGE_WINDOW / 64];   /* bit k: page first + k was written at some time (present or swapped) */
} MtPageWindow;

/* Whether bucket b lies on a page never written: its keys are all zero then, and reading them would
 * fault the page in (the table is 256 MiB of mostly untouched pages at its default size: the reads'
 * faults were most of the final drain).  FALSE when it cannot tell. */
static gboolean
mt_live_bucket_untouched (guint64 b, MtPageWindow * w)
{
#ifdef MT_DARWIN
  (void) b;
  (void) w;
  return FALSE;
#else
  guint64 fd1 = mt_core.pagemap_fd1, ps = mt_core.page_size, page, pm[MT_PAGE_WINDOW], k;
  if (fd1 == 0 || ps == 0)
    return FALSE;
  page = (guint64) (gsize) mt_live_entries (b) / ps;
  if (!w->valid || page < w->first || page >= w->first + MT_PAGE_WINDOW)
  {
    /* (A read past the end of the address space's mapped part returns fewer entries: those pages
     * count as written, so nothing is skipped that could hold a key.) */
    gssize got = pread ((gint) (fd1 - 1), pm, sizeof pm, (gint64) (page * 8));
    if (got < 8)
    {
      mt_core.pagemap_fd1 = 0;      /* unreadable: every bucket is looked at */
      return FALSE;
    }
    w->valid = TRUE;
    w->first = page;
    for (k = 0; k != MT_PAGE_WINDOW / 64; k++)
      w->bits[k] = 0;
    for (k = 0; k != MT_PAGE_WINDOW; k++)
    {
      if (k >= (guint64) got / 8 || (pm[k] >> 62) != 0)       /* bit 63 present, bit 62 swapped */
        w->bits[k / 64] |= 1ULL << (k % 64);
    }
  }
  k = page - w->first;
  return ((w->bits[k / 64] >> (k % 64)) & 1) == 0;
#endif
}

/* After bucket b was found on an untouched page: the first bucket past it that may lie on a written
 * page -- the first one on the next page the window says was written, or on the page past the
 * window (asked about then) -- so that the final drain steps over a run of untouched pages at once,
 * not bucket by bucket (cxx_work's exit walked 512 K buckets for the 100 K on written pages).
 * A bucket (96 bytes) may straddle two pages; its first way is on the first, and every insert into
 * the bucket tries that way first (core.c, mt_live_claim): its swap either takes it -- a write -- or
 * finds it taken, written before (TinyCC's locked scan takes the first empty way, way 0 if it is
 * empty); so a bucket whose first page was never written is empty whatever its second page holds. */
static guint64
mt_live_next_bucket_after_untouched (guint64 b, const MtPageWindow * w)
{
  guint64 ps = mt_core.page_size, base = (guint64) (gsize) mt_live_table, page, k, next, b_next;
  page = (guint64) (gsize) mt_live_entries (b) / ps;
  next = w->first + MT_PAGE_WINDOW;
  for (k = page - w->first + 1; k < MT_PAGE_WINDOW; k++)
  {
    if (w->bits[k / 64] == 0 && k % 64 == 0)
    {
      k += 63;
      continue;
    }
    if (((w->bits[k / 64] >> (k % 64)) & 1) != 0)
    {
      next = w->first + k;
      break;
    }
  }
  b_next = (next * ps - base + MT_LIVE_BUCKET_BYTES - 1) / MT_LIVE_BUCKET_BYTES;
  return b_next > b ? b_next : b + 1;
}

/* The final drain: every block still in the live table, as LIVE records. */
static guint64
mt_drain_live (guint8 * out, guint64 cap, guint64 used)
{
  guint64 start = used;
  guint64 n = (mt_config.live_mask + 1) * MT_LIVE_WAYS;
  guint64 i;
  MtPageWindow w;
  w.valid = FALSE;
  w.first = 0;
  if (!mt_chunk_open (cap, &used))
    return start;
  for (i = mt_core.live_cursor; i != n; i++)
  {
    guint64 p;
    MtLiveEntry * e;
    MtLiveRecord * r;
    /* Most buckets are empty (a table of 4,194,304 entries, a heap of a few thousand blocks): one
     * look at a bucket's key line skips its ways, where a way-by-way walk cost ~30 ms of the
     * target's exit -- no look at all where its page was never written, a run of such pages
     * stepped over whole. */
    if (i % MT_LIVE_WAYS == 0)
    {
      guint64 b = i / MT_LIVE_WAYS;
      if (mt_live_bucket_untouched (b, &w))
      {
        guint64 b_next = mt_live_next_bucket_after_untouched (b, &w);
        i = (b_next <= mt_config.live_mask + 1 ? b_next : mt_config.live_mask + 1) * MT_LIVE_WAYS - 1;
        continue;
      }
      /* The buckets ahead, asked for while this one is read: the written part of the table is
       * cold by the target's exit, and the hardware's prefetcher follows a stride only after a
       * while.  (With the page runs stepped over: the C++
       * program's final drain 5-6 ms -> 1-3 ms of its exit, CPython's, whose heap wrote the whole
       * table, 20 -> 7-8 ms.) */
      if (b + 8 <= mt_config.live_mask)
      {
        MT_PREFETCH (mt_live_entries (b + 8));
        MT_PREFETCH ((const guint8 *) mt_live_entries (b + 8) + 64);
      }
      if (mt_live_bucket_empty (b))
      {
        i += MT_LIVE_WAYS - 1;
        continue;
      }
    }
    p = mt_live_entry_address (i);
    /* The logger path's VM regions are not malloc blocks; its owed and suspect entries are (their
     * rows count them live), at their address (malloc.c, "the logger path's live-table entries"). */
    if (p == 0 || (p & MT_LIVE_VM) != 0)
      continue;
    p &= ~(guint64) (MT_LIVE_SUSPECT | MT_LIVE_OWED);
    if (used + sizeof (MtLiveRecord) > cap)
    {
      mt_drain_info.more = 1;
      break;
    }
    e = &MT_LIVE_ENTRY (i);
    r = (MtLiveRecord *) (out + used);
    r->type = MT_REC_LIVE;
    r->k = (guint8) mt_live_entry_k (e);
    r->reserved = 0;
    r->stack_id = mt_live_entry_stack (e);
    r->ptr = p;
    r->size = mt_live_entry_size (i, p);
    r->tick = 0;          /* (12-byte entries hold no birth tick) */
    r->reserved2 = 0;
    used += sizeof (MtLiveRecord);
    mt_core.live_dumped++;
  }
  mt_core.live_cursor = i;
  if (i == n)
    mt_core.live_done = 1;
  return mt_chunk_close (out, start, used);
}

/* The rows whose shipped live bytes changed since the last mt_top_rows (mt_drain_rows notes them), so
 * that the top stacks need not walk every row at every drain: MT_TOP_CHANGED_MAX + 1 when more changed
 * than are noted, or nothing is known (a full walk then). */
/* [0]: how many are noted; [1 ..]: the rows.  Given by the agent (core.js), as every table: TinyCC's
 * module had its own static array of them fault on the first write (an access violation in the drain
 * with the internal toolchain). */
extern guint64 mt_top_changed[];           /* 1 + MT_TOP_CHANGED_MAX */
#define mt_top_n_changed (mt_top_changed[0])

static inline void
mt_top_note (guint64 row)
{
  if (mt_top_n_changed < MT_TOP_CHANGED_MAX)
    mt_top_changed[1 + mt_top_n_changed++] = row;
  else
    mt_top_n_changed = MT_TOP_CHANGED_MAX + 1;
}

/* Whether (live a, row ra) comes before (live b, row rb) in the top: more live bytes first, then the
 * lower row (the order of the full walk, which visits rows in increasing order). */
static inline gboolean
mt_top_before (gint64 a, guint64 ra, gint64 b, guint64 rb)
{
  return a > b || (a == b && ra < rb);
}

/* Row `row` (live bytes `live`) into the sorted top[0, *n) of (row, live) pairs. */
static void
mt_top_offer (guint64 * top, guint64 * n, guint64 row, gint64 live)
{
  guint64 j;
  if (live <= 0)
    return;
  if (*n == MT_TOP_STACKS && !mt_top_before (live, row, (gint64) top[2 * (*n - 1) + 1], top[2 * (*n - 1)]))
    return;
  j = *n < MT_TOP_STACKS ? (*n)++ : *n - 1;
  while (j > 0 && mt_top_before (live, row, (gint64) top[2 * (j - 1) + 1], top[2 * (j - 1)]))
  {
    top[2 * j] = top[2 * (j - 1)];
    top[2 * j + 1] = top[2 * (j - 1) + 1];
    j--;
  }
  top[2 * j] = row;
  top[2 * j + 1] = (guint64) live;
}

/* The TOP_STACKS rows with the most live bytes, from the shipped totals.  When no row of the last top
 * lost live bytes, every other row that did not change still comes after all of them, so the new top
 * is the best of the last top and the rows that changed; otherwise (or when too many changed) a walk
 * of every row (a compact array: 8 bytes per stack, however many stacks there are). */
static void
mt_top_rows (void)
{
  guint64 n_stacks = mt_load_acquire (&mt_core.n_stacks);
  guint64 i, total = n_stacks + MT_N_PSEUDO_STACKS, n = 0;
  guint64 top[2 * MT_TOP_STACKS];
  gboolean full = mt_top_n_changed > MT_TOP_CHANGED_MAX;
  guint64 old_n = mt_drain_info.n_top;
  if (!full)
  {
    for (i = 0; i != old_n && !full; i++)
    {
      guint64 row = mt_row_of ((guint32) mt_top[2 * i]);
      if (mt_agg_live[row] < (gint64) mt_top[2 * i + 1])
        full = TRUE;
    }
  }
  if (full)
  {
    for (i = 0; i != total; i++)
    {
      guint64 row = mt_walk_row (i, n_stacks);
      /* (A row never shipped holds 0, on a page not to be read before it is written: above.) */
      mt_top_offer (top, &n, row, mt_row_unshipped (row) ? 0 : mt_agg_live[row]);
    }
  }
  else
  {
    for (i = 0; i != old_n; i++)
    {
      guint64 row = mt_row_of ((guint32) mt_top[2 * i]);
      mt_top_offer (top, &n, row, mt_agg_live[row]);
    }
    for (i = 0; i != mt_top_n_changed; i++)
    {
      guint64 row = mt_top_changed[1 + i], j;
      gboolean seen = FALSE;
      for (j = 0; j != n && !seen; j++)
        seen = top[2 * j] == row;
      if (!seen)
        mt_top_offer (top, &n, row, mt_agg_live[row]);
    }
  }
  for (i = 0; i != n; i++)
  {
    mt_top[2 * i] = mt_id_of_row (top[2 * i]);
    mt_top[2 * i + 1] = top[2 * i + 1];
  }
  mt_top_n_changed = 0;
  mt_drain_info.n_top = n;
}

/* When the peak was reached, to within one drain interval: each time the agent looks at the peak
 * (every drain, and when the hooks go in or out: mt_peak_mark), peak bytes changed since the last
 * look are placed in the middle of the interval between the two looks.  Drains run every 100 ms
 * while the window runs (a late one on a busy target widens its interval); the hooks going out
 * closes the last interval, so a stop's unhooking or an exit's leak scan never counts in it.  The
 * hot path reads no clock (track.c, mt_raise_peak); the timeline's samples are the drains' own, so
 * a peak between two of them shows between them.  `bytes`: the peak bytes as the caller read them
 * (the time is theirs).  The agent's thread only. */
static void
mt_place_peak (guint64 bytes)
{
  guint64 now_us = (guint64) g_get_monotonic_time ();
  if (bytes != mt_core.peak_seen_bytes)
  {
    guint64 prev = mt_core.peak_seen_us;
    mt_core.peak_seen_bytes = bytes;
    mt_core.peak_us = prev != 0 && prev <= now_us ? prev + (now_us - prev) / 2 : now_us;
  }
  mt_core.peak_seen_us = now_us;
}

/* The hooks go in or out (the agent's setEnabled): the peak is looked at then (mt_place_peak). */
void
mt_peak_mark (void)
{
  mt_place_peak (mt_load_acquire (&mt_core.peak_bytes));
}

/* The stack definitions in mt_defs[tail, head) as one chunk at out + used, if they fit (else
 * mt_drain_info.more: the next drain takes them). */
static guint64
mt_drain_defs (guint8 * out, guint64 cap, guint64 used, guint64 head, guint64 tail)
{
  if (head == tail)
    return used;
  if (used + sizeof (MtChunkHeader) + (head - tail) > cap)
  {
    mt_drain_info.more = 1;
    return used;
  }
  MtChunkHeader * chunk = (MtChunkHeader *) (out + used);
  chunk->tid = 0;
  chunk->length = (guint32) (head - tail);
  used += sizeof (MtChunkHeader);
  used += mt_copy_ring (out + used, mt_defs, mt_config.defs_size, tail, head - tail);
  mt_store_release (&mt_core.defs_tail, head);
  return used;
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
  gint64 tracked;
  gint i, hw;

  info->more = 0;
  mt_core.tick++;

  used = mt_drain_defs (out, cap, used, head, tail);
  /* The next definition is whole (core.c, mt_def_shared). */
  MT_ADD64 (&mt_core.defs_epoch, 1);

  used = mt_drain_rings (out, cap, used);
  if (final)
    mt_sweep_rows ();
  used = mt_drain_rows (out, cap, used);
  used = mt_drain_peak (out, cap, used, final != 0);
  if (final && !mt_core.live_done && !info->more)
    used = mt_drain_live (out, cap, used);
  mt_top_rows ();
  /* The records above (and the top stacks) may use stacks interned after `head` was read: other
   * threads run on.  Their definitions are copied now, so a drain never ships an id it does not
   * define, and a target killed right after it leaves a capture whose every stack id is defined.
   * (A definition is in mt_defs before its id is published: core.c, mt_intern.) */
  used = mt_drain_defs (out, cap, used, mt_load_acquire (&mt_core.defs_head), mt_core.defs_tail);
  info->now_us = (guint64) g_get_monotonic_time ();
  /* Tracked bytes, too, can be a free ahead of its allocation for a moment: never below zero. */
  /* (Read once, before the credits: a credit flushed in between is then subtracted at most once.) */
  tracked = (gint64) mt_load_acquire ((volatile guint64 *) &mt_core.tracked_bytes);
  hw = mt_slots_used ();
  for (i = 0; i < hw; i++)
    tracked -= mt_credit_get (&mt_slots[i].tracked_credit);  /* frees not in the total yet (mt_tracked_add_own) */
  info->tracked_bytes = tracked > 0 ? (guint64) tracked : 0;
  info->tracked_blocks = mt_live_blocks_reported ();
  info->peak_epoch = mt_load_acquire (&mt_core.peak_epoch);
  mt_place_peak (mt_load_acquire (&mt_core.peak_bytes));
  info->peak_bytes = mt_core.peak_seen_bytes;         /* the bytes placed: the sample and its time agree */
  info->peak_t_us = mt_core.peak_us;
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
  gint i, hw = mt_slots_used ();
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
  /* The shared slot of threads that found none of their own (core.c, mt_shared_slot). */
  for (j = 0; j != MT_N_COUNTERS; j++)
    out[j] += mt_slots[mt_config.n_slots].ncount[j];
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
  mt_top_n_changed = MT_TOP_CHANGED_MAX + 1;
  for (i = 0; i != (mt_config.n_slots + 1) * sizeof (MtSlot); i++)
    ((guint8 *) mt_slots)[i] = 0;
  for (i = 0; i != 8 * (mt_config.stack_mask + 1); i++)   /* every generation of the index (core.c) */
    mt_stack_table[i] = 0;
  for (i = 0; i != (mt_config.live_mask + 1) * MT_LIVE_WAYS; i++)
    MT_LIVE_ENTRY (i).key = 0;
  for (i = 0; i != 2 * MT_LIVE_BIG_BLOCKS; i++)
    mt_globals.live_big[i] = 0;
  for (i = 0; i <= mt_config.live_mask; i++)
  {
    mt_live_locks[i] = 0;
    mt_live_spill[i] = 0;
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
  return mt_live_blocks_reported ();
}

/* Entries in the live table now (the logger path's VM regions included), for sizing a leak scan. */
guint64
mt_live_occupied (void)
{
  guint64 i, n = 0;
  for (i = 0; i != (mt_config.live_mask + 1) * MT_LIVE_WAYS; i++)
    n += MT_LIVE_ENTRY (i).key != 0;
  return n;
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
