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

/* Swift sets bit 60 of the frame pointer an async frame saves: cleared before it is followed
 * (as core.c's frame-pointer walk does). */
#define MT_SWIFT_ASYNC_MASK (~(1ULL << 60))

/* ---- the frame cache: incremental walks ---------------------------------------------------
 *
 * A thread's allocations mostly come from the same outer frames (main, the interpreter's loop, a
 * compiler pass): a walk through tables pays a chain of dependent loads and rule lookups for each
 * of them, every time.  Each thread keeps its last walk, level by level: the state entering the level
 * (pc, the stack pointer, the frame pointer) and where the step out of it read the caller's frame
 * pointer.  A walk that reaches a state the cache holds checks the rest instead of walking it.
 *
 * Why that is exact.  A step is a function of the state and of the words it reads: the caller's
 * return address, always at (next sp - 8), and, where the rule restores it, the caller's frame
 * pointer.  The cache stores those words (they are the next level's pc and fp), so if every word
 * the cached walk read still holds the value it read -- a restored frame pointer only where the walk
 * on uses it -- the walk from the matched state is the cached walk, frame for frame and to the same
 * end.  The checks' addresses come from the cache, not from
 * the previous load, so they run side by side in the CPU where the walk was one load after another.
 * A level's frame pointer only has to match where the walk from there uses it before reloading it
 * from the stack (MT_FC_NEED_FP; a frame pointer register that merely passes through frames built
 * without one holds whatever the code left in it); from the match on the true frame pointer is
 * followed beside the cached one.  Any word changed: the walk starts again from the beginning,
 * without the cache.  The cache is emptied with the unwind registry's generation (a pc's rule
 * may change) and is only used with the same stack top and frame limit. */
#define MT_FC_NEED_FP 1ULL        /* (level fpaddr bit) the walk from this level uses its fp */
#define MT_FC_USES_FP 2ULL        /* (level fpaddr bit, while walking) this level's step reads fp */
#define MT_FC_END 0               /* the last level's step stopped at a check of its state */
#define MT_FC_END_PC 1            /* ... read a return address below 4096 (term_addr, term_val) */
#define MT_FC_TRUNC 2             /* e[0] is the state at the frame limit, not a frame */

typedef struct
{
  guint64 pc;
  guint64 sp;
  guint64 fp;
  guint64 fpaddr;     /* where the step out of this level read the caller's fp (0: kept), | flags */
} MtUnwindLevel;

typedef struct
{
  guint64 gen;        /* mt_unwind_count + 1 when the levels were cached; 0: empty */
  guint64 hi;
  guint64 max;
  guint64 m;          /* cached levels: e[0] the outermost .. e[m - 1] the innermost */
  guint64 term;       /* how the walk ended after e[0] (MT_FC_*) */
  guint64 term_addr;
  guint64 term_val;
  guint64 reused;     /* the last walk reused cached levels (the caller counts frame_cache_walks) */
  MtUnwindLevel e[MT_FRAME_CACHE_LEVELS];
  MtUnwindLevel w[MT_FRAME_CACHE_LEVELS];   /* this walk's levels, innermost first */
} MtFrameCache;

/* The agent sizes the caches from the layout (FRAME_CACHE_BYTES per slot): a mismatch fails to compile. */
typedef char mt_frame_cache_size_check[(sizeof (MtFrameCache) == MT_FRAME_CACHE_BYTES) ? 1 : -1];

/* One MtFrameCache per slot (mt_slots' indices); mt_frame_cache_on: 0 off, else on. */
extern guint8 mt_frame_caches[];
extern volatile guint64 mt_frame_cache_on;

/* Levels w[0, nw) of this walk (innermost first, the outermost one's need for fp given) get their
 * MT_FC_NEED_FP, outermost first, and go into e[at ...] the other way round. */
static void
mt_fc_store (MtFrameCache * fc, guint nw, guint64 at, gboolean outer_needs_fp)
{
  gboolean need = outer_needs_fp;
  gint i;
  for (i = (gint) nw - 1; i >= 0; i--)
  {
    MtUnwindLevel * l = &fc->w[i];
    guint64 addr = l->fpaddr & ~(guint64) 7;
    need = (l->fpaddr & MT_FC_USES_FP) != 0 || (addr == 0 && need);
    fc->e[at + (guint64) (nw - 1 - (guint) i)].pc = l->pc;
    fc->e[at + (guint64) (nw - 1 - (guint) i)].sp = l->sp;
    fc->e[at + (guint64) (nw - 1 - (guint) i)].fp = l->fp;
    fc->e[at + (guint64) (nw - 1 - (guint) i)].fpaddr = addr | (need ? MT_FC_NEED_FP : 0);
  }
  fc->m = at + nw;
}

#define MT_FC_REUSED 0
#define MT_FC_CONTINUE 1
#define MT_FC_CHANGED 2

/* The walk reached cached level t: the rest from the cache, each word it read checked.  REUSED: out
 * and n hold the whole walk; CONTINUE: the cache ends at the frame limit before this walk's, and
 * *pc, *sp, *fp are the state to walk on from; CHANGED: a word differs (out is to be walked again). */
static gint
mt_fc_reuse (const MtFrameCache * fc, gint64 t, guint64 * fp, guint64 * out, guint * np, guint max,
    gboolean * truncated, guint64 * pc, guint64 * sp)
{
  guint n = *np;
  guint64 fp_true = *fp;
  gint64 u;
  for (u = t; ; u--)
  {
    const MtUnwindLevel * l = &fc->e[u];
    const MtUnwindLevel * next;
    guint64 addr;
    if (n == max)
    {
      *truncated = TRUE;
      *np = n;
      return MT_FC_REUSED;
    }
    if (u == 0 && fc->term == MT_FC_TRUNC)
    {
      *pc = l->pc;
      *sp = l->sp;
      *fp = fp_true;
      *np = n;
      return MT_FC_CONTINUE;
    }
    out[n++] = l->pc;
    if (u == 0)
    {
      if (fc->term == MT_FC_END_PC && *(const volatile guint64 *) (gsize) fc->term_addr != fc->term_val)
        return MT_FC_CHANGED;
      *np = n;
      return MT_FC_REUSED;
    }
    next = &fc->e[u - 1];
    if (*(const volatile guint64 *) (gsize) (next->sp - 8) != next->pc)
      return MT_FC_CHANGED;
    addr = l->fpaddr & ~(guint64) 7;
    if (addr != 0)
    {
      /* The frame pointer this step restores: checked only where the walk on uses it (a register
       * that merely passes through, saved and restored, holds the program's data). */
      fp_true = *(const volatile guint64 *) (gsize) addr & MT_SWIFT_ASYNC_MASK;
      if ((next->fpaddr & MT_FC_NEED_FP) != 0 && fp_true != next->fp)
        return MT_FC_CHANGED;
    }
  }
}

/* The walk from a frame being left: pc its return address, sp the caller's stack pointer after
 * the return, fp the frame pointer register then.  hi: the top of the thread's stack; cache: the
 * thread's rule cache (or NULL); fc: its frame cache (or NULL). */
static guint
mt_unwind_walk_regs (guint64 pc0, guint64 sp0, guint64 fp0, guint64 hi, guint64 * out, guint max,
    gboolean * truncated, MtUnwindCache * cache, MtFrameCache * fc)
{
  guint n = 0, nw = 0;
  guint64 gen = mt_unwind_count;
  guint64 pc = pc0, sp = sp0, fp = fp0 & MT_SWIFT_ASYNC_MASK;
  guint term = MT_FC_END;
  gboolean record = fc != NULL;
  gint64 t = -1;
  /* The last frame's module, kept in registers: consecutive frames mostly share one, and a
   * frame of a module that keeps frame pointers then costs one compare more than core.c's loop. */
  const MtUnwindModule * m = NULL;
  guint64 m_start = 0, m_size = 0, m_rows = 0;
  *truncated = FALSE;
  if (cache != NULL && cache->gen != gen)
  {
    guint i;
    for (i = 0; i != 2 * MT_UCACHE_ENTRIES; i++)
      cache->e[i] = 0;
    cache->gen = gen;
  }
  if (fc != NULL)
  {
    fc->reused = 0;
    if (fc->gen == gen + 1 && fc->hi == hi && fc->max == max)
      t = (gint64) fc->m - 1;
  }
  while (pc >= 4096)
  {
    guint64 bits, key = pc - 1, at = 0, fpaddr = 0;
    guint cfa_reg;
    if (n == max)
    {
      *truncated = TRUE;
      term = MT_FC_TRUNC;
      break;
    }
    if (t >= 0)
    {
      const MtUnwindLevel * c;
      while (t >= 0 && fc->e[t].sp < sp)
        t--;
      if (t >= 0 && (c = &fc->e[t])->sp == sp && c->pc == pc && ((c->fpaddr & MT_FC_NEED_FP) == 0 || c->fp == fp))
      {
        gint r = mt_fc_reuse (fc, t, &fp, out, &n, max, truncated, &pc, &sp);
        fc->reused = r != MT_FC_CHANGED;
        if (r == MT_FC_REUSED)
        {
          /* This walk's own levels go in front of the cached ones it reused. */
          if (record && (guint64) t + 1 + nw <= MT_FRAME_CACHE_LEVELS)
          {
            /* (Its fp, where it need not have matched, is this walk's: what the levels stored in
             * front of it restore it to.) */
            fc->e[t].fp = fp;
            mt_fc_store (fc, nw, (guint64) t + 1, (fc->e[t].fpaddr & MT_FC_NEED_FP) != 0);
          }
          return n;
        }
        /* Past the cache's end the walk goes on by itself (the cache is left as it was); where a word
         * changed it starts again from the beginning, without the cache. */
        record = r == MT_FC_CHANGED && fc != NULL;
        t = -1;
        if (r == MT_FC_CHANGED)
        {
          n = 0;
          nw = 0;
          pc = pc0;
          sp = sp0;
          fp = fp0 & MT_SWIFT_ASYNC_MASK;
          *truncated = FALSE;
        }
        continue;
      }
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
    if (record)
    {
      if (nw == MT_FRAME_CACHE_LEVELS)
        record = FALSE;   /* deeper than the cache: walked in full every time */
      else
      {
        fc->w[nw].pc = pc;
        fc->w[nw].sp = sp;
        fc->w[nw].fp = fp;
        fc->w[nw].fpaddr = cfa_reg == MT_UNWIND_CFA_SP ? 0 : MT_FC_USES_FP;
        nw++;
      }
    }
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
        fpaddr = slot;
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
      fpaddr = fp;
      fp = ((guint64 *) fp)[0] & MT_SWIFT_ASYNC_MASK;
    }
    if (record)
      fc->w[nw - 1].fpaddr |= fpaddr;
    if (pc < 4096)
      term = MT_FC_END_PC;
  }
  if (record && nw != 0)
  {
    if (term == MT_FC_TRUNC)
    {
      /* The state at the limit, as the outermost level: the walk from it is unknown, so it needs fp. */
      if (nw == MT_FRAME_CACHE_LEVELS)
        return n;
      fc->w[nw].pc = pc;
      fc->w[nw].sp = sp;
      fc->w[nw].fp = fp;
      fc->w[nw].fpaddr = MT_FC_USES_FP;
      nw++;
    }
    fc->term = term;
    fc->term_addr = sp - 8;
    fc->term_val = pc;
    fc->gen = gen + 1;
    fc->hi = hi;
    fc->max = max;
    mt_fc_store (fc, nw, 0, FALSE);
  }
  return n;
}

static guint
mt_unwind_walk (guint64 fp0, guint64 lo, guint64 hi, guint64 * out, guint max, gboolean * truncated,
    MtUnwindCache * cache, MtFrameCache * fc)
{
  if (fp0 < lo || fp0 + 16 > hi || (fp0 & 7) != 0)
  {
    if (fc != NULL)
      fc->reused = 0;
    return 0;
  }
  return mt_unwind_walk_regs (((guint64 *) fp0)[1], fp0 + 16, ((guint64 *) fp0)[0], hi, out, max, truncated,
      cache, fc);
}
#endif
