/*
 * memtrace malloc tracer, hot paths.  Compiled after core.c, track.c and drain.c in one CModule.
 *
 * Linux: Interceptor.replaceFast sends the glibc malloc family here; each
 * replacement calls the original through the pointer replaceFast returned
 * (extern symbols real_*).  Both backends feed the same core: mt_on_alloc and
 * mt_on_release (counters, live table, per-stack aggregates, peak, temporaries)
 * for an outermost call, mt_nested for a call made while the thread was already
 * inside one.
 *
 * Darwin: libmalloc calls malloc_logger for every zone operation (the nano
 * zone included) and libsyscall calls __syscall_logger for VM operations;
 * the agent points both globals at mt_malloc_logger.  The public symbols are
 * the fallback where the logger cannot be set.  Type bits are libmalloc's
 * stack_logging.h:
 *   alloc 2, dealloc 4, zone 8, vm_allocate 16, vm_deallocate 32,
 *   cleared 64, mapped_file_or_shared_mem 128; VM user tag in bits 24..31.
 * DEVICE-UNVERIFIED: the logger path is written from libmalloc's malloc.c and libsyscall's
 * mach_vm.c; on Linux the stand-in libmtmalloc/libmtdarwin call it exactly as those do
 * (tests/integration/test_malloc_logger.py).
 */

extern gpointer (*real_malloc) (gsize);
extern gpointer (*real_calloc) (gsize, gsize);
extern gpointer (*real_realloc) (gpointer, gsize);
extern void (*real_free) (gpointer);
extern gint (*real_posix_memalign) (gpointer *, gsize, gsize);
extern gpointer (*real_memalign) (gsize, gsize);
extern gpointer (*real_aligned_alloc) (gsize, gsize);
extern gpointer (*real_valloc) (gsize);
extern gpointer (*real_pvalloc) (gsize);
extern gpointer (*real_reallocarray) (gpointer, gsize, gsize);

#define MT_LOG_ALLOC 2
#define MT_LOG_DEALLOC 4
#define MT_LOG_ZONE 8
#define MT_LOG_VM_ALLOCATE 16
#define MT_LOG_VM_DEALLOCATE 32
#define MT_LOG_CLEARED 64
#define MT_LOG_MAPPED_FILE 128

/* The logger's writable state, allocated by the agent (a CModule has no writable statics). */
extern volatile guint32 mt_self_task;           /* mach_task_self_: the task whose VM is ours (0: unknown) */
extern gsize (* volatile mt_block_size) (gconstpointer);   /* malloc_size, or NULL */
extern volatile gint mt_inflight[];             /* MT_LOGGER_INFLIGHT_SHARDS * MT_LOGGER_INFLIGHT_STRIDE */

/* The decoded event (MtLoggerEvent, MT_OP_*: what the caller is to do) and the call kinds
 * (MT_K_*) come from the generated layout header: the agent reads MtLoggerEvent back in
 * decodeLoggerEvent. */

/* ---- calls that fail ------------------------------------------------------ */

#define MT_U64_MAX (~(guint64) 0)

/* n * size as calloc and reallocarray see it: an overflowing product is no size (the call fails
 * with ENOMEM) and must not wrap into a small one. */
static inline guint64
mt_mul_size (guint64 n, guint64 size)
{
  /* (TinyCC has no __builtin_mul_overflow.)  Both under 2^32: the product fits. */
  if (G_LIKELY (((n | size) >> 32) == 0))
    return n * size;
  return (size != 0 && n > MT_U64_MAX / size) ? MT_U64_MAX : n * size;
}

/* An allocation call that returned NULL: a call of its kind and a failure (by kind, and on its
 * stack's row when its size asks for a stack), never bytes, tiers, live or peak. */
static MT_NOINLINE void
mt_on_failed (MtSlot * s, guint kind, guint64 size, gpointer fp)
{
  s->last_ptr = 0;
  mt_bump (&s->counters[MT_C_CALLS + kind], 1);
  mt_bump (&s->counters[MT_C_FAILED + kind], 1);
  mt_bump (&s->counters[MT_C_FAILED_ALLOCS], 1);
  if (size >= mt_config.stack_threshold && fp != NULL)
  {
    guint64 frames[MT_MAX_FRAMES];
    guint16 flags = 0;
    gint prev = mt_guard (s);
    guint n = mt_call_stack (s, kind, fp, frames, &flags);
    guint64 row = mt_row_of (mt_intern (s, frames, n));
    MT_ADD64 (MT_COLD (mt_agg_cold_lane (s, row), MT_A_FAILED), 1);
    mt_agg_dirty_row (row);
    mt_set_busy (s, prev);
  }
}

/* mt_on_alloc for a call that may have failed. */
static inline void
mt_on_result (MtSlot * s, guint kind, gpointer p, guint64 size, gpointer fp)
{
  if (G_UNLIKELY (p == NULL))
    mt_on_failed (s, kind, size, fp);
  else
    mt_on_alloc (s, kind, p, size, fp);
}

/* A nested allocation call (mt_nested); one that failed is a call and a failure, no bytes, no tier
 * (inside a compound entry it is left to mt_reconcile as any nested call). */
static void
mt_nested_result (MtSlot * s, guint kind, gpointer p, guint64 size, guint64 old)
{
  if (G_LIKELY (p != NULL) || s->busy != MT_BUSY_HOOK)
  {
    mt_nested (s, kind, (guint64) p, p != NULL ? size : 0, old, TRUE);
    return;
  }
  mt_nested (s, kind, 0, 0, old, FALSE);
  mt_ncount (s, MT_C_FAILED + kind, 1);
  mt_ncount (s, MT_C_FAILED_ALLOCS, 1);
}

/* Pure: the argument patterns of libmalloc's and libsyscall's logger calls.
 *   malloc/valloc/memalign: ALLOC|ZONE,           zone, size, 0, result
 *   calloc:                 ALLOC|ZONE|CLEARED,   zone, n*size, 0, result
 *   realloc:                ALLOC|DEALLOC|ZONE,   zone, old, new_size, result  (logged after the
 *                           zone's realloc: a moved block's old address is already free again)
 *   free:                   DEALLOC|ZONE,         zone, ptr, 0, 0             (logged before the free)
 *   mach_vm_allocate, anonymous mmap: VM_ALLOCATE|tag<<24, task, size, 0, address
 *   mach_vm_map/remap, file mmap: VM_ALLOCATE|MAPPED_FILE|tag<<24, task, size, 0, address
 *   mach_vm_deallocate/munmap: VM_DEALLOCATE, task, address, size, 0
 * VM events are left out (MT_OP_VM_SKIP, ev->skip = the counter to bump) when they are another
 * task's (arg1 is the target task: mach_vm_* take any task port), failed (mmap logs MAP_FAILED,
 * older libsyscalls log failed mach_vm_allocate calls with address 0), or libmalloc's own regions
 * and large blocks (tags VM_MEMORY_MALLOC* 1..13: those bytes are the malloc calls they serve).
 * self_task 0 = unknown: every task is taken as ours. */
void
mt_logger_decode (guint32 type, guint64 arg1, guint64 arg2, guint64 arg3, guint64 result, guint64 self_task,
    MtLoggerEvent * ev)
{
  guint32 bits = type & 0x00ffffff;
  guint32 tag = (type >> 24) & 0xff;
  ev->op = MT_OP_IGNORE;
  ev->kind = 0;
  ev->ptr = 0;
  ev->size = 0;
  ev->old_ptr = 0;
  ev->tag = 0;
  ev->skip = 0;

  if (bits & MT_LOG_VM_ALLOCATE)
  {
    ev->op = MT_OP_VM_ALLOC;
    ev->kind = (bits & MT_LOG_MAPPED_FILE) ? MT_K_MAPPED_FILE : MT_K_VM_ALLOCATE;
    ev->size = arg2;
    ev->ptr = result;
    ev->tag = tag;
    if (self_task != 0 && arg1 != self_task)
      ev->skip = MT_C_VM_OTHER_TASK;
    else if (result == 0 || result == 0xffffffffffffffffULL)
      ev->skip = MT_C_VM_FAILED;
    else if (tag >= MT_VM_TAG_MALLOC_FIRST && tag <= MT_VM_TAG_MALLOC_LAST)
      ev->skip = MT_C_VM_ALLOCATOR_OWN;
    if (ev->skip != 0)
      ev->op = MT_OP_VM_SKIP;
    return;
  }
  if (bits & MT_LOG_VM_DEALLOCATE)
  {
    ev->op = MT_OP_VM_FREE;
    ev->kind = MT_K_VM_DEALLOCATE;
    ev->old_ptr = arg2;
    ev->size = arg3;
    if (self_task != 0 && arg1 != self_task)
    {
      ev->op = MT_OP_VM_SKIP;
      ev->skip = MT_C_VM_OTHER_TASK;
    }
    return;
  }
  if ((bits & MT_LOG_ALLOC) && (bits & MT_LOG_DEALLOC))
  {
    ev->op = MT_OP_REALLOC;
    ev->kind = MT_K_REALLOC;
    ev->old_ptr = arg2;
    ev->size = arg3;
    ev->ptr = result;
    return;
  }
  if (bits & MT_LOG_ALLOC)
  {
    ev->op = MT_OP_ALLOC;
    ev->kind = (bits & MT_LOG_CLEARED) ? MT_K_CALLOC : MT_K_MALLOC;
    ev->size = arg2;
    ev->ptr = result;
    return;
  }
  if (bits & MT_LOG_DEALLOC)
  {
    ev->op = MT_OP_FREE;
    ev->kind = MT_K_FREE;
    ev->old_ptr = arg2;
    return;
  }
}

/* ---- the logger path's live-table entries ------------------------------------------------
 *
 * Blocks the logger saw allocated are in core.c's live table as their address (P), with their
 * size, stack and birth in the entry beside the key, like the hooks' blocks: their frees update
 * their stack's row.  libmalloc logs a free before the free but a realloc after the zone's
 * realloc, so a moved block's old address may already belong to another thread (which may or may
 * not have logged it yet).  Two more states, in the key's low bits (malloc blocks are 16-byte
 * aligned, VM regions page aligned), and a separate VM namespace:
 *   X|1  S "suspect": a moved realloc's release found X allocated again and the one entry at X
 *        could be the old block (its new owner not logged yet) or the new owner's; the next
 *        event at X decides: an allocation proves it was the old block (released then), a free
 *        proves it is the live one (released by that free).
 *   X|2  O "owed": X was handed out again while still listed (its free was never logged: a moved
 *        realloc, logged later); the realloc's release takes it, nothing else does.
 *   X|4  a VM region (mach_vm_allocate, mmap ...): never matched by a malloc-family event, never
 *        in a row, the peak, the LIVE records or a leak scan.
 * An entry keeps its meta through these states: whoever releases it releases its row.  Every
 * change of state and every release happens under the bucket's lock, so two events at one
 * address never clear the same entry; an insert (track.c) only ever takes an empty way, and with
 * gcc takes it without the lock, which none of these changes can disturb.  A nested event (a
 * signal handler's, on a thread that may hold the lock) only tries the lock, and says when it
 * could not have it (nested_table_busy). */
/* (MT_LIVE_SUSPECT, MT_LIVE_OWED and MT_LIVE_VM are defined with the table, in core.c.) */

static inline gboolean
mt_bucket_lock (MtSlot * s, guint64 b, gboolean nested)
{
  if (nested)
  {
    if (mt_trylock (&mt_live_locks[b], 64))
      return TRUE;
    mt_ncount (s, MT_C_NESTED_TABLE_BUSY, 1);
    return FALSE;
  }
  /* Bounded: a holder that never lets go (a thread that does not exist in a fork child) must not
   * hang the target.  After a second of patient tries the event is skipped, and counted. */
  {
    gint64 give_up = 0;
    while (!mt_lock_patiently (&mt_live_locks[b]))
    {
      gint64 now = g_get_monotonic_time ();
      if (give_up == 0)
        give_up = now + 1000000;
      else if (now > give_up)
      {
        s->counters[MT_C_TABLE_BUSY]++;
        return FALSE;
      }
    }
  }
  return TRUE;
}

/* Below, an entry is found (mt_live_find), taken (mt_live_take) and re-keyed with p's home bucket's
 * lock held: it guards p's entry wherever the entry is, its home or an alternate. */

/* Way i of bucket b holds v from now on (the home's lock held): a change of the entry's flag bits,
 * in its home or its alternate (which they leave as it is: mt_live_alt). */
static void
mt_bucket_rekey (guint64 b, gint i, guint64 v)
{
  MtLiveEntry * e = &mt_live_entries (b)[i];
  volatile guint32 * kp = mt_live_key_at (e);
  if (G_UNLIKELY (e->size == MT_LIVE_SIZE_BIG))
    mt_live_big_rename (mt_live_entry_address (b * MT_LIVE_WAYS + (guint64) i), v);
  *kp = mt_live_key (v) | (*kp & MT_LIVE_ALT_MASK);
}

static inline void
mt_logger_count (MtSlot * s, guint index, gboolean nested)
{
  if (nested)
    mt_ncount (s, index, 1);
  else
    s->counters[index]++;
}

/* A malloc block the logger path took out of the table: its row, the tracked bytes, and in
 * events mode its FREE record (never from a nested event: the ring may be mid-write). */
static void
mt_logger_released (MtSlot * s, guint kind, guint64 p, const MtLiveMeta * m, gboolean temporary, gboolean nested)
{
  mt_logger_count (s, MT_C_TRACKED_FREES, nested);
  mt_release_tracked (s, m, temporary, !nested);
  if (!nested)
    mt_emit_free (s, kind, p, 0);
}

/* An allocation at p, before it is tracked: what is still listed at p was freed unlogged. */
static void
mt_logger_claim (MtSlot * s, guint64 p, gboolean nested)
{
  guint64 b = mt_live_bucket (p);
  MtLiveMeta m;
  gint i;
  guint64 at = 0;
  gboolean release = FALSE;
  if (p == 0 || mt_live_surely_absent (p) || !mt_bucket_lock (s, b, nested))
    return;
  if ((i = mt_live_find (p | MT_LIVE_SUSPECT, &at)) >= 0)
  {
    /* The suspect was the old block of a realloc: its release is this. */
    mt_live_take (at, i, p | MT_LIVE_SUSPECT, &m);
    release = TRUE;
  }
  else if ((i = mt_live_find (p, &at)) >= 0)
  {
    mt_bucket_rekey (at, i, p | MT_LIVE_OWED);
  }
  mt_unlock (&mt_live_locks[b]);
  if (i >= 0)
    mt_logger_count (s, MT_C_REALLOC_REUSE_SEEN, nested);
  if (release)
    mt_logger_released (s, MT_K_REALLOC, p, &m, FALSE, nested);
}

/* A free of p (logged before the free), or the old half of an in-place realloc: the live entry
 * at p, else the suspect one (the entry was the live block's after all). */
static void
mt_logger_release (MtSlot * s, guint kind, guint64 p, gboolean temporary, gboolean nested)
{
  guint64 b = mt_live_bucket (p);
  MtLiveMeta m;
  gint i;
  guint64 at = 0, v = p;
  if (p == 0 || mt_live_surely_absent (p) || !mt_bucket_lock (s, b, nested))
    return;
  if ((i = mt_live_find (p, &at)) < 0)
    i = mt_live_find (v = p | MT_LIVE_SUSPECT, &at);
  if (i >= 0)
    mt_live_take (at, i, v, &m);
  mt_unlock (&mt_live_locks[b]);
  if (i >= 0)
    mt_logger_released (s, kind, p, &m, temporary, nested);
}

/* The old block of a moved realloc, logged after the zone freed it: another thread may already
 * have been handed the address (and may or may not have logged it).  malloc_size tells whether
 * the address is allocated again; a nested event may not ask it (the interrupted call may hold
 * the zone's lock) and leaves the entry to the next event at the address. */
static void
mt_logger_release_moved (MtSlot * s, guint64 p, gboolean temporary, gboolean nested)
{
  guint64 b = mt_live_bucket (p);
  MtLiveMeta m;
  gint i;
  guint64 at = 0;
  gboolean release = FALSE;
  if (p == 0 || mt_live_surely_absent (p) || !mt_bucket_lock (s, b, nested))
    return;
  if ((i = mt_live_find (p | MT_LIVE_OWED, &at)) >= 0)
  {
    mt_live_take (at, i, p | MT_LIVE_OWED, &m);
    release = TRUE;
  }
  else if ((i = mt_live_find (p, &at)) >= 0)
  {
    gsize (*size_of) (gconstpointer) = mt_block_size;
    if (nested || (size_of != NULL && size_of ((gconstpointer) (gsize) p) != 0))
    {
      /* Handed out again and not logged as such: whose is the entry?  The next event decides. */
      mt_bucket_rekey (at, i, p | MT_LIVE_SUSPECT);
      mt_logger_count (s, MT_C_REALLOC_REUSE_SEEN, nested);
    }
    else
    {
      mt_live_take (at, i, p, &m);
      release = TRUE;
    }
  }
  mt_unlock (&mt_live_locks[b]);
  if (release)
    mt_logger_released (s, MT_K_REALLOC, p, &m, temporary, nested);
}

/* ---- the logger path's VM regions ------------------------------------------------------------ */

/* VM events are rare and large, and never in the aggregates: each is an ALLOC or FREE record in
 * the buffer the stack definitions go through (drained first, every drain, as the core's own
 * chunk), whatever the mode.  Returns where to write the record, with the stack lock held (NULL,
 * counted as dropped, when the buffer is full or the lock cannot be had). */
static guint8 *
mt_shared_begin (MtSlot * s, guint64 len, gboolean nested)
{
  guint8 * out;
  if (nested ? mt_trylock (&mt_globals.stack_lock, 64) : mt_stack_lock ())
  {
    out = mt_defs_reserve (len);
    if (out != NULL)
      return out;
    mt_stack_unlock ();
  }
  if (nested)
  {
    mt_ncount (s, MT_C_DROPPED_RECORDS, 1);
    mt_ncount (s, MT_C_DROPPED_RECORD_BYTES, len);
  }
  else
  {
    s->counters[MT_C_DROPPED_RECORDS]++;
    s->counters[MT_C_DROPPED_RECORD_BYTES] += len;
  }
  return NULL;
}

static void
mt_shared_commit (MtSlot * s, guint64 len, gboolean nested)
{
  mt_store_release (&mt_core.defs_head, mt_core.defs_head + len);
  mt_stack_unlock ();
  mt_logger_count (s, MT_C_RECORDS, nested);
  if (nested)
    mt_ncount (s, MT_C_RECORD_BYTES, len);
  else
    s->counters[MT_C_RECORD_BYTES] += len;
}

static void
mt_vm_unlist (MtSlot * s, guint64 p)
{
  guint64 b = mt_live_bucket (p | MT_LIVE_VM);
  MtLiveMeta m;
  gint i;
  guint64 at = 0;
  if (!mt_bucket_lock (s, b, FALSE))
    return;
  if ((i = mt_live_find (p | MT_LIVE_VM, &at)) >= 0)
    mt_live_take (at, i, p | MT_LIVE_VM, &m);
  mt_unlock (&mt_live_locks[b]);
}

/* A VM region of the task's own: counted by kind (never in the malloc tiers), listed (so that its
 * deallocation is known for ours), stacked above the stack threshold, its tag in the record.  A
 * nested one (a signal handler's) is only counted: walking the stack and interning it are what the
 * interrupted call may be doing. */
static void
mt_on_vm_alloc (MtSlot * s, guint kind, guint64 p, guint64 size, guint tag, gpointer fp, gboolean nested)
{
  guint16 flags = (guint16) ((tag & 0xff) << MT_FLAG_TAG_SHIFT);
  guint32 stack_id = MT_NO_STACK;
  MtAllocRecord * rec;
  if (nested)
  {
    mt_ncount (s, MT_C_CALLS + kind, 1);
    mt_ncount (s, MT_C_BYTES + kind, size);
    mt_ncount (s, MT_C_NESTED_CALLS, 1);
    return;
  }
  s->counters[MT_C_CALLS + kind]++;
  s->counters[MT_C_BYTES + kind] += size;
  if (size >= mt_config.stack_threshold)
  {
    guint64 frames[MT_MAX_FRAMES];
    guint n = mt_call_stack (s, kind, fp, frames, &flags);
    stack_id = mt_intern (s, frames, n);
  }
  if (mt_live_insert (p | MT_LIVE_VM, size, stack_id, 0, 4096))
    flags |= MT_FLAG_LIVE;
  else
    s->counters[MT_C_LIVE_TABLE_FULL]++;
  rec = (MtAllocRecord *) mt_shared_begin (s, sizeof (MtAllocRecord), FALSE);
  if (rec == NULL)
  {
    /* The host never learns of this region: forget it, so that its deallocation stays quiet. */
    if (flags & MT_FLAG_LIVE)
      mt_vm_unlist (s, p);
    return;
  }
  rec->type = MT_REC_ALLOC;
  rec->kind = (guint8) kind;
  rec->flags = flags;
  rec->stack_id = stack_id;
  rec->ptr = p;
  rec->size = size;
  rec->weight = size;
  mt_shared_commit (s, sizeof (MtAllocRecord), FALSE);
}

/* A deallocation counts when it ends a region the task's own VM calls made; others (libmalloc's
 * regions, what was mapped before the window) only bump vm_untracked_frees. */
static void
mt_on_vm_free (MtSlot * s, guint64 p, guint64 size, gboolean nested)
{
  guint64 b = mt_live_bucket (p | MT_LIVE_VM);
  MtLiveMeta m;
  MtFreeRecord * rec;
  gint i = -1;
  guint64 at = 0;
  if (!mt_live_surely_absent (p | MT_LIVE_VM) && mt_bucket_lock (s, b, nested))
  {
    if ((i = mt_live_find (p | MT_LIVE_VM, &at)) >= 0)
      mt_live_take (at, i, p | MT_LIVE_VM, &m);
    mt_unlock (&mt_live_locks[b]);
  }
  if (i < 0)
  {
    mt_logger_count (s, MT_C_VM_UNTRACKED_FREES, nested);
    return;
  }
  if (nested)
  {
    mt_ncount (s, MT_C_CALLS + MT_K_VM_DEALLOCATE, 1);
    mt_ncount (s, MT_C_BYTES + MT_K_VM_DEALLOCATE, size);
    mt_ncount (s, MT_C_NESTED_CALLS, 1);
  }
  else
  {
    s->counters[MT_C_CALLS + MT_K_VM_DEALLOCATE]++;
    s->counters[MT_C_BYTES + MT_K_VM_DEALLOCATE] += size;
  }
  rec = (MtFreeRecord *) mt_shared_begin (s, sizeof (MtFreeRecord), nested);
  if (rec == NULL)
    return;
  rec->type = MT_REC_FREE;
  rec->kind = MT_K_VM_DEALLOCATE;
  rec->flags = 0;
  rec->reserved = 0;
  rec->ptr = p;
  rec->size = size;
  mt_shared_commit (s, sizeof (MtFreeRecord), nested);
}

/* In-flight calls, sharded by stack address so threads do not share a counter's cache line:
 * the agent's uninstall restores the logger pointers and waits for these to reach zero before
 * the script (and this code) may be unloaded. */
static inline volatile gint *
mt_inflight_shard (gconstpointer sp)
{
  return &mt_inflight[(((guint64) (gsize) sp >> 12) & (MT_LOGGER_INFLIGHT_SHARDS - 1)) * MT_LOGGER_INFLIGHT_STRIDE];
}

guint64
mt_inflight_total (void)
{
  guint64 total = 0;
  guint i;
  for (i = 0; i != MT_LOGGER_INFLIGHT_SHARDS; i++)
    total += (guint64) g_atomic_int_add (&mt_inflight[i * MT_LOGGER_INFLIGHT_STRIDE], 0);
  return total;
}

/* An event logged while the thread's slot was busy: on the agent's own thread (not the target's:
 * not counted), or a signal handler's inside a logged call (libmalloc logs after the operation,
 * a free before it).  Counted like any call; its releases and claims only try the bucket's lock. */
static MT_NOINLINE void
mt_logger_nested (MtSlot * s, const MtLoggerEvent * ev)
{
  if (s->busy == MT_BUSY_OWN)
  {
    mt_ncount (s, MT_C_OWN_CALLS, 1);
    /* libmalloc logs an allocation after it and a free before it: both blocks can be sized. */
    if (ev->op == MT_OP_ALLOC)
      mt_own_alloc (s, ev->ptr);
    else if (ev->op == MT_OP_FREE)
      mt_own_release (s, ev->old_ptr);
    return;
  }
  switch (ev->op)
  {
    case MT_OP_ALLOC:
      mt_logger_claim (s, ev->ptr, TRUE);
      mt_nested (s, (guint) ev->kind, ev->ptr, ev->size, 0, TRUE);
      break;
    case MT_OP_FREE:
      mt_nested (s, MT_K_FREE, 0, 0, 0, FALSE);
      mt_logger_release (s, MT_K_FREE, ev->old_ptr, FALSE, TRUE);
      break;
    case MT_OP_REALLOC:
      if (ev->old_ptr != 0 && ev->ptr == ev->old_ptr)
        mt_logger_release (s, MT_K_REALLOC, ev->old_ptr, FALSE, TRUE);
      else if (ev->old_ptr != 0 && (ev->ptr != 0 || ev->size == 0))
        mt_logger_release_moved (s, ev->old_ptr, FALSE, TRUE);
      if (ev->ptr != ev->old_ptr)
        mt_logger_claim (s, ev->ptr, TRUE);
      mt_nested (s, MT_K_REALLOC, ev->ptr, ev->size, 0, TRUE);
      break;
    case MT_OP_VM_ALLOC:
      mt_on_vm_alloc (s, (guint) ev->kind, ev->ptr, ev->size, (guint) ev->tag, NULL, TRUE);
      break;
    case MT_OP_VM_FREE:
      mt_on_vm_free (s, ev->old_ptr, ev->size, TRUE);
      break;
    case MT_OP_VM_SKIP:
      mt_ncount (s, (guint) ev->skip, 1);
      break;
  }
}

void
mt_malloc_logger (guint32 type, guint64 arg1, guint64 arg2, guint64 arg3, guint64 result, guint32 skip)
{
  gpointer fp = __builtin_frame_address (0);
  volatile gint * inflight = mt_inflight_shard (fp);
  MtLoggerEvent ev;
  MtSlot * s;
  gboolean temporary;
  (void) skip;
  g_atomic_int_add (inflight, 1);
  if (!mt_config.enabled)
    goto out;
  mt_logger_decode (type, arg1, arg2, arg3, result, (guint64) mt_self_task, &ev);
  if (ev.op == MT_OP_IGNORE)
    goto out;
  s = mt_slot ();
  if (s == NULL)
    goto out;
  if (G_UNLIKELY (s->busy != 0))
  {
    mt_logger_nested (s, &ev);
    goto out;
  }
  mt_set_busy (s, MT_BUSY_HOOK);
  switch (ev.op)
  {
    case MT_OP_ALLOC:
      mt_logger_claim (s, ev.ptr, FALSE);
      mt_on_result (s, (guint) ev.kind, (gpointer) ev.ptr, ev.size, fp);
      break;
    case MT_OP_FREE:
      s->counters[MT_C_CALLS + MT_K_FREE]++;
      mt_logger_release (s, MT_K_FREE, ev.old_ptr, mt_check_temporary (s, ev.old_ptr), FALSE);
      break;
    case MT_OP_REALLOC:
      temporary = mt_check_temporary (s, ev.old_ptr);
      if (ev.old_ptr != 0 && ev.ptr == ev.old_ptr)
        mt_logger_release (s, MT_K_REALLOC, ev.old_ptr, temporary, FALSE);
      else if (ev.old_ptr != 0 && (ev.ptr != 0 || ev.size == 0))
        mt_logger_release_moved (s, ev.old_ptr, temporary, FALSE);
      if (ev.ptr != ev.old_ptr)
        mt_logger_claim (s, ev.ptr, FALSE);
      if (ev.ptr == 0 && ev.size == 0)
        mt_count_call (s, MT_K_REALLOC, 0);   /* realloc(p, 0) frees; it does not fail */
      else
        mt_on_result (s, MT_K_REALLOC, (gpointer) ev.ptr, ev.size, fp);
      break;
    case MT_OP_VM_ALLOC:
      mt_on_vm_alloc (s, (guint) ev.kind, ev.ptr, ev.size, (guint) ev.tag, fp, FALSE);
      break;
    case MT_OP_VM_FREE:
      mt_on_vm_free (s, ev.old_ptr, ev.size, FALSE);
      break;
    case MT_OP_VM_SKIP:
      s->counters[ev.skip]++;
      break;
  }
  mt_set_busy (s, 0);
out:
  g_atomic_int_add (inflight, -1);
}

/* The agent's own thread (its JavaScript runs here: symbolization loads CoreSymbolication, whose
 * allocations are the agent's, not the app's): marked as memtrace's own for good, so every call it
 * makes is passed through and counted only as own_calls.  Returns TRUE when the thread has its slot. */
gboolean
mt_ignore_this_thread (void)
{
  MtSlot * s = mt_slot ();
  if (s == NULL || s->busy == MT_BUSY_SHARED)
    return FALSE;
  mt_set_busy (s, MT_BUSY_OWN);
  return TRUE;
}

/* ---- Linux (and Darwin fallback): the public malloc family ------------- */

/*
 * One replacement per entry.  An outermost call marks the slot busy, counts the call, makes the
 * real call, then (above the thresholds) tracks its block.  A call that finds the slot busy is
 * nested: it makes the real call and goes to mt_nested, which still counts it.  Entries that may
 * call the family themselves (glibc's realloc(NULL, n) calls malloc, memalign with a small
 * alignment calls malloc, reallocarray calls realloc) are "compound": during their real call the
 * slot says so, nested calls are remembered, and mt_reconcile takes the allocator's own back out
 * of the counts, so that each call the program made is counted once, as its kind.
 * The frame address is taken in the replacement itself: it is the start of the caller's stack.
 * malloc, calloc and free mark the slot only around their tracking work where counters cannot
 * be torn by a signal handler (MT_LIGHT_HOOKS, core.c).
 */
#define MT_DEFINE_ALLOC(fn, kind, size_expr, params, args, nparams, nargs) \
  static MT_NOINLINE gpointer                                           \
  mt_##fn##_nested nparams                                              \
  {                                                                     \
    gpointer p = real_##fn args;                                        \
    mt_nested_result (s, kind, p, size_expr, 0);                        \
    return p;                                                           \
  }                                                                     \
                                                                        \
  gpointer                                                              \
  mt_##fn params                                                        \
  {                                                                     \
    MtSlot * s;                                                         \
    gpointer p;                                                         \
    if (G_UNLIKELY (!mt_config.enabled) || G_UNLIKELY ((s = mt_slot ()) == NULL)) \
      return real_##fn args;                                            \
    if (G_UNLIKELY (s->busy != 0))                                      \
      return mt_##fn##_nested nargs;                                    \
    if (!MT_LIGHT_HOOKS)                                                \
      mt_set_busy (s, MT_BUSY_HOOK);                                    \
    p = real_##fn args;                                                 \
    /* The frame address read here is the frame pointer itself: no register kept across the call. */ \
    if (G_LIKELY (p != NULL))                                           \
    {                                                                   \
      mt_count_call (s, kind, size_expr);                               \
      mt_on_allocated (s, kind, p, size_expr, __builtin_frame_address (0)); \
    }                                                                   \
    else                                                                \
      mt_on_failed (s, kind, size_expr, __builtin_frame_address (0));   \
    if (!MT_LIGHT_HOOKS)                                                \
      mt_set_busy (s, 0);                                               \
    return p;                                                           \
  }

#define MT_DEFINE_COMPOUND(fn, kind, size_expr, params, args)           \
  gpointer                                                              \
  mt_##fn params                                                        \
  {                                                                     \
    gpointer fp = __builtin_frame_address (0);                          \
    MtSlot * s;                                                         \
    gpointer p;                                                         \
    gssize seq0;                                                        \
    if (!mt_config.enabled || (s = mt_slot ()) == NULL)                 \
      return real_##fn args;                                            \
    if (G_UNLIKELY (s->busy != 0))                                      \
    {                                                                   \
      p = real_##fn args;                                               \
      mt_nested_result (s, kind, p, size_expr, 0);                      \
      return p;                                                         \
    }                                                                   \
    seq0 = s->nested_seq;                                               \
    mt_set_busy (s, MT_BUSY_COMPOUND);                                  \
    p = real_##fn args;                                                 \
    mt_set_busy (s, MT_BUSY_HOOK);                                      \
    mt_reconcile (s, seq0, (guint64) p, 0);                             \
    /* Counted once the result is known: a NULL is a failed call, no bytes. */ \
    if (G_UNLIKELY ((mt_alias_kinds & (1ULL << kind)) != 0))            \
      mt_note_site (kind, fp, p != NULL ? size_expr : 0);               \
    mt_on_result (s, kind, p, size_expr, fp);                           \
    mt_set_busy (s, 0);                                                 \
    return p;                                                           \
  }

MT_DEFINE_ALLOC (malloc, MT_K_MALLOC, size, (gsize size), (size), (MtSlot * s, gsize size), (s, size))
MT_DEFINE_ALLOC (calloc, MT_K_CALLOC, mt_mul_size (n, size), (gsize n, gsize size), (n, size),
                 (MtSlot * s, gsize n, gsize size), (s, n, size))

/* A free of the old block plus an allocation of the new one.  The old block leaves the live
 * table before the real call: once realloc returns, another thread may be handed the same
 * address.  (If realloc then fails, the old block lives on untracked.) */
static gpointer
mt_realloc_common (guint kind, gpointer old, gsize n, gsize size, gpointer fp)
{
  MtSlot * s;
  gpointer p;
  gssize seq0;
  guint64 bytes = mt_mul_size (n, size);
  gboolean array = kind == MT_K_REALLOCARRAY;
  if (!mt_config.enabled || (s = mt_slot ()) == NULL)
    return array ? real_reallocarray (old, n, size) : real_realloc (old, size);
  if (G_UNLIKELY (s->busy != 0))
  {
    if (s->busy == MT_BUSY_OWN)
      mt_own_release (s, (guint64) old);      /* sized now: after the real call it is gone */
    p = array ? real_reallocarray (old, n, size) : real_realloc (old, size);
    if (p == NULL && bytes == 0)
      mt_nested (s, kind, 0, 0, s->busy == MT_BUSY_OWN ? 0 : (guint64) old, TRUE);  /* realloc(p, 0) frees */
    else
      mt_nested_result (s, kind, p, bytes, p != NULL && s->busy != MT_BUSY_OWN ? (guint64) old : 0);
    return p;
  }
  mt_set_busy (s, MT_BUSY_HOOK);
  if (old != NULL)
    mt_on_release (s, kind, old, 0, TRUE);
  seq0 = s->nested_seq;
  mt_set_busy (s, MT_BUSY_COMPOUND);
  p = array ? real_reallocarray (old, n, size) : real_realloc (old, size);
  mt_set_busy (s, MT_BUSY_HOOK);
  mt_reconcile (s, seq0, (guint64) p, (guint64) old);
  if (p == NULL && bytes == 0)
    mt_count_call (s, kind, 0);   /* realloc(p, 0) frees; it does not fail */
  else
    mt_on_result (s, kind, p, bytes, fp);
  mt_set_busy (s, 0);
  return p;
}

/* The barrier keeps these frames alive: as tail calls, the frame address handed on would be gone. */
gpointer
mt_realloc (gpointer old, gsize size)
{
  gpointer p = mt_realloc_common (MT_K_REALLOC, old, 1, size, __builtin_frame_address (0));
  MT_COMPILER_BARRIER ();
  return p;
}

gpointer
mt_reallocarray (gpointer old, gsize n, gsize size)
{
  gpointer p = mt_realloc_common (MT_K_REALLOCARRAY, old, n, size, __builtin_frame_address (0));
  MT_COMPILER_BARRIER ();
  return p;
}

/* free's uncommon cases, out of its way: hooks off (s NULL), no slot (NULL: mt_slot counted the
 * call lost; asking again would count it twice), or nested. */
static MT_NOINLINE void
mt_free_aside (MtSlot * s, gpointer p)
{
  if (s != NULL && s->busy != 0)
    mt_nested (s, MT_K_FREE, 0, 0, (guint64) p, FALSE);
  real_free (p);
}

void
mt_free (gpointer p)
{
  MtSlot * s = NULL;
  if (G_UNLIKELY (!mt_config.enabled) || G_UNLIKELY ((s = mt_slot ()) == NULL) || G_UNLIKELY (s->busy != 0))
  {
    mt_free_aside (s, p);
    return;
  }
  if (!MT_LIGHT_HOOKS)
    mt_set_busy (s, MT_BUSY_HOOK);
  mt_bump (&s->counters[MT_C_CALLS + MT_K_FREE], 1);
  mt_on_release (s, MT_K_FREE, p, 0, TRUE);
  real_free (p);
  if (!MT_LIGHT_HOOKS)
    mt_set_busy (s, 0);
}

gint
mt_posix_memalign (gpointer * out, gsize alignment, gsize size)
{
  gpointer fp = __builtin_frame_address (0);
  MtSlot * s;
  gint r;
  gssize seq0;
  if (!mt_config.enabled || (s = mt_slot ()) == NULL)
    return real_posix_memalign (out, alignment, size);
  if (G_UNLIKELY (s->busy != 0))
  {
    r = real_posix_memalign (out, alignment, size);
    mt_nested_result (s, MT_K_POSIX_MEMALIGN, r == 0 ? *out : NULL, size, 0);
    return r;
  }
  seq0 = s->nested_seq;
  mt_set_busy (s, MT_BUSY_COMPOUND);
  r = real_posix_memalign (out, alignment, size);
  mt_set_busy (s, MT_BUSY_HOOK);
  mt_reconcile (s, seq0, r == 0 ? (guint64) *out : 0, 0);
  mt_on_result (s, MT_K_POSIX_MEMALIGN, r == 0 ? *out : NULL, size, fp);
  mt_set_busy (s, 0);
  return r;
}

MT_DEFINE_COMPOUND (memalign, MT_K_MEMALIGN, size, (gsize alignment, gsize size), (alignment, size))
MT_DEFINE_COMPOUND (aligned_alloc, MT_K_ALIGNED_ALLOC, size, (gsize alignment, gsize size), (alignment, size))
MT_DEFINE_COMPOUND (valloc, MT_K_VALLOC, size, (gsize size), (size))
MT_DEFINE_COMPOUND (pvalloc, MT_K_PVALLOC, size, (gsize size), (size))
