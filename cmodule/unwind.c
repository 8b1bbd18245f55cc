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

/* ---- the stack hash ------------------------------------------------------------------------
 *
 * A stack's 64-bit hash is taken as its identity (core.c's index keeps no frames: two stacks that
 * collide share an id).  It is a polynomial over the frames, innermost first: H = sum of g (f_i) P^i
 * (mod 2^64), g a multiply-xorshift of the frame, then mixed with the frame count.  Being a
 * polynomial, the hash of a run of frames is a difference of two running sums: the frame cache below
 * keeps each cached level's running sum, so a walk that reuses cached levels hashes only the frames
 * it walked itself (CPython's and cc1plus's stacks are 64 frames deep; the whole hash was ~35 ns of
 * each allocation).  Computed in full, it runs four Horner chains side by side. */
#define MT_HASH_P 0x9e3779b97f4a7c15ULL
#define MT_HASH_P2 (MT_HASH_P * MT_HASH_P)
#define MT_HASH_P3 (MT_HASH_P2 * MT_HASH_P)
#define MT_HASH_P4 (MT_HASH_P2 * MT_HASH_P2)

static inline guint64
mt_hash_g (guint64 f)
{
  f ^= f >> 29;
  f *= 0xbf58476d1ce4e5b9ULL;
  return f ^ (f >> 32);
}

/* The identity of a stack of n frames whose polynomial is h. */
static inline guint64
mt_hash_final (guint64 h, guint n)
{
  h ^= (guint64) n * 0xc2b2ae3d27d4eb4fULL;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h | 1;
}

/* sum of g (frames[i]) P^i over i < n */
static inline guint64
mt_hash_sum (const guint64 * frames, guint n)
{
  guint64 a = 0, b = 0, c = 0, d = 0;
  guint q = n / 4, r = n % 4;
  if (r > 0)
    a = mt_hash_g (frames[4 * q]);
  if (r > 1)
    b = mt_hash_g (frames[4 * q + 1]);
  if (r > 2)
    c = mt_hash_g (frames[4 * q + 2]);
  while (q != 0)
  {
    q--;
    a = a * MT_HASH_P4 + mt_hash_g (frames[4 * q]);
    b = b * MT_HASH_P4 + mt_hash_g (frames[4 * q + 1]);
    c = c * MT_HASH_P4 + mt_hash_g (frames[4 * q + 2]);
    d = d * MT_HASH_P4 + mt_hash_g (frames[4 * q + 3]);
  }
  return a + b * MT_HASH_P + c * MT_HASH_P2 + d * MT_HASH_P3;
}

static inline guint64
mt_hash_frames (const guint64 * frames, guint n)
{
  return mt_hash_final (mt_hash_sum (frames, n), n);
}

/* A walk's hash handed on to interning: valid only when `ok` (the walk's frames exactly, sum only). */
typedef struct
{
  gboolean ok;
  guint64 sum;
  guint64 pw_n;       /* P^n (for a frame appended after the walk's n) */
} MtHashed;

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

/* A key's entry in a rule cache of 2^(64 - shift) entries: the top bits of a multiply, so that return
 * addresses close together (one function's calls) spread over the whole cache. */
static inline guint64
mt_ucache_slot (guint64 key, guint shift)
{
  return (key * 0x9e3779b97f4a7c15ULL) >> shift;
}

static inline guint
mt_log2 (guint64 n)
{
  guint k = 0;
  while ((1ULL << k) < n)
    k++;
  return k;
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
 * followed beside the cached one.  Where a word changed (or the cache ends at its walk's frame limit)
 * the walk goes on by itself from the last level it checked, and the cache is rebuilt from the levels
 * it walked and those it checked.  The cache is emptied with the unwind registry's generation (a pc's
 * rule may change) and is only used with the same stack top and frame limit. */
#define MT_FC_NEED_FP 1ULL        /* (level fpaddr bit) the walk from this level uses its fp */
#define MT_FC_USES_FP 2ULL        /* (level fpaddr bit) this level's step reads fp */
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

/* ---- the stack memo: whole walks by their first state ---------------------------------------
 *
 * The frame cache holds one walk, the thread's last: a program whose allocations come by turns from a
 * handful of call paths (sqlite3's row loop: the record, the cell, the page, the string) matches it
 * only where the paths meet, and walks, hashes and stores the inner levels every time.  The memo keeps
 * whole walks, by their first state (the return address into the allocator's caller and the stack
 * pointer after it): each with the (address, value) of every word the walk read that its result
 * depends on -- the same words the frame cache checks, the return addresses, the frame pointers the
 * walk on uses, the word a walk ending on a low return address read -- and its frames, its hash and, once interned, its stack id.  A walk from a state the
 * memo holds, under the same registry generation, stack top and frame limit, whose words all still
 * hold their values, is that walk, frame for frame (the argument of the frame cache's, from the first
 * level); its stack is then copied, not walked, hashed or looked up.  Walks are memoized only when the
 * frame cache holds them whole (fc->hashed: its levels are the walk's).
 *
 * A hit reads every word (CPython's and sqlite3's walks are 64 levels, up to two words each), so the
 * words are kept compact: each one's value as it was when the walk was memoized -- the raw word, so
 * a hit is plain equality -- and its address as a 16-bit count of words above the first state's frame
 * (sp - 16), values and addresses in arrays of their own.  Checking a word is then two loads of the
 * entry and one of the stack where an (address, value) pair of u64 was three, and an entry's checks
 * are 1,320 bytes where they were 2,112: a memo of 32 walks (61 KiB) no longer streams from L2 at
 * every hit.  A walk with a word farther than 512 KiB above its first frame is not memoized. */
#define MT_MEMO_WINDOW 4096   /* lookups between two looks at the memo's hit rate */
#define MT_MEMO_NEED_FP 1     /* (flags) the walk uses its first frame pointer: the key's fp must match */
#define MT_MEMO_TRUNCATED 2   /* (flags) the stack was cut at the frame limit */

typedef struct
{
  guint64 pc;             /* the first state: its return address, */
  guint64 sp;             /* its stack pointer */
  guint64 fp;             /* and its frame pointer (checked only with MT_MEMO_NEED_FP) */
  guint64 gen;            /* mt_unwind_count + 1 when made; 0: empty */
  guint64 hi;             /* the stack top and the frame limit the walk had */
  guint32 max;
  guint16 n;              /* frames (a truncated stack's pseudo frame included) */
  guint8 flags;
  guint8 pad;
  guint32 n_checks;
  guint32 stack_id;       /* MT_NO_STACK until the stack is interned */
  guint64 hash;           /* the stack's identity (mt_call_stack_hashed) */
  guint64 check_val[2 * MT_STACK_MEMO_LEVELS];   /* each checked word's value */
  guint16 check_off[2 * MT_STACK_MEMO_LEVELS];   /* and its address: sp - 16 + 8 * check_off */
  guint64 frames[MT_STACK_MEMO_LEVELS];
} MtStackMemo;

typedef char mt_stack_memo_size_check[(sizeof (MtStackMemo) == MT_STACK_MEMO_BYTES) ? 1 : -1];

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
  guint64 hashed;     /* the last walk's frames are e[m - 1] .. e[m - n]: their hash is in c (mt_fc_hashed) */
  guint64 pad;
  MtUnwindLevel e[MT_FRAME_CACHE_LEVELS];
  MtUnwindLevel w[MT_FRAME_CACHE_LEVELS];   /* this walk's levels, innermost first */
  guint64 c[MT_FRAME_CACHE_LEVELS];         /* c[u]: sum of g (e[v].pc) P^(u - v) over v <= u */
  guint64 pw[MT_FRAME_CACHE_LEVELS + 2];    /* P^k (pw[1] != P: not yet filled) */
  /* The thread's rules by return address, as MtUnwindCache but MT_RULE_CACHE_ENTRIES of them (the
   * slot's 128 missed on most of cc1plus's frames, each miss two loads from the tables): used
   * instead of the slot's whenever the thread has a frame cache. */
  guint64 rgen;
  guint64 r[2 * MT_RULE_CACHE_ENTRIES];
  /* The stack memo.  Its clock and store policy first: they bring memo_tag to a cache line's start
   * (offset 43,136), so that each set's 8 tags are one line. */
  guint64 memo_clock;
  /* The store policy: a memo that keeps missing (a compiler's stacks, seldom the same twice) is
   * stored into on 1 miss in memo_mask + 1, so that its misses do not each pay a whole copy. */
  guint32 memo_lookups;      /* in this window of MT_MEMO_WINDOW lookups */
  guint32 memo_hits;
  guint32 memo_mask;
  guint32 memo_misses;
  /* Sets of MT_STACK_MEMO_WAYS entries, each set's tags in one line. */
  guint64 memo_tag[MT_STACK_MEMO_ENTRIES];   /* the entry's key mixed (mt_memo_tag); 0: empty */
  guint32 memo_used[MT_STACK_MEMO_ENTRIES];  /* memo_clock at the entry's last use */
  MtStackMemo memo[MT_STACK_MEMO_ENTRIES];
} MtFrameCache;

/* The agent sizes the caches from the layout (FRAME_CACHE_BYTES per slot): a mismatch fails to compile. */
typedef char mt_frame_cache_size_check[(sizeof (MtFrameCache) == MT_FRAME_CACHE_BYTES) ? 1 : -1];
#ifndef __TINYC__
typedef char mt_memo_tag_line_check[(__builtin_offsetof (MtFrameCache, memo_tag) % 64 == 0) ? 1 : -1];
#endif

/* One MtFrameCache per slot (mt_slots' indices); mt_frame_cache_on: 0 off, else on. */
extern guint8 mt_frame_caches[];
extern volatile guint64 mt_frame_cache_on;

/* Levels w[from, from + count) of this walk (innermost first; the need for fp of the level outside
 * the outermost of them given) get their MT_FC_NEED_FP and go into e[at, at + count), outermost first. */
static void
mt_fc_store (MtFrameCache * fc, guint from, guint count, guint64 at, gboolean outer_needs_fp)
{
  gboolean need = outer_needs_fp;
  guint i;
  for (i = count; i != 0; i--)
  {
    const MtUnwindLevel * l = &fc->w[from + i - 1];
    MtUnwindLevel * e = &fc->e[at + (guint64) (count - i)];
    guint64 addr = l->fpaddr & ~(guint64) 7;
    need = (l->fpaddr & MT_FC_USES_FP) != 0 || (addr == 0 && need);
    e->pc = l->pc;
    e->sp = l->sp;
    e->fp = l->fp;
    e->fpaddr = addr | (l->fpaddr & MT_FC_USES_FP) | (need ? MT_FC_NEED_FP : 0);
  }
}

/* Cached levels e[at, at + count) (outermost first) below a level whose need for fp changed: theirs again. */
static void
mt_fc_renew_need (MtFrameCache * fc, guint64 at, guint64 count, gboolean outer_needs_fp)
{
  gboolean need = outer_needs_fp;
  guint64 i;
  for (i = at; i != at + count; i++)
  {
    MtUnwindLevel * e = &fc->e[i];
    need = (e->fpaddr & MT_FC_USES_FP) != 0 || ((e->fpaddr & ~(guint64) 7) == 0 && need);
    e->fpaddr = (e->fpaddr & ~MT_FC_NEED_FP) | (need ? MT_FC_NEED_FP : 0);
  }
}

/* After the levels from e[from] on changed (fc->m of them in all): their running hashes again, and the
 * walk's frames marked as the innermost cached levels (every walk that stores the cache walked exactly
 * e[m - 1] down to e[m - n], the state at a frame limit being e[0] and no frame). */
static void
mt_fc_rehash (MtFrameCache * fc, guint64 from)
{
  guint64 u, h = from != 0 ? fc->c[from - 1] : 0;
  if (fc->pw[1] != MT_HASH_P)
  {
    fc->pw[0] = 1;
    for (u = 1; u != MT_FRAME_CACHE_LEVELS + 2; u++)
      fc->pw[u] = fc->pw[u - 1] * MT_HASH_P;
  }
  for (u = from; u < fc->m; u++)
  {
    h = h * MT_HASH_P + mt_hash_g (fc->e[u].pc);
    fc->c[u] = h;
  }
  fc->hashed = 1;
}

/* The hash of the walk's n frames, when it stored the cache (else not ok: hashed in full). */
static inline void
mt_fc_hashed (const MtFrameCache * fc, guint n, MtHashed * out)
{
  guint64 m = fc->m;
  out->ok = fc->hashed != 0 && n != 0 && n <= m;
  if (!out->ok)
    return;
  out->pw_n = fc->pw[n];
  out->sum = fc->c[m - 1] - (m > n ? out->pw_n * fc->c[m - n - 1] : 0);
}

#define MT_FC_REUSED 0
#define MT_FC_CONTINUE 1

/* The walk reached cached level t: the rest from the cache, each word it read checked.  REUSED: out and
 * *np hold the whole walk.  CONTINUE: the walk goes on by itself from cached level *stop, whose state
 * is *pc, *sp, *fp (the frames before it in out, *np of them): the cache ends there at the frame limit
 * of its walk, or the step out of it read a word that changed. */
static gint
mt_fc_reuse (const MtFrameCache * fc, gint64 t, guint64 * fp, guint64 * out, guint * np, guint max,
    gboolean * truncated, guint64 * pc, guint64 * sp, gint64 * stop)
{
  guint n = *np;
  guint64 fp_true = *fp;
  const MtUnwindLevel * l = &fc->e[t];
  gint64 u;
  for (u = t; ; u--)
  {
    const MtUnwindLevel * next;
    guint64 addr, fp_next = fp_true;
    l = &fc->e[u];
    if (n == max)
    {
      *truncated = TRUE;
      *np = n;
      return MT_FC_REUSED;
    }
    if (u == 0)
    {
      if (fc->term == MT_FC_TRUNC
          || (fc->term == MT_FC_END_PC && *(const volatile guint64 *) (gsize) fc->term_addr != fc->term_val))
        break;
      out[n++] = l->pc;
      *np = n;
      return MT_FC_REUSED;
    }
    next = &fc->e[u - 1];
    if (*(const volatile guint64 *) (gsize) (next->sp - 8) != next->pc)
      break;
    addr = l->fpaddr & ~(guint64) 7;
    if (addr != 0)
    {
      /* The frame pointer this step restores: checked only where the walk on uses it (a register
       * that merely passes through, saved and restored, holds the program's data). */
      fp_next = *(const volatile guint64 *) (gsize) addr & MT_SWIFT_ASYNC_MASK;
      if ((next->fpaddr & MT_FC_NEED_FP) != 0 && fp_next != next->fp)
        break;
    }
    out[n++] = l->pc;
    fp_true = fp_next;
  }
  *pc = l->pc;
  *sp = l->sp;
  *fp = fp_true;
  *np = n;
  *stop = u;
  return MT_FC_CONTINUE;
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
  gint64 t = -1, t_match = -1, t_stop = -1;
  guint inner = 0xFFFFFFFFu;          /* after a CONTINUE: w[0, inner) this walk's own inner levels */
  guint64 fp_at_match = 0;
  /* The last frame's module, kept in registers: consecutive frames mostly share one, and a
   * frame of a module that keeps frame pointers then costs one compare more than core.c's loop. */
  const MtUnwindModule * m = NULL;
  guint64 m_start = 0, m_size = 0, m_rows = 0;
  /* The rule cache: the frame cache's large one, else the slot's (e, its pairs; shift: 64 - log2 of
   * its entries, the slot of a key being its top bits after a multiply). */
  guint64 * ce = NULL;
  guint ce_shift = 0;
  *truncated = FALSE;
  if (fc != NULL)
  {
    if (fc->rgen != gen)
    {
      guint i;
      for (i = 0; i != 2 * MT_RULE_CACHE_ENTRIES; i++)
        fc->r[i] = 0;
      fc->rgen = gen;
    }
    ce = fc->r;
    ce_shift = 64 - mt_log2 (MT_RULE_CACHE_ENTRIES);
  }
  else if (cache != NULL)
  {
    if (cache->gen != gen)
    {
      guint i;
      for (i = 0; i != 2 * MT_UCACHE_ENTRIES; i++)
        cache->e[i] = 0;
      cache->gen = gen;
    }
    ce = cache->e;
    ce_shift = 64 - mt_log2 (MT_UCACHE_ENTRIES);
  }
  if (fc != NULL)
  {
    fc->reused = 0;
    fc->hashed = 0;
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
        guint64 fp_match = fp;
        gint64 stop = t;
        gint r = mt_fc_reuse (fc, t, &fp, out, &n, max, truncated, &pc, &sp, &stop);
        fc->reused = r == MT_FC_REUSED || stop != t;
        if (r == MT_FC_REUSED)
        {
          /* This walk's own levels go in front of the cached ones it reused.  (The matched level's
           * fp, where it need not have matched, becomes this walk's: the one they restore it to.) */
          if (record && (guint64) t + 1 + nw <= MT_FRAME_CACHE_LEVELS)
          {
            /* The running hashes change only from the first level whose pc is new (most walks repeat
             * the last one's inner frames: nothing to hash again). */
            guint64 first = (guint64) t + 1, old_m = fc->m;
            while (first < old_m && first < (guint64) t + 1 + nw
                && fc->e[first].pc == fc->w[(guint64) t + nw - first].pc)
              first++;
            fc->e[t].fp = fp_match;
            mt_fc_store (fc, 0, nw, (guint64) t + 1, (fc->e[t].fpaddr & MT_FC_NEED_FP) != 0);
            fc->m = (guint64) t + 1 + nw;
            mt_fc_rehash (fc, first);
          }
          return n;
        }
        /* From cached level `stop` on the walk goes by itself, recording the levels it walks after
         * its own inner ones (the cache is rebuilt at the end). */
        t_match = t;
        t_stop = stop;
        inner = nw;
        fp_at_match = fp_match;
        t = -1;
        continue;
      }
    }
    out[n++] = pc;
    if (ce != NULL && ce[2 * (at = mt_ucache_slot (key, ce_shift))] == key)
    {
      bits = ce[2 * at + 1];
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
      if (ce != NULL)
      {
        ce[2 * at] = key;
        ce[2 * at + 1] = bits;
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
    if (inner != 0xFFFFFFFFu)
    {
      /* Went on from cached level t_stop (the first level walked since): the levels walked from there
       * go below the cached e[t_stop + 1, t_match] it checked, their need for fp made again, and this
       * walk's inner levels above them. */
      guint nout = nw - inner;
      guint64 i, tm = (guint64) t_match, ts = (guint64) t_stop, keep = tm - ts;
      if (nout == 0 || (guint64) nout + keep + inner > MT_FRAME_CACHE_LEVELS)
        return n;
      if (nout > ts + 1)
        for (i = tm; i != ts; i--)
          fc->e[i - ts - 1 + nout] = fc->e[i];
      else if (nout < ts + 1)
        for (i = ts + 1; i <= tm; i++)
          fc->e[i - ts - 1 + nout] = fc->e[i];
      mt_fc_store (fc, inner, nout, 0, FALSE);
      mt_fc_renew_need (fc, nout, keep, (fc->e[nout - 1].fpaddr & MT_FC_NEED_FP) != 0);
      fc->e[nout - 1 + keep].fp = fp_at_match;
      mt_fc_store (fc, 0, inner, nout + keep, (fc->e[nout - 1 + keep].fpaddr & MT_FC_NEED_FP) != 0);
      fc->m = nout + keep + inner;
    }
    else
    {
      mt_fc_store (fc, 0, nw, 0, FALSE);
      fc->m = nw;
    }
    mt_fc_rehash (fc, 0);
    fc->term = term;
    fc->term_addr = sp - 8;
    fc->term_val = pc;
    fc->gen = gen + 1;
    fc->hi = hi;
    fc->max = max;
  }
  return n;
}

/* A first state's tag (never 0), whose top bits pick its set. */
static inline guint64
mt_memo_tag (guint64 pc, guint64 sp)
{
  return ((pc ^ (sp << 17) ^ (sp >> 7)) * 0x9e3779b97f4a7c15ULL) | 1;
}

static inline guint
mt_memo_set (guint64 tag)
{
  return (guint) (tag >> (64 - mt_log2 (MT_STACK_MEMO_ENTRIES / MT_STACK_MEMO_WAYS))) * MT_STACK_MEMO_WAYS;
}

/* Whether memo entry e holds for the walk from fp0 (pc, sp its first state): its key and every word. */
static inline gboolean
mt_memo_holds (const MtStackMemo * e, guint64 fp0, guint64 pc, guint64 sp, guint64 gen, guint64 hi, guint max)
{
  const volatile guint64 * base = (const volatile guint64 *) (gsize) fp0;
  const guint64 * val = e->check_val;
  const guint16 * off = e->check_off;
  guint64 diff = 0;
  guint i, nc;
  if (e->pc != pc || e->sp != sp || e->gen != gen || e->hi != hi || e->max != max)
    return FALSE;
  if ((e->flags & MT_MEMO_NEED_FP) != 0 && (((guint64 *) fp0)[0] & MT_SWIFT_ASYNC_MASK) != e->fp)
    return FALSE;
  /* Four words a branch: the loads are independent, and a hit reads them all. */
  nc = e->n_checks;
  for (i = 0; i + 4 <= nc; i += 4)
  {
    diff |= (base[off[i]] ^ val[i]) | (base[off[i + 1]] ^ val[i + 1])
        | (base[off[i + 2]] ^ val[i + 2]) | (base[off[i + 3]] ^ val[i + 3]);
    if (diff != 0)
      return FALSE;
  }
  for (; i != nc; i++)
    diff |= base[off[i]] ^ val[i];
  return diff == 0;
}

/* The memoized walk from the hooked call's frame fp0 (as mt_unwind_walk takes it), or NULL.  A first
 * state may have several entries (an interpreter's one C path under many outer ones): each is tried. */
static inline const MtStackMemo *
mt_memo_find (MtFrameCache * fc, guint64 fp0, guint64 lo, guint64 hi, guint max)
{
  guint64 pc, sp, tag, gen = mt_unwind_count + 1;
  guint set, w;
  if (fp0 < lo || fp0 + 16 > hi || (fp0 & 7) != 0)
    return NULL;
  pc = ((guint64 *) fp0)[1];
  sp = fp0 + 16;
  tag = mt_memo_tag (pc, sp);
  set = mt_memo_set (tag);
  fc->memo_lookups++;
  for (w = set; w != set + MT_STACK_MEMO_WAYS; w++)
  {
    if (fc->memo_tag[w] == tag && mt_memo_holds (&fc->memo[w], fp0, pc, sp, gen, hi, max))
    {
      fc->memo_used[w] = (guint32) ++fc->memo_clock;
      fc->memo_hits++;
      return &fc->memo[w];
    }
  }
  return NULL;
}

/* Adds the word at addr to entry e's checks, its value as it is now (the walk read it moments ago, on
 * this thread, from this stack); FALSE when its address cannot be said in 16 bits above fp0. */
static inline gboolean
mt_memo_check_add (MtStackMemo * e, guint * nc, guint64 fp0, guint64 addr)
{
  guint64 words;
  if (addr < fp0 || (addr & 7) != 0)
    return FALSE;
  words = (addr - fp0) / 8;
  if (words > 0xffff)
    return FALSE;
  e->check_off[*nc] = (guint16) words;
  e->check_val[*nc] = *(const volatile guint64 *) (gsize) addr;
  (*nc)++;
  return TRUE;
}

/* Memoizes the walk that just ran from fp0, if the frame cache holds it whole: frames[0, n) as the
 * caller finished them (the first `walked` the walk's, then a truncated stack's pseudo frame), their
 * hash.  Returns 1 + the entry's index, or 0 when it was not memoized. */
static guint32
mt_memo_store (MtFrameCache * fc, guint64 fp0, guint64 hi, guint max, const guint64 * frames, guint n,
    guint walked, gboolean truncated, guint64 hash)
{
  MtStackMemo * e;
  guint64 m = fc->m, u, pc, sp, tag;
  guint nc = 0, k, set, w, victim;
  if (fc->memo_lookups >= MT_MEMO_WINDOW)
  {
    /* Under a quarter of the window's lookups hit: 1 store in 16 misses; under a half: 1 in 4. */
    guint32 l = fc->memo_lookups, h = fc->memo_hits;
    fc->memo_mask = 4 * h < l ? 15 : 2 * h < l ? 3 : 0;
    fc->memo_lookups = 0;
    fc->memo_hits = 0;
  }
  if ((fc->memo_misses++ & fc->memo_mask) != 0)
    return 0;
  if (fc->hashed == 0 || m == 0 || m > MT_STACK_MEMO_LEVELS || n > MT_STACK_MEMO_LEVELS || walked > m)
    return 0;
  pc = ((guint64 *) fp0)[1];
  sp = fp0 + 16;
  if (fc->e[m - 1].pc != pc || fc->e[m - 1].sp != sp)
    return 0;
  /* The frames the walk gave are the cached levels' return addresses, innermost first. */
  for (k = 0; k != walked; k++)
    if (frames[k] != fc->e[m - 1 - k].pc)
      return 0;
  /* The entry: an empty way, else the set's least recently used (a first state may keep several). */
  tag = mt_memo_tag (pc, sp);
  set = mt_memo_set (tag);
  victim = set + MT_STACK_MEMO_WAYS;
  for (w = set; w != set + MT_STACK_MEMO_WAYS && victim == set + MT_STACK_MEMO_WAYS; w++)
    if (fc->memo_tag[w] == 0)
      victim = w;
  if (victim == set + MT_STACK_MEMO_WAYS)
  {
    victim = set;
    for (w = set + 1; w != set + MT_STACK_MEMO_WAYS; w++)
      if ((gint32) (fc->memo_used[w] - fc->memo_used[victim]) < 0)
        victim = w;
  }
  e = &fc->memo[victim];
  fc->memo_tag[victim] = 0;
  e->gen = 0;
  for (u = m - 1; u != 0; u--)
  {
    const MtUnwindLevel * l = &fc->e[u];
    const MtUnwindLevel * next = &fc->e[u - 1];
    guint64 addr = l->fpaddr & ~(guint64) 7;
    if (!mt_memo_check_add (e, &nc, fp0, next->sp - 8))
      return 0;
    if (addr != 0 && (next->fpaddr & MT_FC_NEED_FP) != 0 && !mt_memo_check_add (e, &nc, fp0, addr))
      return 0;
  }
  if (fc->term == MT_FC_END_PC)
  {
    if (nc == 2 * MT_STACK_MEMO_LEVELS || !mt_memo_check_add (e, &nc, fp0, fc->term_addr))
      return 0;
  }
  for (k = 0; k != n; k++)
    e->frames[k] = frames[k];
  e->pc = pc;
  e->sp = sp;
  e->fp = fc->e[m - 1].fp;
  e->hi = hi;
  e->max = max;
  e->n = (guint16) n;
  e->flags = (guint8) (((fc->e[m - 1].fpaddr & MT_FC_NEED_FP) != 0 ? MT_MEMO_NEED_FP : 0)
      | (truncated ? MT_MEMO_TRUNCATED : 0));
  e->n_checks = nc;
  e->stack_id = MT_NO_STACK;
  e->hash = hash;
  e->gen = fc->gen;   /* the generation the walk's rules came from */
  fc->memo_tag[victim] = tag;
  fc->memo_used[victim] = (guint32) ++fc->memo_clock;
  return 1 + victim;
}

static guint
mt_unwind_walk (guint64 fp0, guint64 lo, guint64 hi, guint64 * out, guint max, gboolean * truncated,
    MtUnwindCache * cache, MtFrameCache * fc)
{
  if (fp0 < lo || fp0 + 16 > hi || (fp0 & 7) != 0)
  {
    if (fc != NULL)
    {
      fc->reused = 0;
      fc->hashed = 0;
    }
    return 0;
  }
  return mt_unwind_walk_regs (((guint64 *) fp0)[1], fp0 + 16, ((guint64 *) fp0)[0], hi, out, max, truncated,
      cache, fc);
}
#endif
