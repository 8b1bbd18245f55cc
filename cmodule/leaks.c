/*
 * memtrace --leaks: a conservative reachability scan inside the target, as LeakSanitizer and
 * macOS `leaks` do it.  Compiled into the malloc tracer's CModule after the core and malloc.c;
 * driven by agents/leaks.js, which passes an MtLeakJob (memtrace/layout.py) with every buffer
 * already allocated: nothing here allocates, locks or calls the target's allocator, because
 * while the world is stopped a stopped thread may hold any lock.
 *
 *   candidates  every live heap block: the tracked ones through ONE accessor on the core's live
 *               table (mt_leak_candidates below), and those the table does not hold (allocated
 *               before tracing), found by walking glibc's heaps and mmapped chunks (Linux) or by
 *               the malloc zones' enumerators (Darwin)
 *   roots       only live memory: every stopped thread's registers and its stack from sp up;
 *               every range the agent lists (module data and bss, TLS, anonymous mappings) minus
 *               the candidate blocks, minus the allocator's own memory (glibc's heaps and
 *               main_arena; Darwin's malloc regions) and minus memtrace's own tables; exited
 *               threads' cached stacks from their static TLS up; only resident pages
 *   marking     valgrind memcheck's: reachable through a pointer to a block's start, possibly
 *               lost through pointers into its middle only, then the unreached sorted into
 *               definitely lost (a clique's leader) and indirectly lost (reached from it),
 *               cycles included
 *
 * Stopping the world
 *   Linux:  cmodule/world.c (shared with the hooks' patching): a ptrace helper holds every thread
 *           but the scanning thread and Frida's own.  An MtLeakJob starts with an MtWorld, so
 *           mt_leak_stop hands it over as one (under a seccomp filter: world.c's signal stop,
 *           MT_WORLD_SIGSTOP).  It fails where ptrace is not allowed (another tracer attached,
 *           Yama scope 3); the scan then runs with the world moving and says so (n_failed).
 *   Darwin: cmodule/world.c too (MT_DARWIN: task_threads + thread_suspend + thread_get_state,
 *           thread_resume after), in one C call with the scan (mt_leak_scan_all); when the world
 *           cannot be stopped there the scan is not made (the zones' enumerators would walk a
 *           live heap).  DEVICE-UNVERIFIED: run in tests against the stand-in's Mach calls
 *           (demo/darwin/mtmach.c).
 *
 * Every read of a root, or of a block outside a heap walked while the world is stopped, goes
 * through mt_leak_read (process_vm_readv on Linux, mach_vm_read_overwrite on Darwin), which
 * fails instead of faulting on memory unmapped since the agent listed the ranges.
 */

#define MT_LEAK_CHUNK 65536
#define MT_LEAK_RED_ZONE 128       /* x86-64 leaf functions use 128 bytes below sp */
/* glibc's own bookkeeping (the arena's top, its free lists) points at the start of the chunk after
 * an in-use block: 16-byte aligned, and at most 8 bytes before the end of the block's requested
 * size (a block's usable size is at least its requested size, and the next chunk starts 8 bytes
 * before the end of the usable size).  When the main arena's state could not be found (and so is
 * not left out of the roots), such a word is not taken for a reference (job->interior_guard). */
#define MT_LEAK_CHUNK_ALIGN 16
#define MT_LEAK_MAX_ARENAS 4096
#define MT_LEAK_MAX_LIST 100000     /* entries followed on one free list before calling it corrupt */

extern gint usleep (guint usec);

#ifdef MT_DARWIN
/* The Mach calls (task_threads, thread_suspend, mach_vm_read_overwrite, mach_vm_region_recurse ...)
 * and mt_port_t are declared by world.c, compiled before this file: it stops the world for the
 * scan on Darwin too. */
/* vm_region_submap_info_64 is #pragma pack(4): protection, max_protection, inheritance, then the
 * 8-byte offset in words 3-4 (no padding), so user_tag is word 5, pages_resident word 6. */
#define MT_SUBMAP_USER_TAG_WORD 5
#define MT_MINCORE_INCORE 0x1
#define MT_MINCORE_PAGED_OUT 0x20
extern gint mincore (gpointer addr, gsize len, gchar * vec);
/* libmalloc's introspection (<malloc/malloc.h>): every zone's enumerator lists its blocks in use,
 * as leaks(1) lists a suspended task's.  malloc_zone_t: reserved1, reserved2, size, malloc, calloc,
 * valloc, free, realloc, destroy, zone_name, batch_malloc, batch_free, then introspect (word 12);
 * malloc_introspection_t starts with enumerator. */
typedef struct { guint64 address, size; } MtVmRange;
typedef gint (* MtMemoryReader) (mt_port_t task, guint64 address, guint64 size, gpointer * local);
typedef void (* MtRangeRecorder) (mt_port_t task, gpointer context, guint32 type, MtVmRange * ranges, guint32 n);
typedef gint (* MtZoneEnumerator) (mt_port_t task, gpointer context, guint32 type_mask, guint64 zone_address,
    MtMemoryReader reader, MtRangeRecorder recorder);
extern gint malloc_get_all_zones (mt_port_t task, MtMemoryReader reader, guint64 ** addresses, guint32 * count);
# define MT_MALLOC_PTR_IN_USE_RANGE_TYPE 1
# define MT_ZONE_INTROSPECT_WORD 12
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
    guint64 p = mt_live_entry_address (i);
    if (p == 0 || (p & MT_LIVE_VM) != 0)
      continue;
    all++;
    if ((p & (MT_LIVE_SUSPECT | MT_LIVE_OWED)) != 0)
    {
      held++;
      continue;
    }
    if (n < cap)
    {
      out[n].ptr = p;
      out[n].size = mt_live_entry_size (i, p);
      out[n].stack_id = mt_live_entry_stack_id (i);
      out[n].flags = 0;
      n++;
    }
  }
  *total = all;
  *undecided = held;
  return n;
}

/* Before the world stops (an estimate for sizing the scan's buffers): the bytes of heap chunks
 * the live table's blocks take (glibc: the requested size and the 8-byte header, rounded to 16,
 * at least 32). */
guint64
mt_leak_tracked_chunk_bytes (void)
{
  guint64 i, sum = 0;
  guint64 entries = (mt_config.live_mask + 1) * MT_LIVE_WAYS;
  for (i = 0; i != entries; i++)
  {
    guint64 p = mt_live_entry_address (i), c;
    if (p == 0 || (p & MT_LIVE_VM) != 0)
      continue;
    c = (mt_live_entry_size (i, p) + 8 + 15) & ~(guint64) 15;
    sum += c < 32 ? 32 : c;
  }
  return sum;
}

/* glibc's main_arena inside [base, base + size) (libc's writable data): the struct malloc_state
 * whose empty bins point at themselves, as only that structure's do (bin i's fd and bk both hold
 * the address 16 bytes before the pair), and whose arena list (next) comes back to it.  The list
 * check tells it from the same pattern 16 bytes off.  bins_offset: offsetof (struct malloc_state,
 * bins).  Reads through process_vm_readv (tgid: our pid): a wrong guess cannot fault.  Returns its
 * address, or 0. */
static gboolean mt_leak_read (MtLeakJob * job, guint64 addr, guint64 len, guint8 * buf);

guint64
mt_leak_find_main_arena (guint64 tgid, guint64 base, guint64 size, guint64 bins_offset, guint64 mstate_size,
    guint64 next_offset)
{
  guint64 x;
  MtLeakJob probe;
  probe.tgid = tgid;
  if (size < mstate_size)
    return 0;
  for (x = base; x + mstate_size <= base + size; x += 8)
  {
    const guint64 * bins = (const guint64 * ) (x + bins_offset);
    guint64 i, self = 0, a = x, hops;
    for (i = 0; i != 126; i++)
    {
      guint64 want = x + bins_offset - 16 + 16 * i;
      if (bins[2 * i] == want && bins[2 * i + 1] == want)
        self++;
      else if (bins[2 * i] == 0 || bins[2 * i + 1] == 0)
        break;                    /* a bin is never null */
    }
    if (i != 126 || self < 16)
      continue;
    for (hops = 0; hops != MT_LEAK_MAX_ARENAS; hops++)
    {
      if (!mt_leak_read (&probe, a + next_offset, 8, (guint8 *) &a) || a == 0)
        break;
      if (a == x)
        return x;
    }
  }
  return 0;
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

/* The process's thread ids -- Linux: task ids; Darwin: thread port names, their rights released --
 * for the agent to tell Frida's own apart (Cloak.hasThread).  How many there are (may be > cap). */
guint64
mt_leak_list_tasks (guint64 tgid, guint64 * out, guint64 cap)
{
  return mt_world_list_tasks (tgid, out, cap);
}

/* Stops every thread but the caller and job->skip; 1 when the world is stopped (n_failed says
 * how many threads could not be), 0 when no thread could be stopped at all. */
gint
mt_leak_stop (MtLeakJob * job)
{
  gint ok = mt_world_stop ((MtWorld *) job);
#ifdef MT_DARWIN
  guint64 i;
  /* arm64e: the sp thread_get_state gives is signed (world.c strips it with the platform's mask;
   * the job's own is the one the scan uses). */
  for (i = 0; ok && i != job->n_threads; i++)
    ((MtLeakThread *) job->threads)[i].sp &= job->ptr_mask;
#endif
  return ok;
}

void
mt_leak_resume (MtLeakJob * job)
{
  mt_world_resume ((MtWorld *) job);
}

/* Darwin: the VM user tag of the region holding addr (VM_MEMORY_STACK = 30 marks thread
 * stacks); -1 when unknown.  Linux has no tags: the agent finds stacks by their guard page. */
gint
mt_leak_region_tag (guint64 addr)
{
#ifdef MT_DARWIN
  guint64 a = addr, size = 0;
  guint32 depth = 0x7fffffff;
  gint32 info[32];
  guint32 count = MT_SUBMAP_INFO_COUNT_64;
  if (mach_vm_region_recurse (mach_task_self_, &a, &size, &depth, info, &count) != 0 || a > addr)
    return -1;
  return (gint) info[MT_SUBMAP_USER_TAG_WORD];
#else
  return -1;
#endif
}

/* ---- the scan -------------------------------------------------------------------------------- */

#ifndef MT_DARWIN
extern gssize pread (gint fd, gpointer buf, gsize count, gint64 offset);
#endif

/* Heapsort: no recursion, no allocation, bounded time.  One body for both arrays: T the element
 * type, KEY(x) what it is sorted by. */
#define MT_LEAK_HEAPSORT(name, T, KEY)                                              \
  static void                                                                       \
  name##_sift (T * a, guint64 root, guint64 n)                                      \
  {                                                                                 \
    guint64 child;                                                                  \
    T tmp;                                                                          \
    while ((child = 2 * root + 1) < n)                                              \
    {                                                                               \
      if (child + 1 < n && KEY (a[child]) < KEY (a[child + 1]))                     \
        child++;                                                                    \
      if (KEY (a[root]) >= KEY (a[child]))                                          \
        break;                                                                      \
      tmp = a[root]; a[root] = a[child]; a[child] = tmp;                            \
      root = child;                                                                 \
    }                                                                               \
  }                                                                                 \
                                                                                    \
  static void                                                                       \
  name (T * a, guint64 n)                                                           \
  {                                                                                 \
    guint64 start, end;                                                             \
    T tmp;                                                                          \
    if (n < 2)                                                                      \
      return;                                                                       \
    for (start = n / 2; start-- > 0;)                                               \
      name##_sift (a, start, n);                                                    \
    for (end = n - 1; end > 0; end--)                                               \
    {                                                                               \
      tmp = a[0]; a[0] = a[end]; a[end] = tmp;                                      \
      name##_sift (a, 0, end);                                                      \
    }                                                                               \
  }

#define MT_LEAK_BLOCK_KEY(x) ((x).ptr)
#define MT_LEAK_U64_KEY(x) (x)
MT_LEAK_HEAPSORT (mt_leak_sort, MtLeakBlock, MT_LEAK_BLOCK_KEY)
MT_LEAK_HEAPSORT (mt_leak_sort_u64, guint64, MT_LEAK_U64_KEY)

static gboolean
mt_leak_has_u64 (const guint64 * a, guint64 n, guint64 v)
{
  guint64 lo = 0, hi = n;
  while (lo < hi)
  {
    guint64 mid = lo + (hi - lo) / 2;
    if (a[mid] == v)
      return TRUE;
    if (a[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return FALSE;
}

/* The tracked candidate (blocks[0, n_tracked), sorted) that starts at ptr, or -1. */
static gint64
mt_leak_tracked_at (MtLeakJob * job, guint64 ptr)
{
  const MtLeakBlock * b = (const MtLeakBlock *) job->blocks;
  guint64 lo = 0, hi = job->n_tracked;
  while (lo < hi)
  {
    guint64 mid = lo + (hi - lo) / 2;
    if (b[mid].ptr == ptr)
      return (gint64) mid;
    if (b[mid].ptr < ptr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return -1;
}

/* ---- glibc's heaps, walked while the world is stopped ------------------------------------------
 *
 * A chunk is [prev_size][size | A | M | P][the block ...]; the block starts 16 bytes in and a chunk
 * is in use when the NEXT chunk's P bit is set.  Chunks on the tcache and fastbin lists keep that
 * bit (they look in use): the lists are followed first and their chunks left out, and so are the
 * tcache structures themselves (chunks glibc allocates for its own use).  What the walk finds in use
 * and the live table does not hold was allocated before tracing (or by a thread memtrace does not
 * trace). */

static guint64
mt_leak_word (MtLeakJob * job, guint64 addr, gboolean * ok)
{
  guint64 v = 0;
  if (!mt_leak_read (job, addr, 8, (guint8 *) &v))
    *ok = FALSE;
  return v;
}

static void
mt_leak_add_seg (MtLeakJob * job, guint64 base, guint64 size, guint64 first, guint64 end)
{
  MtLeakSeg * s = (MtLeakSeg *) job->segs;
  guint64 i;
  if (job->n_segs == job->segs_cap)
  {
    job->walk_errors++;
    return;
  }
  /* Kept sorted by base (a handful of entries: insertion). */
  i = job->n_segs++;
  while (i > 0 && s[i - 1].base > base)
  {
    s[i] = s[i - 1];
    i--;
  }
  s[i].base = base;
  s[i].size = size;
  s[i].first = first;
  s[i].end = end;
}

/* The walked segment holding chunk address p (its chunks' bounds), or NULL. */
static const MtLeakSeg *
mt_leak_walked_seg (MtLeakJob * job, guint64 p)
{
  const MtLeakSeg * s = (const MtLeakSeg *) job->segs;
  guint64 i;
  for (i = 0; i != job->n_segs; i++)
  {
    if (s[i].first != 0 && p >= s[i].first && p + 32 <= s[i].end)
      return &s[i];
  }
  return NULL;
}

static void
mt_leak_add_freed (MtLeakJob * job, guint64 chunk)
{
  if (job->n_freed < job->freed_cap)
    ((guint64 *) job->freed)[job->n_freed++] = chunk;
  else
    job->freed_over_capacity++;
}

static guint64
mt_leak_reveal (const MtLeakGlibc * g, guint64 slot, guint64 v)
{
  /* glibc >= 2.32 stores a free list's next pointer as PROTECT_PTR (slot, next). */
  return g->safe_linking ? ((slot >> 12) ^ v) : v;
}

/* Follows one singly linked free list (fastbin: chunk addresses, next at chunk + 16; tcache:
 * block addresses, next at block + 0) and remembers its chunks. */
static void
mt_leak_follow (MtLeakJob * job, guint64 p, gboolean is_tcache, guint64 limit)
{
  const MtLeakGlibc * g = (const MtLeakGlibc *) job->glibc;
  guint64 n = 0;
  while (p != 0 && n++ < limit)
  {
    guint64 chunk = is_tcache ? p - 16 : p;
    guint64 slot = is_tcache ? p : p + 16;
    if ((p & 15) != 0 || mt_leak_walked_seg (job, chunk) == NULL)
    {
      job->walk_errors++;
      return;
    }
    mt_leak_add_freed (job, chunk);
    p = mt_leak_reveal (g, slot, *(volatile guint64 *) slot);
  }
}

/* A tcache_perthread_struct (u16 counts[bins], then the bins' heads) that holds together: every
 * non-empty bin's head is a block of that bin's chunk size inside a walked heap. */
static gboolean
mt_leak_is_tcache (MtLeakJob * job, guint64 mem)
{
  const MtLeakGlibc * g = (const MtLeakGlibc *) job->glibc;
  const guint16 * counts = (const guint16 *) mem;
  const guint64 * heads = (const guint64 *) (mem + g->tcache_bins * 2);
  guint64 i;
  for (i = 0; i != g->tcache_bins; i++)
  {
    guint64 e = heads[i];
    if ((e == 0) != (counts[i] == 0))
      return FALSE;
    if (e == 0)
      continue;
    if ((e & 15) != 0 || mt_leak_walked_seg (job, e - 16) == NULL)
      return FALSE;
    if ((*(volatile guint64 *) (e - 8) & ~(guint64) 7) != 32 + 16 * i)
      return FALSE;
  }
  return TRUE;
}

/* pass 1: tcache structures (left out, their lists followed); pass 2: the candidates. */
static void
mt_leak_walk_seg (MtLeakJob * job, const MtLeakSeg * seg, gint pass)
{
  const MtLeakGlibc * g = (const MtLeakGlibc *) job->glibc;
  MtLeakBlock * blocks = (MtLeakBlock *) job->blocks;
  guint64 tcache_chunk = (g->tcache_bins * 10 + 8 + 15) & ~(guint64) 15;   /* glibc's request2size */
  guint64 p = seg->first;
  while (p + 16 <= seg->end)
  {
    guint64 sz = *(volatile guint64 *) (p + 8) & ~(guint64) 7, next;
    gboolean in_use;
    gint64 j;
    if (sz < 32)
    {
      if (pass == 2 && sz != 16 && sz != 0)     /* 16 and 0: the fence posts closing an old heap */
      {
        job->walk_errors++;
        job->walk_bytes_unwalked += seg->end - p;
      }
      return;
    }
    if ((sz & 15) != 0 || p + sz > seg->end)
    {
      if (pass == 2)
      {
        job->walk_errors++;
        job->walk_bytes_unwalked += seg->end - p;
      }
      return;
    }
    next = p + sz;
    if (next + 16 > seg->end)
      return;                      /* the top chunk: free */
    in_use = (*(volatile guint64 *) (next + 8) & 1) != 0;
    if (in_use)
    {
      j = (pass == 2 || sz == tcache_chunk) ? mt_leak_tracked_at (job, p + 16) : -1;
      if (pass == 1)
      {
        if (sz == tcache_chunk && j < 0 && g->tcache_bins != 0 && mt_leak_is_tcache (job, p + 16))
        {
          const guint16 * counts = (const guint16 *) (p + 16);
          const guint64 * heads = (const guint64 *) (p + 16 + g->tcache_bins * 2);
          guint64 i;
          job->n_allocator_meta++;
          mt_leak_add_freed (job, p);
          for (i = 0; i != g->tcache_bins; i++)
          {
            if (heads[i] != 0)
              mt_leak_follow (job, heads[i], TRUE, counts[i]);
          }
        }
      }
      else if (j >= 0)
      {
        blocks[j].flags |= MT_LEAK_BLOCK_IN_HEAP;
      }
      else if (!mt_leak_has_u64 ((const guint64 *) job->freed, job->n_freed, p))
      {
        job->blocks_total++;
        job->n_untracked++;
        if (job->n_blocks < job->blocks_cap)
        {
          MtLeakBlock * b = &blocks[job->n_blocks++];
          b->ptr = p + 16;
          b->size = sz - 8;        /* its usable size: what it was asked for is not known */
          b->stack_id = MT_NO_STACK;
          b->flags = MT_LEAK_BLOCK_UNTRACKED | MT_LEAK_BLOCK_IN_HEAP;
        }
      }
    }
    p = next;
  }
}

static guint64
mt_leak_first_chunk (guint64 after)
{
  /* glibc: the first chunk goes where its block is 16-byte aligned. */
  guint64 misalign = (after + 16) & 15;
  return misalign != 0 ? after + 16 - misalign : after;
}

/* Finds the heaps (main arena: the sbrk heap; every other arena: its mmapped heaps), follows the
 * fastbins, then walks the chunks twice. */
static void
mt_leak_glibc_walk (MtLeakJob * job)
{
  const MtLeakGlibc * g = (const MtLeakGlibc *) job->glibc;
  guint64 main_arena = g->main_arena, a, i, n_arenas = 0;
  gboolean ok = TRUE;

  if (main_arena == 0)
  {
    if (g->heap_start != 0)
      mt_leak_add_seg (job, g->heap_start, g->heap_end - g->heap_start, 0, 0);
    return;
  }
  mt_leak_add_seg (job, main_arena, g->mstate_size, 0, 0);     /* its state: bins aim into blocks */
  job->interior_guard = 0;
  a = main_arena;
  do
  {
    guint64 top = mt_leak_word (job, a + g->top_offset, &ok);
    guint64 top_size = mt_leak_word (job, top + 8, &ok) & ~(guint64) 7;
    if (!ok)
    {
      job->walk_errors++;
      break;
    }
    if (a == main_arena)
    {
      if (g->heap_start != 0)
      {
        gboolean contiguous = top >= g->heap_start && top + top_size <= g->heap_end;
        mt_leak_add_seg (job, g->heap_start, g->heap_end - g->heap_start,
            contiguous ? mt_leak_first_chunk (g->heap_start) : 0, contiguous ? top + top_size : 0);
        if (!contiguous)
          job->walk_errors++;      /* the main arena grew by mmap: its chunks are not walked */
      }
    }
    else
    {
      guint64 first_heap = a & ~(g->heap_max - 1), h = top & ~(g->heap_max - 1), k;
      guint64 hinfo = a - first_heap;
      for (k = 0; h != 0 && k != 65536; k++)
      {
        guint64 ar = mt_leak_word (job, h, &ok), prev = mt_leak_word (job, h + 8, &ok);
        guint64 size = mt_leak_word (job, h + 16, &ok), first, end;
        if (!ok || ar != a || size > g->heap_max || hinfo > 256)
        {
          job->walk_errors++;
          break;
        }
        first = h == first_heap ? mt_leak_first_chunk (a + g->mstate_size) : h + hinfo;
        end = (top >= h && top < h + size) ? top + top_size : h + size;
        mt_leak_add_seg (job, h, g->heap_max, first, end);
        h = prev;
      }
    }
    /* fastbins: chunk pointers, next at chunk + 16 */
    for (i = 0; i != g->n_fastbins; i++)
    {
      guint64 head = mt_leak_word (job, a + g->fastbins_offset + 8 * i, &ok);
      if (ok && head != 0)
        mt_leak_follow (job, head, FALSE, MT_LEAK_MAX_LIST);
    }
    a = mt_leak_word (job, a + g->next_offset, &ok);
  }
  while (ok && a != 0 && a != main_arena && ++n_arenas != MT_LEAK_MAX_ARENAS);

  for (i = 0; i != job->n_segs; i++)
  {
    const MtLeakSeg * s = (const MtLeakSeg *) job->segs + i;
    if (s->first != 0)
      mt_leak_walk_seg (job, s, 1);
  }
  mt_leak_sort_u64 ((guint64 *) job->freed, job->n_freed);
  for (i = 0; i != job->n_segs; i++)
  {
    const MtLeakSeg * s = (const MtLeakSeg *) job->segs + i;
    if (s->first != 0)
      mt_leak_walk_seg (job, s, 2);
  }
}

/* Blocks glibc gave out by mmap (large ones) that the live table does not hold: a mapping of their
 * own, starting with the chunk header {prev_size 0, size | IS_MMAPPED} (the exact flag bits: not
 * in a non-main arena, no PREV_INUSE), the size a whole number of pages.  Adjacent mappings the
 * kernel merged are followed chunk by chunk.  Read with mt_leak_read: nothing here can fault. */
#define MT_LEAK_MMAPPED_MIN (32 * 1024)

static void
mt_leak_mmapped_chunks (MtLeakJob * job)
{
  const MtLeakRange * ranges = (const MtLeakRange *) job->ranges;
  MtLeakBlock * blocks = (MtLeakBlock *) job->blocks;
  guint64 r;
  for (r = 0; r != job->n_ranges; r++)
  {
    guint64 p = ranges[r].base, end = ranges[r].base + ranges[r].size;
    if ((p & (job->page_size - 1)) != 0)
      continue;
    while (p + 16 <= end)
    {
      guint64 head[2], csz;
      if (!mt_leak_read (job, p, 16, (guint8 *) head))
        break;
      csz = head[1] & ~(guint64) 7;
      if (head[0] != 0 || (head[1] & 7) != 2 || csz < MT_LEAK_MMAPPED_MIN || (csz & (job->page_size - 1)) != 0 ||
          p + csz > end)
        break;
      if (mt_leak_tracked_at (job, p + 16) < 0)
      {
        job->blocks_total++;
        job->n_untracked++;
        if (job->n_blocks < job->blocks_cap)
        {
          MtLeakBlock * b = &blocks[job->n_blocks++];
          b->ptr = p + 16;
          b->size = csz - 16;
          b->stack_id = MT_NO_STACK;
          b->flags = MT_LEAK_BLOCK_UNTRACKED;
        }
      }
      p += csz;
    }
  }
}

#ifdef MT_DARWIN
/* Darwin: the blocks every malloc zone has in use that the live table does not hold (allocated
 * before tracing), from the zones' own enumerators, read in place (no reader: our own task).  The
 * enumerators take no lock (leaks(1) runs them on a suspended task).  DEVICE-UNVERIFIED; run in
 * tests against the stand-in's zone (demo/darwin/mtmach.c). */
static void
mt_leak_zone_recorder (mt_port_t task, gpointer context, guint32 type, MtVmRange * ranges, guint32 n)
{
  MtLeakJob * job = context;
  MtLeakBlock * blocks = (MtLeakBlock *) job->blocks;
  guint32 i;
  (void) task;
  if ((type & MT_MALLOC_PTR_IN_USE_RANGE_TYPE) == 0)
    return;
  for (i = 0; i != n; i++)
  {
    if (mt_leak_tracked_at (job, ranges[i].address) >= 0)
      continue;
    job->blocks_total++;
    job->n_untracked++;
    if (job->n_blocks < job->blocks_cap)
    {
      MtLeakBlock * b = &blocks[job->n_blocks++];
      b->ptr = ranges[i].address;
      b->size = ranges[i].size;
      b->stack_id = MT_NO_STACK;
      b->flags = MT_LEAK_BLOCK_UNTRACKED;
    }
  }
}

static void
mt_leak_darwin_zones (MtLeakJob * job)
{
  guint64 * zones = NULL;
  guint32 count = 0, z;
  if (malloc_get_all_zones (mach_task_self_, NULL, &zones, &count) != 0)
  {
    job->walk_errors++;
    return;
  }
  for (z = 0; z != count; z++)
  {
    const guint64 * zone = (const guint64 *) zones[z];
    const guint64 * introspect = zone != NULL ? (const guint64 *) zone[MT_ZONE_INTROSPECT_WORD] : NULL;
    MtZoneEnumerator enumerate = introspect != NULL ? (MtZoneEnumerator) introspect[0] : NULL;
    if (enumerate == NULL || enumerate (mach_task_self_, job, MT_MALLOC_PTR_IN_USE_RANGE_TYPE, zones[z], NULL,
        mt_leak_zone_recorder) != 0)
      job->walk_errors++;
  }
  if (job->n_blocks != job->n_tracked)
    mt_leak_sort ((MtLeakBlock *) job->blocks, job->n_blocks);
}
#endif

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
  job->n_tracked = job->n_blocks;
  job->n_untracked = 0;
  job->n_allocator_meta = 0;
  job->n_segs = 0;
  job->n_freed = 0;
#ifdef MT_DARWIN
  job->interior_guard = 0;
#else
  job->interior_guard = MT_LEAK_CHUNK_ALIGN;
#endif
#ifdef MT_DARWIN
  mt_leak_darwin_zones (job);
#endif
  if (job->glibc != 0)
  {
    mt_leak_glibc_walk (job);
    if (((const MtLeakGlibc *) job->glibc)->main_arena != 0)
      mt_leak_mmapped_chunks (job);
    if (job->n_blocks != job->n_tracked)
      mt_leak_sort (blocks, job->n_blocks);
  }
  for (i = 0; i != job->n_blocks; i++)
    ((guint8 *) job->marks)[i] = MT_LEAK_DEFINITELY_LOST;
  job->n_work = 0;
  job->phase = 0;
  job->range_index = 0;
  job->range_offset = 0;
  job->clique_index = 0;
  job->in_frida = 0;
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
  guint64 lo = 0, hi = job->n_blocks, end, guard = job->interior_guard;
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
  if (guard != 0 && v != b[lo].ptr && (v & (guard - 1)) == 0 && v + 8 >= end)
    return -1;     /* where the next chunk may start: the allocator's pointer, not the program's */
  return (gint64) lo;
}

static inline void
mt_leak_push (MtLeakJob * job, guint64 j)
{
  ((guint32 *) job->worklist)[job->n_work++] = (guint32) j;
}

/*
 * One word that may point at a candidate.  While the roots are marked (phase 1), as valgrind's
 * memcheck does: a pointer to a block's start from live memory (or from a reachable block) makes
 * it reachable; a pointer into its middle, or any pointer from a possibly reachable block, makes it
 * possibly lost; a block whose verdict rises is scanned (again).  While the unreached are sorted
 * (phase 2), any pointer from the clique's blocks makes a definitely lost block indirectly lost
 * (the clique's leader stays definitely lost).
 */
static inline void
mt_leak_mark_word (MtLeakJob * job, guint64 v, gboolean definite)
{
  gint64 j = mt_leak_find (job, v & job->ptr_mask);      /* arm64e: a signed pointer, stripped */
  guint8 * marks = (guint8 *) job->marks;
  guint8 via;
  if (j < 0)
    return;
  if (job->phase == 2)
  {
    if (marks[j] == MT_LEAK_DEFINITELY_LOST && (guint64) j != job->leader)
    {
      marks[j] = MT_LEAK_INDIRECTLY_LOST;
      mt_leak_push (job, (guint64) j);
    }
    return;
  }
  if (job->in_frida)
  {
    /* Every root of the app's is done: what only Frida's threads reach is Frida's (their DTVs). */
    if (marks[j] == MT_LEAK_DEFINITELY_LOST)
    {
      marks[j] = MT_LEAK_FRIDA_OWN;
      mt_leak_push (job, (guint64) j);
    }
    return;
  }
  via = (definite && (v & job->ptr_mask) == ((const MtLeakBlock *) job->blocks)[j].ptr) ? MT_LEAK_REACHABLE
      : MT_LEAK_POSSIBLY_LOST;
  if (via > marks[j])
  {
    marks[j] = via;
    mt_leak_push (job, (guint64) j);
  }
}

/* Which pages of [addr, addr + len) (within one scratch's worth) hold data: present or swapped.
 * Pages never touched are not read (reading would fault them in); they hold zeros anyway.
 * Sets bit i of *present for page i; FALSE when it cannot tell (then everything is read). */
static gboolean
mt_leak_resident (MtLeakJob * job, guint64 addr, guint64 len, guint64 * present)
{
#ifdef MT_DARWIN
  /* mincore: a byte per page; in core, or paged out (compressed or swapped: it holds data).  The
   * nano region's 512 MB reservation is mostly pages never touched: not read (reading would
   * zero-fill them into the app's footprint).  DEVICE-UNVERIFIED. */
  guint64 page = job->page_size, first = addr / page * page, n = (addr + len - first + page - 1) / page, i;
  gchar vec[64];
  if (n > 64 || mincore ((gpointer) first, n * page, vec) != 0)
    return FALSE;
  *present = 0;
  for (i = 0; i != n; i++)
  {
    if ((vec[i] & (MT_MINCORE_INCORE | MT_MINCORE_PAGED_OUT)) != 0)
      *present |= 1ULL << i;
  }
  return TRUE;
#else
  guint64 page = job->page_size, first = addr / page, last = (addr + len - 1) / page, n = last - first + 1, i;
  guint64 pm[64];
  if (job->pagemap_fd == ~(guint64) 0 || n > 64)
    return FALSE;
  if (pread ((gint) job->pagemap_fd, pm, n * 8, (gint64) (first * 8)) != (gssize) (n * 8))
    return FALSE;
  *present = 0;
  for (i = 0; i != n; i++)
  {
    if ((pm[i] >> 62) != 0)        /* bit 63 present, bit 62 swapped */
      *present |= 1ULL << i;
  }
  return TRUE;
#endif
}

/* Reads [addr, addr + len) (only its resident pages) and marks what its words point at; FALSE
 * when some of it was unreadable. */
static gboolean
mt_leak_scan_words (MtLeakJob * job, guint64 addr, guint64 len, gboolean definite)
{
  guint8 * buf = (guint8 *) job->scratch;
  guint64 done = 0;
  gboolean all_ok = TRUE;
  while (done < len)
  {
    guint64 at = addr + done, n = MIN (len - done, job->scratch_size), k, present = 0;
    gboolean known = mt_leak_resident (job, at, n, &present);
    guint64 psz = job->page_size, page0 = at / psz;
    k = 0;
    while (k < n)
    {
      /* one run of pages that are all resident, or all not */
      guint64 run_start = k, page = (at + k) / psz - page0;
      gboolean in = !known || ((present >> page) & 1) != 0;
      while (k < n)
      {
        guint64 pg = (at + k) / psz - page0;
        if (known && (((present >> pg) & 1) != 0) != in)
          break;
        k = MIN (n, (pg + page0 + 1) * psz - at);
      }
      if (!in)
      {
        job->skip_unresident += k - run_start;
        continue;
      }
      if (!mt_leak_read (job, at + run_start, k - run_start, buf))
      {
        job->skip_unreadable += k - run_start;
        all_ok = FALSE;
        continue;
      }
      {
        guint64 w;
        for (w = 0; w + 8 <= k - run_start; w += 8)
          mt_leak_mark_word (job, *(guint64 *) (buf + w), definite);
      }
    }
    done += n;
  }
  return all_ok;
}

/* Scans marked blocks until the worklist is empty or the budget is spent. */
static guint64
mt_leak_drain (MtLeakJob * job, guint64 budget)
{
  const MtLeakBlock * b = (const MtLeakBlock *) job->blocks;
  const guint8 * marks = (const guint8 *) job->marks;
  guint64 spent = 0;
  while (job->n_work > 0 && spent < budget)
  {
    guint32 j = ((guint32 *) job->worklist)[--job->n_work];
    guint64 len = b[j].size & ~(guint64) 7;
    gboolean definite = marks[j] == MT_LEAK_REACHABLE;
    if ((b[j].flags & MT_LEAK_BLOCK_IN_HEAP) != 0)
    {
      /* inside a heap walked while the world is stopped: mapped, read in place */
      const guint64 * w = (const guint64 *) b[j].ptr;
      guint64 k;
      for (k = 0; k != len / 8; k++)
        mt_leak_mark_word (job, w[k], definite);
      job->block_bytes += len;
    }
    else
    {
      guint64 before = job->skip_unreadable + job->skip_unresident;
      mt_leak_scan_words (job, b[j].ptr, len, definite);
      job->block_bytes += len - MIN (len, job->skip_unreadable + job->skip_unresident - before);
    }
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

/* The first allocator segment that ends after addr (n_segs: none). */
static guint64
mt_leak_seg_after (MtLeakJob * job, guint64 addr)
{
  const MtLeakSeg * s = (const MtLeakSeg *) job->segs;
  guint64 i;
  for (i = 0; i != job->n_segs; i++)
  {
    if (s[i].base + s[i].size > addr)
      return i;
  }
  return job->n_segs;
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

#if !defined (MT_DARWIN) && !defined (MT_ARM64)

/* ---- the exiting thread, at exit ------------------------------------------------------------
 *
 * The scan at exit runs while Frida's exit monitor holds the exiting thread inside exit(), deep in
 * its main loop.  That thread's frames below the program's call to exit are exit's, Frida's
 * Interceptor's and Frida's own, and their uninitialised slots still hold what the program's
 * earlier, deeper calls left there: a dropped block's address in malloc's or memset's dead frames.
 * valgrind knows such words undefined and never takes them for references; read as roots they
 * turned a definitely lost block into a reachable one (tests/programs/exit_stale.c).  So, on
 * x86-64 Linux, an exiting thread's stack is read from its call to exit or _exit up.
 *
 * The thread is told by what holds it: the exit monitor is an Interceptor listener, and the
 * Interceptor saved the program's registers at the call below it as a GumCpuContext (rip, r15 ..
 * r8, rdi, rsi, rbp, rsp, rbx, rdx, rcx, rax) whose rip is the intercepted function -- exit or
 * _exit -- and whose rsp is the stack pointer of the call: the slot of its return address (or the
 * slot below it), checked to be the return address of a call to exit (direct, through a PLT stub or
 * through the GOT).  Those 17 words stay roots, marked as registers are.  Each stopped thread costs
 * one read, of the MT_LEAK_EXIT_WINDOW bytes above its sp (the context sat 0.8 KiB above it in
 * tests): a word equal to exit or _exit is looked for there, in memory, and only such a word costs
 * more reads.  Searching instead for the lowest word that is the return address of a call to exit
 * cost a read per word that might be one, and took words that merely looked like one: the address
 * of a function placed right after a noreturn call to exit (main, on the main thread's stack) made
 * a thread blocked elsewhere lose its frames, and a block only they held was called lost.  A thread
 * without such a context (every thread but the exiting one) is read from its sp as before. */
#define MT_LEAK_EXIT_WINDOW (16 * 1024)     /* stack bytes above sp searched for the context */
#define MT_LEAK_EXIT_SEARCH (512 * 1024)    /* how far above sp the call to exit may be */
#define MT_LEAK_CONTEXT_WORDS 17
#define MT_LEAK_CONTEXT_RSP 12
#define MT_LEAK_EXIT_IOVS (MT_LEAK_EXIT_WINDOW / 4096 + 1)

static gboolean
mt_leak_is_exit (const MtLeakJob * job, guint64 target)
{
  return target != 0 && (target == job->exit_fn || target == job->exit_fn2);
}

/* mt_leak_read, counted as one of the exit search's reads. */
static gboolean
mt_leak_exit_read (MtLeakJob * job, guint64 addr, guint64 len, guint8 * buf)
{
  job->exit_reads++;
  return mt_leak_read (job, addr, len, buf);
}

/* Whether `ret` is the return address of a call to exit; reads code through mt_leak_read only (a
 * word that is no return address may point anywhere). */
static gboolean
mt_leak_returns_from_exit (MtLeakJob * job, guint64 ret)
{
  guint8 code[6], stub[16];
  guint64 target, slot;
  guint p = 0;
  if (ret < 0x10000 || ret >= (guint64) 0x800000000000ULL || !mt_leak_exit_read (job, ret - 6, 6, code))
    return FALSE;
  if (code[0] == 0xff && code[1] == 0x15)
  {
    /* call *slot(%rip) (-fno-plt) */
    slot = ret + (guint64) (gint64) *(const gint32 *) (code + 2);
    return mt_leak_exit_read (job, slot, 8, (guint8 *) &target) && mt_leak_is_exit (job, target);
  }
  if (code[1] != 0xe8)
    return FALSE;
  target = ret + (guint64) (gint64) *(const gint32 *) (code + 2);     /* call rel32 */
  if (mt_leak_is_exit (job, target))
    return TRUE;
  /* a PLT stub: [endbr64] [bnd] jmp *slot(%rip) */
  if (!mt_leak_exit_read (job, target, sizeof (stub), stub))
    return FALSE;
  if (stub[0] == 0xf3 && stub[1] == 0x0f && stub[2] == 0x1e && stub[3] == 0xfa)
    p = 4;
  if (stub[p] == 0xf2)
    p++;
  if (stub[p] != 0xff || stub[p + 1] != 0x25)
    return FALSE;
  slot = target + p + 6 + (guint64) (gint64) *(const gint32 *) (stub + p + 2);
  return mt_leak_exit_read (job, slot, 8, (guint8 *) &target) && mt_leak_is_exit (job, target);
}

/* Up to `len` bytes from `addr` in one read: as many as are readable, page by page (a remote iovec
 * per page; process_vm_readv stops at the first that fails).  Returns the bytes read. */
static guint64
mt_leak_read_prefix (MtLeakJob * job, guint64 addr, guint64 len, guint8 * buf)
{
  guint64 local[2], remote[2 * MT_LEAK_EXIT_IOVS], page = job->page_size != 0 ? job->page_size : 4096;
  guint64 at = addr, n = 0;
  gssize got;
  while (at < addr + len && n != MT_LEAK_EXIT_IOVS)
  {
    guint64 next = MIN (addr + len, (at + page) & ~(page - 1));
    remote[2 * n] = at;
    remote[2 * n + 1] = next - at;
    n++;
    at = next;
  }
  local[0] = (guint64) buf;
  local[1] = at - addr;
  job->exit_reads++;
  got = process_vm_readv ((gint) job->tgid, local, 1, remote, n, 0);
  return got > 0 ? (guint64) got : 0;
}

/* The return address slot of the call to exit whose context is at buf[k] (read from sp + 8 * k),
 * or 0: the context's rsp, or the slot below it. */
static guint64
mt_leak_exit_slot (MtLeakJob * job, const guint64 * buf, guint64 n, guint64 k, guint64 sp)
{
  guint64 rsp = buf[k + MT_LEAK_CONTEXT_RSP], cand[2], c;
  if ((rsp & 7) != 0 || rsp < sp + (k + MT_LEAK_CONTEXT_WORDS) * 8 || rsp - sp >= MT_LEAK_EXIT_SEARCH)
    return 0;
  /* the lower first, as the lowest return address of a call to exit was taken before */
  cand[0] = rsp - 8;
  cand[1] = rsp;
  for (c = 0; c != 2; c++)
  {
    guint64 slot = cand[c], w;
    if (slot < sp + (k + MT_LEAK_CONTEXT_WORDS) * 8)
      continue;
    if ((slot - sp) / 8 < n)
      w = buf[(slot - sp) / 8];
    else if (!mt_leak_exit_read (job, slot, 8, (guint8 *) &w))
      continue;
    if (mt_leak_returns_from_exit (job, w))
      return slot;
  }
  return 0;
}

static void
mt_leak_find_exit_calls (MtLeakJob * job)
{
  MtLeakThread * threads = (MtLeakThread *) job->threads;
  guint64 * buf = (guint64 *) job->scratch;
  guint64 i;
  gint64 t0 = g_get_monotonic_time ();
  for (i = 0; i != job->n_threads; i++)
  {
    MtLeakThread * t = &threads[i];
    guint64 sp = t->sp & ~(guint64) 7, n, k, slot = 0;
    if (sp == 0)
      continue;
    job->exit_threads++;
    n = mt_leak_read_prefix (job, sp, MIN (MT_LEAK_EXIT_WINDOW, job->scratch_size), (guint8 *) buf) / 8;
    job->exit_words += n;
    for (k = 0; k + MT_LEAK_CONTEXT_WORDS <= n; k++)
    {
      if (mt_leak_is_exit (job, buf[k]) && (slot = mt_leak_exit_slot (job, buf, n, k, sp)) != 0)
        break;
    }
    if (slot == 0)
      continue;
    /* the program's registers at the call */
    for (n = 0; n != MT_LEAK_CONTEXT_WORDS; n++)
      mt_leak_mark_word (job, buf[k + n], TRUE);
    job->exit_calls++;
    job->exit_contexts++;
    job->exit_frames += slot - sp;
    /* read from the slot up: mt_leak_stack_start takes the red zone off a thread's sp */
    t->sp = slot + MT_LEAK_RED_ZONE;
  }
  job->exit_us = (guint64) (g_get_monotonic_time () - t0);
}

#endif

/* One slice of the scan: about `budget` bytes read.  Returns 1 when the scan is complete. */
gint
mt_leak_step (MtLeakJob * job, guint64 budget)
{
  const MtLeakBlock * b = (const MtLeakBlock *) job->blocks;
  const MtLeakRange * ranges = (const MtLeakRange *) job->ranges;
  const MtLeakSeg * segs = (const MtLeakSeg *) job->segs;
  const guint8 * marks = (const guint8 *) job->marks;
  guint64 spent = 0;
  guint64 here = (guint64) &spent;

  if (job->phase == 0)
  {
    /* Registers first: a pointer held only in a register is a root. */
    const guint64 * regs = (const guint64 *) job->regs;
    guint64 i;
#if !defined (MT_DARWIN) && !defined (MT_ARM64)
    if (job->exit_fn != 0)
      mt_leak_find_exit_calls (job);
#endif
    for (i = 0; i != job->n_threads * MT_LEAK_REGS; i++)
      mt_leak_mark_word (job, regs[i], TRUE);
    job->phase = 1;
  }

  while (job->phase == 1 && spent < budget)
  {
    const MtLeakRange * r;
    guint64 base, end, addr, k, s;
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
    if ((r->flags & MT_LEAK_RANGE_FRIDA) != 0)
      job->in_frida = 1;           /* listed last: the app's roots (and what they reach) are done */
    if (job->range_offset == 0)
    {
      /* Where this range starts being a root. */
      guint64 start = mt_leak_stack_start (job, base, end);
      if (here >= base && here < end)
      {
        /* our own frames are not the app's; our TLS and thread control block (above them) hold
         * this thread's DTV, which glibc allocated with the app's malloc */
        guint64 from = r->live_from & ~(guint64) 7;
        if ((r->flags & MT_LEAK_RANGE_STACK) != 0 && from > here && from < end)
        {
          job->skip_own += from - base;
          job->range_offset = from - base;
        }
        else
        {
          job->skip_own += r->size;
          job->range_index++;
          continue;
        }
      }
      else if (start != 0)
      {
        job->skip_stack += start - base;       /* below sp: dead frames, not roots */
        job->range_offset = start - base;
      }
      else if (r->flags & MT_LEAK_RANGE_STACK)
      {
        guint64 from = r->live_from & ~(guint64) 7;
        if (from != 0 && from < end)
        {
          /* an exited thread's cached stack: its TLS and thread control block are live */
          if (from > base)
          {
            job->skip_dead_frames += from - base;
            job->range_offset = from - base;
          }
        }
        else
        {
          job->skip_stack += r->size;
          job->range_index++;
          continue;
        }
      }
    }
    addr = base + job->range_offset;
    s = mt_leak_seg_after (job, addr);
    k = mt_leak_first_after (job, addr);
    if (s < job->n_segs && segs[s].base <= addr)
    {
      /* the allocator's own memory (its heaps, its state): never a root */
      job->range_offset = MIN (end, segs[s].base + segs[s].size) - base;
    }
    else if (k < job->n_blocks && b[k].ptr <= addr)
    {
      /* a candidate block: scanned only if reachable */
      guint64 skip_to = MIN (end, (b[k].ptr + b[k].size + 7) & ~(guint64) 7);
      job->range_offset = skip_to - base;
    }
    else
    {
      guint64 stop = MIN (end, addr + MT_LEAK_CHUNK), before = job->skip_unreadable + job->skip_unresident;
      if (k < job->n_blocks && b[k].ptr < stop)
        stop = b[k].ptr & ~(guint64) 7;
      if (s < job->n_segs && segs[s].base < stop)
        stop = segs[s].base & ~(guint64) 7;
      if (stop <= addr)
        stop = MIN (end, addr + 8);
      mt_leak_scan_words (job, addr, stop - addr, TRUE);
      job->root_bytes += (stop - addr) - MIN (stop - addr, job->skip_unreadable + job->skip_unresident - before);
      spent += stop - addr;
      job->range_offset = stop - base;
    }
    if (base + job->range_offset >= end)
    {
      job->range_index++;
      job->range_offset = 0;
    }
  }

  /* Phase 2, as valgrind: each still definitely lost block in address order leads a clique; what
   * it reaches that is definitely lost too becomes indirectly lost. */
  while (job->phase == 2 && spent < budget)
  {
    if (job->n_work > 0)
    {
      spent += mt_leak_drain (job, budget - spent);
      continue;
    }
    while (job->clique_index < job->n_blocks && marks[job->clique_index] != MT_LEAK_DEFINITELY_LOST)
      job->clique_index++;
    if (job->clique_index >= job->n_blocks)
    {
      job->phase = 3;
      break;
    }
    job->leader = job->clique_index++;
    mt_leak_push (job, job->leader);
    spent += 64;
  }
  return job->phase == 3;
}

/* ---- the whole scan in one call ---------------------------------------------------------------
 *
 * Stop, collect, scan within job->budget_us, resume: no JavaScript runs while the world is stopped.
 * Darwin needs it: Frida's JavaScript and send() allocate and take locks an app thread suspended
 * inside malloc or the message loop may hold (a deadlock that freezes the app for good).  Returns
 * 1 when the scan completed; job->stop_us, collect_us, scan_us say how long each part took. */

gint
mt_leak_scan_all (MtLeakJob * job)
{
  gint64 t0 = g_get_monotonic_time (), t1, t2, deadline;
  gint done = 0;
  gint stopped = mt_leak_stop (job);
#ifdef MT_DARWIN
  if (!stopped)
  {
    job->stop_us = (guint64) (g_get_monotonic_time () - t0);
    return 0;
  }
#else
  (void) stopped;      /* Linux scans with the world moving and says so (n_failed) */
#endif
  t1 = g_get_monotonic_time ();
  mt_leak_collect (job);
  t2 = g_get_monotonic_time ();
  deadline = t0 + (gint64) job->budget_us;
  while (!(done = mt_leak_step (job, 16ULL << 20)) && g_get_monotonic_time () < deadline)
    ;
  job->stop_us = (guint64) (t1 - t0);
  job->collect_us = (guint64) (t2 - t1);
  job->scan_us = (guint64) (g_get_monotonic_time () - t2);
  mt_leak_resume (job);
  return done;
}

