/*
 * memtrace agent core: stacks through code built without frame pointers.  Compiled before
 * core.c in the malloc tracer's CModule; core.c's mt_walk hands its walk to mt_unwind_walk
 * once the host has given the agent a table.
 *
 * glibc, libstdc++ (and programs built with -fomit-frame-pointer) keep no frame-pointer chain:
 * a walk that only follows it loses the caller of strdup, operator new or a qsort callback.
 * The host reads each such module's call frame information (.eh_frame) and folds it into
 * MtUnwindRow rows and an index over them (memtrace/symbols/cfi.py): per code range, CFA =
 * SP or FP + offset, the return address at CFA - 8, the caller's frame pointer unchanged or
 * saved at CFA - 8k.  The
 * agent (agents/runtime/unwind.js) copies the rows into the target and lists each module in
 * mt_unwind_modules (those that keep frame pointers too, without rows), publishing an entry by
 * raising mt_unwind_count last.
 *
 * The walk keeps (pc, sp, fp) for the frame being left: in a module with a table it applies
 * the row for pc - 1 (the call instruction); anywhere else the frame-pointer chain, exactly as
 * before.  Every read lies between the walk's own frame and the top of the thread's stack,
 * and the CFA must grow at every step, so a wrong rule ends the stack instead of the process.
 *
 * x86-64 Linux only: arm64 frame records are mandatory on Apple platforms (and their CFA is not
 * derivable from the frame pointer), so Darwin keeps the frame-pointer walk and its cost.
 */

#if defined(MT_LINUX) && defined(__x86_64__)
#define MT_UNWIND 1

extern volatile guint64 mt_unwind_count;
extern MtUnwindModule mt_unwind_modules[];

static const MtUnwindModule *
mt_unwind_module (guint64 pc)
{
  guint64 i, n = mt_unwind_count;
  if (n > MT_MAX_UNWIND_MODULES)
    n = MT_MAX_UNWIND_MODULES;
  for (i = 0; i != n; i++)
  {
    const MtUnwindModule * m = &mt_unwind_modules[i];
    if (pc - m->start < m->end - m->start)
      return m;
  }
  return NULL;
}

/* The row in force at code offset off, or NULL where the table has no rule: the index names
 * the row in force at the start of off's 256-byte block, the rows after it that start inside
 * the block are few. */
static inline const MtUnwindRow *
mt_unwind_row (const MtUnwindModule * m, guint64 off)
{
  const MtUnwindRow * rows = (const MtUnwindRow *) (gsize) m->rows;
  const guint32 * index = (const guint32 *) (gsize) m->index;
  guint64 b = off >> MT_UNWIND_INDEX_SHIFT;
  guint64 i, last;
  if (m->n_rows == 0 || m->n_index == 0)
    return NULL;
  if (b >= m->n_index)
    b = m->n_index - 1;
  i = index[b];
  last = m->n_rows - 1;
  if (i > last || rows[i].start > off)
    return NULL;
  while (i != last && rows[i + 1].start <= off)
    i++;
  return rows[i].cfa_reg == MT_UNWIND_NONE ? NULL : &rows[i];
}

/* The rule for a return address, cached per thread (MtSlot.ucache, core.c): the module search, the
 * index and the rows behind it cost ~5 ns a frame, and a program's allocations come from a few
 * thousand call sites.  An entry is (pc - 1, the MtUnwindRow in force there as its 8 bytes); a pc
 * with no row (a frame-pointer frame, or no table) caches cfa_reg MT_UNWIND_NONE.  Direct-mapped,
 * per thread (a signal handler's nested call never walks, so no entry is ever torn), and emptied
 * when the registry changes (mt_unwind_count is its generation). */
#define MT_UCACHE_ENTRIES 128
#define MT_UCACHE_NONE ((guint64) MT_UNWIND_NONE << 48)

typedef struct
{
  guint64 gen;                       /* mt_unwind_count the entries were made under */
  guint64 e[2 * MT_UCACHE_ENTRIES];  /* (key, row bits) pairs; key 0: empty */
} MtUnwindCache;

static inline guint64
mt_ucache_slot (guint64 key)
{
  return (key ^ (key >> 7) ^ (key >> 17)) & (MT_UCACHE_ENTRIES - 1);
}

/* Return addresses from the frame whose frame pointer is fp0 (the hook's own frame) outwards.
 * lo: the walk's own stack (nothing below it is read); hi: the top of the thread's stack;
 * cache: the thread's rule cache (or NULL). */
/* Swift sets bit 60 of the frame pointer an async frame saves: cleared before it is followed
 * (as core.c's frame-pointer walk does). */
#define MT_SWIFT_ASYNC_MASK (~(1ULL << 60))

/* The walk from a frame being left: pc its return address, sp the caller's stack pointer after
 * the return, fp the frame pointer register then. */
static guint
mt_unwind_walk_regs (guint64 pc, guint64 sp, guint64 fp, guint64 hi, guint64 * out, guint max,
    gboolean * truncated, MtUnwindCache * cache)
{
  guint n = 0;
  guint64 gen = mt_unwind_count;
  /* The last frame's module, kept in registers: consecutive frames mostly share one, and a
   * frame of a module that keeps frame pointers then costs one compare more than core.c's loop. */
  const MtUnwindModule * m = NULL;
  guint64 m_start = 0, m_size = 0, m_rows = 0;
  fp &= MT_SWIFT_ASYNC_MASK;
  if (cache != NULL && cache->gen != gen)
  {
    guint i;
    for (i = 0; i != 2 * MT_UCACHE_ENTRIES; i++)
      cache->e[i] = 0;
    cache->gen = gen;
  }
  while (pc >= 4096)
  {
    guint64 bits, key = pc - 1, at = 0;
    guint cfa_reg;
    if (n == max)
    {
      *truncated = TRUE;
      break;
    }
    out[n++] = pc;
    if (cache != NULL && cache->e[2 * (at = mt_ucache_slot (key))] == key)
    {
      bits = cache->e[2 * at + 1];
    }
    else
    {
      const MtUnwindRow * row = NULL;
      if (key - m_start >= m_size)
      {
        m = mt_unwind_module (key);
        m_start = m != NULL ? m->start : 0;
        m_size = m != NULL ? m->end - m->start : 0;
        m_rows = m != NULL ? m->n_rows : 0;
      }
      if (m_rows != 0)
        row = mt_unwind_row (m, key - m_start);
      bits = row != NULL ? *(const guint64 *) row : MT_UCACHE_NONE;
      if (cache != NULL)
      {
        cache->e[2 * at] = key;
        cache->e[2 * at + 1] = bits;
      }
    }
    /* The row's bytes: start u32, cfa_offset u16, cfa_reg u8, fp_slot u8 (layout.UNWIND_ROW). */
    cfa_reg = (guint) ((bits >> 48) & 0xff);
    if (cfa_reg != MT_UNWIND_NONE)
    {
      guint fp_slot = (guint) (bits >> 56);
      guint64 cfa = (cfa_reg == MT_UNWIND_CFA_SP ? sp : fp) + ((bits >> 32) & 0xffff);
      if (cfa <= sp || cfa > hi || (cfa & 7) != 0)
        break;
      pc = ((guint64 *) cfa)[-1];
      if (fp_slot != 0)
      {
        guint64 slot = cfa - 8 * (guint64) fp_slot;
        if (slot < sp)
          break;
        fp = *(guint64 *) slot & MT_SWIFT_ASYNC_MASK;
      }
      sp = cfa;
    }
    else
    {
      /* A frame built on the frame pointer: the saved pair sits at fp, above sp. */
      if (fp < sp || fp + 16 > hi || (fp & 7) != 0)
        break;
      pc = ((guint64 *) fp)[1];
      sp = fp + 16;
      fp = ((guint64 *) fp)[0] & MT_SWIFT_ASYNC_MASK;
    }
  }
  return n;
}

static guint
mt_unwind_walk (guint64 fp0, guint64 lo, guint64 hi, guint64 * out, guint max, gboolean * truncated,
    MtUnwindCache * cache)
{
  if (fp0 < lo || fp0 + 16 > hi || (fp0 & 7) != 0)
    return 0;
  return mt_unwind_walk_regs (((guint64 *) fp0)[1], fp0 + 16, ((guint64 *) fp0)[0], hi, out, max, truncated,
      cache);
}
#endif
