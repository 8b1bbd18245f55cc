/*
 * memtrace malloc tracer, hot paths.  Compiled after core.c in one CModule.
 *
 * Linux: Interceptor.replaceFast sends the glibc malloc family here; each
 * replacement calls the original through the pointer replaceFast returned
 * (extern symbols real_*).
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
 * Blocks the logger saw allocated are in core.c's live table as their address (P).  Two more
 * states, in the address's low bits (malloc blocks are 16-byte aligned, VM regions page aligned),
 * and a separate VM namespace:
 *   X|1  S "suspect": a moved realloc's release found X allocated again and the one entry at X
 *        could be the old block (its new owner not logged yet) or the new owner's; the next
 *        event at X decides: an allocation proves it was the old block (released then), a free
 *        proves it is the live one (released by that free).
 *   X|2  O "owed": X was handed out again while still listed (its free was never logged: a moved
 *        realloc, logged later); the realloc's release takes it, nothing else does.
 *   X|4  a VM region (mach_vm_allocate, mmap ...): never matched by a malloc-family event.
 * Every change happens under the bucket's lock (core.c's insert takes it too), so two releases
 * of one address never clear the same entry. */
#define MT_LIVE_SUSPECT 1
#define MT_LIVE_OWED 2
#define MT_LIVE_VM 4

static inline void
mt_bucket_lock (guint64 b)
{
  while (!mt_trylock (&mt_live_locks[b], 4096))
    ;
}

/* The way holding v in bucket b (lock held), or -1. */
static gint
mt_bucket_find (guint64 b, guint64 v)
{
  volatile guint64 * ways = &mt_live_table[b * MT_LIVE_WAYS];
  gint i;
  for (i = 0; i != MT_LIVE_WAYS; i++)
    if (ways[i] == v)
      return i;
  return -1;
}

static void
mt_bucket_clear (guint64 b, gint i)
{
  mt_live_table[b * MT_LIVE_WAYS + (guint64) i] = 0;
  g_atomic_int_add (&mt_live_occupancy[b], -1);
  g_atomic_pointer_add (&mt_globals.live_count, -1);
}

static void
mt_free_record (MtSlot * s, guint kind, guint64 p, guint64 size)
{
  MtFreeRecord * rec;
  s->counters[MT_C_TRACKED_FREES]++;
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

/* Is anything listed at p (any state)?  A cheap look without the lock first. */
static gboolean
mt_listed (guint64 p, guint64 * bucket)
{
  guint64 b = mt_live_bucket (p);
  *bucket = b;
  return mt_globals.live_count != 0 && mt_live_occupancy[b] != 0;
}

/* An allocation at p, before it is recorded: what is still listed at p was freed unlogged. */
static void
mt_logger_claim (MtSlot * s, guint64 p)
{
  guint64 b;
  gint i;
  if (p == 0 || !mt_listed (p, &b))
    return;
  mt_bucket_lock (b);
  if ((i = mt_bucket_find (b, p | MT_LIVE_SUSPECT)) >= 0)
  {
    /* The suspect was the old block of a realloc: its release is this. */
    mt_bucket_clear (b, i);
    s->counters[MT_C_REALLOC_REUSE_SEEN]++;
    mt_free_record (s, MT_K_REALLOC, p, 0);
  }
  else if ((i = mt_bucket_find (b, p)) >= 0)
  {
    mt_live_table[b * MT_LIVE_WAYS + (guint64) i] = p | MT_LIVE_OWED;
    s->counters[MT_C_REALLOC_REUSE_SEEN]++;
  }
  mt_unlock (&mt_live_locks[b]);
}

/* A free of p (logged before the free), or the old half of an in-place realloc: the live entry
 * at p, else the suspect one (the entry was the live block's after all). */
static void
mt_logger_release (MtSlot * s, guint kind, guint64 p)
{
  guint64 b;
  gint i;
  if (p == 0 || !mt_listed (p, &b))
    return;
  mt_bucket_lock (b);
  if ((i = mt_bucket_find (b, p)) < 0)
    i = mt_bucket_find (b, p | MT_LIVE_SUSPECT);
  if (i >= 0)
    mt_bucket_clear (b, i);
  mt_unlock (&mt_live_locks[b]);
  if (i >= 0)
    mt_free_record (s, kind, p, 0);
}

/* The old block of a moved realloc, logged after the zone freed it: another thread may already
 * have been handed the address (and may or may not have logged it). */
static void
mt_logger_release_moved (MtSlot * s, guint64 p)
{
  guint64 b;
  gint i;
  gboolean release = FALSE;
  if (p == 0 || !mt_listed (p, &b))
    return;
  mt_bucket_lock (b);
  if ((i = mt_bucket_find (b, p | MT_LIVE_OWED)) >= 0)
  {
    mt_bucket_clear (b, i);
    release = TRUE;
  }
  else if ((i = mt_bucket_find (b, p)) >= 0)
  {
    gsize (*size_of) (gconstpointer) = mt_block_size;
    if (size_of != NULL && size_of ((gconstpointer) (gsize) p) != 0)
    {
      /* Handed out again and not logged as such: whose is the entry?  The next event decides. */
      mt_live_table[b * MT_LIVE_WAYS + (guint64) i] = p | MT_LIVE_SUSPECT;
      s->counters[MT_C_REALLOC_REUSE_SEEN]++;
    }
    else
    {
      mt_bucket_clear (b, i);
      release = TRUE;
    }
  }
  mt_unlock (&mt_live_locks[b]);
  if (release)
    mt_free_record (s, MT_K_REALLOC, p, 0);
}

/* A VM region of the task's own: counted by kind (never in the malloc tiers), always listed
 * (VM calls are rare and large), stacked above the stack threshold, its tag in the record. */
static void
mt_on_vm_alloc (MtSlot * s, guint kind, guint64 p, guint64 size, guint tag, gpointer fp)
{
  guint16 flags = (guint16) ((tag & 0xff) << MT_FLAG_TAG_SHIFT);
  guint32 stack_id = MT_NO_STACK;
  MtAllocRecord * rec;
  s->counters[MT_C_CALLS + kind]++;
  s->counters[MT_C_BYTES + kind] += size;
  if (size >= mt_config.stack_threshold)
  {
    guint64 frames[MT_MAX_FRAMES];
    gboolean truncated;
    guint n = mt_walk (s, fp, frames, (guint) mt_config.max_frames, &truncated);
    if (truncated)
    {
      flags |= MT_FLAG_TRUNCATED;
      s->counters[MT_C_TRUNCATED_STACKS]++;
    }
    stack_id = mt_intern (s, frames, n);
  }
  if (mt_live_insert (p | MT_LIVE_VM))
    flags |= MT_FLAG_LIVE;
  else
    s->counters[MT_C_LIVE_TABLE_FULL]++;
  rec = (MtAllocRecord *) mt_ring_reserve (s, sizeof (MtAllocRecord));
  if (rec == NULL)
  {
    if (flags & MT_FLAG_LIVE)
    {
      guint64 b = mt_live_bucket (p | MT_LIVE_VM);
      gint i;
      mt_bucket_lock (b);
      if ((i = mt_bucket_find (b, p | MT_LIVE_VM)) >= 0)
        mt_bucket_clear (b, i);
      mt_unlock (&mt_live_locks[b]);
    }
    return;
  }
  rec->type = MT_REC_ALLOC;
  rec->kind = (guint8) kind;
  rec->flags = flags;
  rec->stack_id = stack_id;
  rec->ptr = p;
  rec->size = size;
  rec->weight = size;
  mt_ring_commit (s, sizeof (MtAllocRecord));
}

/* A deallocation counts when it ends a region the task's own VM calls made; others (libmalloc's
 * regions, what was mapped before the window) only bump vm_untracked_frees. */
static void
mt_on_vm_free (MtSlot * s, guint64 p, guint64 size)
{
  guint64 b;
  gint i = -1;
  if (mt_listed (p | MT_LIVE_VM, &b))
  {
    mt_bucket_lock (b);
    if ((i = mt_bucket_find (b, p | MT_LIVE_VM)) >= 0)
      mt_bucket_clear (b, i);
    mt_unlock (&mt_live_locks[b]);
  }
  if (i < 0)
  {
    s->counters[MT_C_VM_UNTRACKED_FREES]++;
    return;
  }
  s->counters[MT_C_CALLS + MT_K_VM_DEALLOCATE]++;
  s->counters[MT_C_BYTES + MT_K_VM_DEALLOCATE] += size;
  mt_free_record (s, MT_K_VM_DEALLOCATE, p, size);
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

void
mt_malloc_logger (guint32 type, guint64 arg1, guint64 arg2, guint64 arg3, guint64 result, guint32 skip)
{
  gpointer fp = __builtin_frame_address (0);
  volatile gint * inflight = mt_inflight_shard (fp);
  MtLoggerEvent ev;
  MtSlot * s;
  (void) skip;
  g_atomic_int_add (inflight, 1);
  if (!mt_config.enabled)
    goto out;
  mt_logger_decode (type, arg1, arg2, arg3, result, (guint64) mt_self_task, &ev);
  if (ev.op == MT_OP_IGNORE)
    goto out;
  s = mt_enter ();
  if (s == NULL)
    goto out;
  switch (ev.op)
  {
    case MT_OP_ALLOC:
      mt_logger_claim (s, ev.ptr);
      mt_on_alloc (s, (guint) ev.kind, (gpointer) ev.ptr, ev.size, fp);
      break;
    case MT_OP_FREE:
      s->counters[MT_C_CALLS + MT_K_FREE]++;
      mt_logger_release (s, MT_K_FREE, ev.old_ptr);
      break;
    case MT_OP_REALLOC:
      if (ev.old_ptr != 0 && ev.ptr == ev.old_ptr)
        mt_logger_release (s, MT_K_REALLOC, ev.old_ptr);
      else if (ev.old_ptr != 0 && (ev.ptr != 0 || ev.size == 0))
        mt_logger_release_moved (s, ev.old_ptr);
      if (ev.ptr != ev.old_ptr)
        mt_logger_claim (s, ev.ptr);
      mt_on_alloc (s, MT_K_REALLOC, (gpointer) ev.ptr, ev.size, fp);
      break;
    case MT_OP_VM_ALLOC:
      mt_on_vm_alloc (s, (guint) ev.kind, ev.ptr, ev.size, (guint) ev.tag, fp);
      break;
    case MT_OP_VM_FREE:
      mt_on_vm_free (s, ev.old_ptr, ev.size);
      break;
    case MT_OP_VM_SKIP:
      s->counters[ev.skip]++;
      break;
  }
  mt_leave (s);
out:
  g_atomic_int_add (inflight, -1);
}

/* The agent's own thread (its JavaScript runs here: symbolization loads CoreSymbolication, whose
 * allocations are the agent's, not the app's): marked busy for good, so every call it makes is
 * passed through as nested.  Returns TRUE when the thread has its slot. */
gboolean
mt_ignore_this_thread (void)
{
  return mt_enter () != NULL;
}

/* ---- Linux (and Darwin fallback): the public malloc family ------------- */

/* One replacement per entry that returns the new block: the real call, then the count and
 * (above the thresholds) the record.  The frame address is taken in the replacement itself:
 * it is the start of the caller's stack. */
#define MT_DEFINE_ALLOC(fn, kind, size_expr, params, args)              \
  gpointer                                                              \
  mt_##fn params                                                        \
  {                                                                     \
    gpointer fp = __builtin_frame_address (0);                          \
    MtSlot * s;                                                         \
    gpointer p;                                                         \
    if (!mt_config.enabled || (s = mt_enter ()) == NULL)                \
      return real_##fn args;                                            \
    p = real_##fn args;                                                 \
    mt_on_alloc (s, kind, p, size_expr, fp);                            \
    mt_leave (s);                                                       \
    return p;                                                           \
  }

MT_DEFINE_ALLOC (malloc, MT_K_MALLOC, size, (gsize size), (size))
MT_DEFINE_ALLOC (calloc, MT_K_CALLOC, (guint64) n * (guint64) size, (gsize n, gsize size), (n, size))

/* A free of the old block plus an allocation of the new one: the nested
 * malloc/free glibc makes inside realloc are ours (busy) and go uncounted. */
gpointer
mt_realloc (gpointer old, gsize size)
{
  gpointer fp = __builtin_frame_address (0);
  MtSlot * s;
  gpointer p;
  if (!mt_config.enabled || (s = mt_enter ()) == NULL)
    return real_realloc (old, size);
  if (old != NULL)
    mt_on_release (s, MT_K_REALLOC, old, 0);
  /* The old block leaves the live table before the real call: once realloc
   * returns, another thread may be handed the same address.  (If realloc then
   * fails, the old block lives on untracked.) */
  p = real_realloc (old, size);
  if (p == NULL && size == 0)
    mt_count_call (s, MT_K_REALLOC, 0);   /* realloc(p, 0) frees; it does not fail */
  else
    mt_on_alloc (s, MT_K_REALLOC, p, size, fp);
  mt_leave (s);
  return p;
}

void
mt_free (gpointer p)
{
  MtSlot * s;
  if (!mt_config.enabled || (s = mt_enter ()) == NULL)
  {
    real_free (p);
    return;
  }
  s->counters[MT_C_CALLS + MT_K_FREE]++;
  mt_on_release (s, MT_K_FREE, p, 0);
  real_free (p);
  mt_leave (s);
}

gint
mt_posix_memalign (gpointer * out, gsize alignment, gsize size)
{
  gpointer fp = __builtin_frame_address (0);
  MtSlot * s;
  gint r;
  if (!mt_config.enabled || (s = mt_enter ()) == NULL)
    return real_posix_memalign (out, alignment, size);
  r = real_posix_memalign (out, alignment, size);
  mt_on_alloc (s, MT_K_POSIX_MEMALIGN, r == 0 ? *out : NULL, size, fp);
  mt_leave (s);
  return r;
}

MT_DEFINE_ALLOC (memalign, MT_K_MEMALIGN, size, (gsize alignment, gsize size), (alignment, size))
MT_DEFINE_ALLOC (aligned_alloc, MT_K_ALIGNED_ALLOC, size, (gsize alignment, gsize size), (alignment, size))
MT_DEFINE_ALLOC (valloc, MT_K_VALLOC, size, (gsize size), (size))
MT_DEFINE_ALLOC (pvalloc, MT_K_PVALLOC, size, (gsize size), (size))
