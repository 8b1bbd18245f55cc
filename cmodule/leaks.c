/*
 * memtrace --leaks: a conservative reachability scan inside the target, as LeakSanitizer and
 * macOS `leaks` do it.  Compiled into the malloc tracer's CModule after the core and malloc.c;
 * driven by agents/leaks.js, which passes an MtLeakJob (memtrace/layout.py) with every buffer
 * already allocated: nothing here allocates, locks or calls the target's allocator, because
 * while the world is stopped a stopped thread may hold any lock.
 *
 *   candidates  the tracked live blocks, through ONE accessor (mt_leak_candidates below)
 *   roots       every stopped thread's registers and its stack from sp up; every range the
 *               agent lists (module data and bss, the heap, anonymous mappings) minus the
 *               candidate blocks themselves and minus memtrace's own tables
 *   marking     a block is reachable when a root word, or a word of a reachable block, points
 *               into it (interior pointers count); everything unmarked is leaked, cycles
 *               included
 *
 * Stopping the world
 *   Linux:  cmodule/world.c (shared with the hooks' patching): a ptrace helper holds every thread
 *           but the scanning thread and Frida's own.  An MtLeakJob starts with an MtWorld, so
 *           mt_leak_stop hands it over as one.  It fails where ptrace is not allowed (another
 *           tracer attached, a seccomp filter, Yama scope 3); the scan then runs with the world
 *           moving and says so (n_failed).
 *   Darwin: task_threads + thread_suspend + thread_get_state, and thread_resume after.
 *           DEVICE-UNVERIFIED: written from xnu's headers, not run on a device.
 *
 * Every read of a root or a block goes through mt_leak_read (process_vm_readv on Linux,
 * mach_vm_read_overwrite on Darwin), which fails instead of faulting on memory unmapped since
 * the agent listed the ranges.
 */

#define MT_LEAK_CHUNK 65536
#define MT_LEAK_RED_ZONE 128       /* x86-64 leaf functions use 128 bytes below sp */
/* glibc's own bookkeeping (the arena's top, its free lists) points at the start of the chunk after
 * an in-use block: 16-byte aligned, and at most 8 bytes before the end of the block's requested
 * size (a block's usable size is at least its requested size, and the next chunk starts 8 bytes
 * before the end of the usable size).  Such a word is not a reference to the block (mt_leak_find). */
#ifdef MT_DARWIN
# define MT_LEAK_CHUNK_ALIGN 0
#else
# define MT_LEAK_CHUNK_ALIGN 16
#endif

extern gint usleep (guint usec);

#ifdef MT_DARWIN
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
# ifdef MT_ARM64
#  define MT_THREAD_STATE_FLAVOR 6           /* ARM_THREAD_STATE64: x0..x28, fp, lr, sp, pc, cpsr */
#  define MT_THREAD_STATE_COUNT 68
#  define MT_SP_INDEX 31
# else
#  define MT_THREAD_STATE_FLAVOR 4           /* x86_THREAD_STATE64: rax rbx rcx rdx rdi rsi rbp rsp ... */
#  define MT_THREAD_STATE_COUNT 42
#  define MT_SP_INDEX 7
# endif
#define MT_VM_MEMORY_STACK 30
#else
extern gssize process_vm_readv (gint pid, gpointer local, gulong nlocal, gpointer remote, gulong nremote,
    gulong flags);
#endif

/* ---- the one accessor on core.c's live table ------------------------------------------------ */

/*
 * THE candidate accessor: every tracked live malloc block as (ptr, size, stack id), at most `cap`;
 * returns how many were written, sets *total to how many the table holds and *undecided to how
 * many of those the Darwin logger path holds undecided (owed or suspect entries: malloc.c), which
 * are not candidates: their address may be another block's by now.  The sizes are the requested
 * sizes the table keeps (no allocator call: the world is stopped), the stacks the blocks' own;
 * VM regions (the logger path's) are not malloc blocks and not counted.  Nothing else in this file
 * reads core.c's tables.
 */
guint64
mt_leak_candidates (MtLeakBlock * out, guint64 cap, guint64 * total, guint64 * undecided)
{
  guint64 i, n = 0, all = 0, held = 0;
  guint64 entries = (mt_config.live_mask + 1) * MT_LIVE_WAYS;
  for (i = 0; i != entries; i++)
  {
    guint64 p = mt_live_table[i];
    if (p == 0 || (p & MT_LIVE_VM) != 0)
    {
      if ((i & (MT_LIVE_WAYS - 1)) == 0 && mt_live_occupancy[i / MT_LIVE_WAYS] == 0)
        i += MT_LIVE_WAYS - 1;     /* an empty bucket */
      continue;
    }
    all++;
    if ((p & (MT_LIVE_SUSPECT | MT_LIVE_OWED)) != 0)
    {
      held++;
      continue;
    }
    if (n < cap)
    {
      out[n].ptr = p;
      out[n].size = mt_live_meta[i].size;
      out[n].stack_id = mt_live_meta[i].stack_id;
      out[n].reserved = 0;
      n++;
    }
  }
  *total = all;
  *undecided = held;
  return n;
}

/* ---- reading memory that may have gone away ------------------------------------------------- */

static gboolean
mt_leak_read (MtLeakJob * job, guint64 addr, guint64 len, guint8 * buf)
{
#ifdef MT_DARWIN
  guint64 got = 0;
  if (mach_vm_read_overwrite (mach_task_self_, addr, len, (guint64) buf, &got) != 0)
    return FALSE;
  return got == len;
#else
  guint64 local[2], remote[2];
  local[0] = (guint64) buf;
  local[1] = len;
  remote[0] = addr;
  remote[1] = len;
  return process_vm_readv ((gint) job->tgid, local, 1, remote, 1, 0) == (gssize) len;
#endif
}

/* Linux: the process's thread ids (the agent tells Frida's own apart); Darwin: 0. */
guint64
mt_leak_list_tasks (guint64 tgid, guint64 * out, guint64 cap)
{
#ifdef MT_DARWIN
  return 0;
#else
  return mt_world_list_tasks (tgid, out, cap);
#endif
}

/* Stops every thread but the caller and job->skip; 1 when the world is stopped (n_failed says
 * how many threads could not be), 0 when no thread could be stopped at all. */
gint
mt_leak_stop (MtLeakJob * job)
{
#ifdef MT_DARWIN
  mt_port_t * list = NULL;
  guint32 count = 0, i;
  const guint64 * skip = (const guint64 *) job->skip;
  if (task_threads (mach_task_self_, &list, &count) != 0)
  {
    job->state = MT_LEAK_FAILED;
    return 0;
  }
  for (i = 0; i != count; i++)
  {
    mt_port_t th = list[i];
    gboolean skipped = (guint64) th == job->self_tid;
    guint64 k;
    for (k = 0; !skipped && k != job->n_skip; k++)
      skipped = skip[k] == (guint64) th;
    if (!skipped && job->n_threads < job->threads_cap && thread_suspend (th) == 0)
    {
      MtLeakThread * t = (MtLeakThread *) job->threads + job->n_threads;
      guint64 * regs = (guint64 *) job->regs + job->n_threads * MT_LEAK_REGS;
      guint32 cnt = MT_THREAD_STATE_COUNT;
      guint r;
      for (r = 0; r != MT_LEAK_REGS; r++)
        regs[r] = 0;
      t->tid = th;
      t->sp = 0;
      if (thread_get_state (th, MT_THREAD_STATE_FLAVOR, (guint32 *) regs, &cnt) == 0)
        t->sp = regs[MT_SP_INDEX];
      job->n_threads++;
      continue;     /* the port is released at resume */
    }
    if (!skipped)
      job->n_failed++;
    mach_port_deallocate (mach_task_self_, th);
  }
  mach_vm_deallocate (mach_task_self_, (guint64) list, (guint64) count * sizeof (mt_port_t));
  job->state = MT_LEAK_STOPPED;
  return 1;
#else
  return mt_world_stop ((MtWorld *) job);
#endif
}

void
mt_leak_resume (MtLeakJob * job)
{
#ifdef MT_DARWIN
  guint64 i;
  for (i = 0; i != job->n_threads; i++)
  {
    mt_port_t th = (mt_port_t) ((MtLeakThread *) job->threads)[i].tid;
    thread_resume (th);
    mach_port_deallocate (mach_task_self_, th);
  }
  job->state = MT_LEAK_RESUMED;
#else
  mt_world_resume ((MtWorld *) job);
#endif
}

/* Darwin: the VM user tag of the region holding addr (VM_MEMORY_STACK = 30 marks thread
 * stacks); -1 when unknown.  Linux has no tags: the agent finds stacks by their guard page. */
gint
mt_leak_region_tag (guint64 addr)
{
#ifdef MT_DARWIN
  guint64 a = addr, size = 0;
  guint32 depth = 0x7fffffff;
  gint32 info[32];                          /* vm_region_submap_info_64: user_tag at word 4 */
  guint32 count = 19;                       /* VM_REGION_SUBMAP_INFO_COUNT_64 */
  if (mach_vm_region_recurse (mach_task_self_, &a, &size, &depth, info, &count) != 0 || a > addr)
    return -1;
  return (gint) info[4];
#else
  return -1;
#endif
}

/* ---- the scan -------------------------------------------------------------------------------- */

static void
mt_leak_sort (MtLeakBlock * a, guint64 n)
{
  /* Heapsort: no recursion, no allocation, bounded time. */
  guint64 start, end, root, child;
  MtLeakBlock tmp;
  if (n < 2)
    return;
  for (start = n / 2; start-- > 0;)
  {
    root = start;
    while ((child = 2 * root + 1) < n)
    {
      if (child + 1 < n && a[child].ptr < a[child + 1].ptr)
        child++;
      if (a[root].ptr >= a[child].ptr)
        break;
      tmp = a[root]; a[root] = a[child]; a[child] = tmp;
      root = child;
    }
  }
  for (end = n - 1; end > 0; end--)
  {
    tmp = a[0]; a[0] = a[end]; a[end] = tmp;
    root = 0;
    while ((child = 2 * root + 1) < end)
    {
      if (child + 1 < end && a[child].ptr < a[child + 1].ptr)
        child++;
      if (a[root].ptr >= a[child].ptr)
        break;
      tmp = a[root]; a[root] = a[child]; a[child] = tmp;
      root = child;
    }
  }
}

/* Collects the candidates (world stopped), sorted by address, none marked.  Returns how many. */
guint64
mt_leak_collect (MtLeakJob * job)
{
  guint64 i, total = 0, undecided = 0;
  MtLeakBlock * blocks = (MtLeakBlock *) job->blocks;
  job->n_blocks = mt_leak_candidates (blocks, job->blocks_cap, &total, &undecided);
  job->blocks_total = total;
  job->undecided_blocks = undecided;
  mt_leak_sort (blocks, job->n_blocks);
  for (i = 0; i != job->n_blocks; i++)
    ((guint8 *) job->marks)[i] = 0;
  job->n_work = 0;
  job->phase = 0;
  job->range_index = 0;
  job->range_offset = 0;
  return job->n_blocks;
}

/* Where a pointer into the block may end: a block of 0 bytes is still pointed at by its address. */
static inline guint64
mt_leak_end (const MtLeakBlock * b)
{
  return b->ptr + (b->size != 0 ? b->size : 1);
}

/* The candidate holding address v (interior pointers count), or -1. */
static inline gint64
mt_leak_find (MtLeakJob * job, guint64 v)
{
  const MtLeakBlock * b = (const MtLeakBlock *) job->blocks;
  guint64 lo = 0, hi = job->n_blocks, end;
  if (hi == 0 || v < b[0].ptr || v >= mt_leak_end (&b[hi - 1]))
    return -1;
  while (hi - lo > 1)
  {
    guint64 mid = lo + (hi - lo) / 2;
    if (b[mid].ptr <= v)
      lo = mid;
    else
      hi = mid;
  }
  end = mt_leak_end (&b[lo]);
  if (v < b[lo].ptr || v >= end)
    return -1;
  if (MT_LEAK_CHUNK_ALIGN != 0 && v != b[lo].ptr && (v & (MT_LEAK_CHUNK_ALIGN - 1)) == 0 && v + 8 >= end)
    return -1;     /* where the next chunk may start: the allocator's pointer, not the program's */
  return (gint64) lo;
}

static inline void
mt_leak_mark_word (MtLeakJob * job, guint64 v)
{
  gint64 j = mt_leak_find (job, v);
  guint8 * marks = (guint8 *) job->marks;
  if (j >= 0 && marks[j] == 0)
  {
    marks[j] = 1;
    ((guint32 *) job->worklist)[job->n_work++] = (guint32) j;
  }
}

/* Reads [addr, addr + len) and marks what its words point at; FALSE when unreadable. */
static gboolean
mt_leak_scan_words (MtLeakJob * job, guint64 addr, guint64 len)
{
  guint8 * buf = (guint8 *) job->scratch;
  guint64 done = 0;
  while (done < len)
  {
    guint64 n = MIN (len - done, job->scratch_size), k;
    if (!mt_leak_read (job, addr + done, n, buf))
      return FALSE;
    for (k = 0; k + 8 <= n; k += 8)
      mt_leak_mark_word (job, *(guint64 *) (buf + k));
    done += n;
  }
  return TRUE;
}

/* Scans marked blocks until the worklist is empty or the budget is spent. */
static guint64
mt_leak_drain (MtLeakJob * job, guint64 budget)
{
  const MtLeakBlock * b = (const MtLeakBlock *) job->blocks;
  guint64 spent = 0;
  while (job->n_work > 0 && spent < budget)
  {
    guint32 j = ((guint32 *) job->worklist)[--job->n_work];
    guint64 len = b[j].size & ~(guint64) 7;
    if (mt_leak_scan_words (job, b[j].ptr, len))
      job->block_bytes += len;
    else
      job->skip_unreadable += len;
    spent += len + 64;
  }
  return spent;
}

/* The first candidate that ends after addr. */
static guint64
mt_leak_first_after (MtLeakJob * job, guint64 addr)
{
  const MtLeakBlock * b = (const MtLeakBlock *) job->blocks;
  guint64 lo = 0, hi = job->n_blocks;
  while (lo < hi)
  {
    guint64 mid = lo + (hi - lo) / 2;
    if (b[mid].ptr + b[mid].size <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Where a stopped thread's stack starts inside [base, end): its sp less the red zone; 0 if none. */
static guint64
mt_leak_stack_start (MtLeakJob * job, guint64 base, guint64 end)
{
  const MtLeakThread * t = (const MtLeakThread *) job->threads;
  guint64 i, lowest = 0;
  for (i = 0; i != job->n_threads; i++)
  {
    guint64 sp = t[i].sp;
    if (sp >= base && sp < end && (lowest == 0 || sp < lowest))
      lowest = sp;
  }
  if (lowest == 0)
    return 0;
  return lowest - base > MT_LEAK_RED_ZONE ? (lowest - MT_LEAK_RED_ZONE) & ~(guint64) 7 : base;
}

/* One slice of the scan: about `budget` bytes read.  Returns 1 when the scan is complete. */
gint
mt_leak_step (MtLeakJob * job, guint64 budget)
{
  const MtLeakBlock * b = (const MtLeakBlock *) job->blocks;
  const MtLeakRange * ranges = (const MtLeakRange *) job->ranges;
  guint64 spent = 0;
  guint64 here = (guint64) &spent;

  if (job->phase == 0)
  {
    /* Registers first: a pointer held only in a register is a root. */
    const guint64 * regs = (const guint64 *) job->regs;
    guint64 i;
    for (i = 0; i != job->n_threads * MT_LEAK_REGS; i++)
      mt_leak_mark_word (job, regs[i]);
    job->phase = 1;
  }

  while (job->phase == 1 && spent < budget)
  {
    const MtLeakRange * r;
    guint64 base, end, addr, k;
    if (job->n_work > 0)
    {
      spent += mt_leak_drain (job, budget - spent);
      continue;
    }
    if (job->range_index >= job->n_ranges)
    {
      job->phase = 2;
      break;
    }
    r = &ranges[job->range_index];
    base = r->base;
    end = r->base + r->size;
    if (job->range_offset == 0)
    {
      /* Where this range starts being a root. */
      guint64 start = mt_leak_stack_start (job, base, end);
      if (here >= base && here < end)
      {
        job->skip_own += r->size;
        job->range_index++;
        continue;
      }
      if (start != 0)
      {
        job->skip_stack += start - base;       /* below sp: dead frames, not roots */
        job->range_offset = start - base;
      }
      else if (r->flags & MT_LEAK_RANGE_STACK)
      {
        job->skip_stack += r->size;
        job->range_index++;
        continue;
      }
    }
    addr = base + job->range_offset;
    /* A chunk of the range, stopping short of the next candidate block (blocks are not roots). */
    k = mt_leak_first_after (job, addr);
    if (k < job->n_blocks && b[k].ptr <= addr)
    {
      guint64 skip_to = MIN (end, (b[k].ptr + b[k].size + 7) & ~(guint64) 7);
      job->range_offset = skip_to - base;
    }
    else
    {
      guint64 stop = MIN (end, addr + MT_LEAK_CHUNK);
      if (k < job->n_blocks && b[k].ptr < stop)
        stop = b[k].ptr & ~(guint64) 7;
      if (stop <= addr)
        stop = MIN (end, addr + 8);
      if (mt_leak_scan_words (job, addr, stop - addr))
        job->root_bytes += stop - addr;
      else
        job->skip_unreadable += stop - addr;
      spent += stop - addr;
      job->range_offset = stop - base;
    }
    if (base + job->range_offset >= end)
    {
      job->range_index++;
      job->range_offset = 0;
    }
  }
  if (job->phase == 2 && job->n_work > 0)
  {
    mt_leak_drain (job, ~(guint64) 0);
  }
  return job->phase == 2 && job->n_work == 0;
}
