/*
 * memtrace malloc tracer, hot paths.  Compiled after core.c in one CModule.
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
 * DEVICE-UNVERIFIED: the logger path is written from libmalloc's headers and
 * exercised on Linux by calling mt_malloc_logger directly.
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

/* The decoded event (MtLoggerEvent, MT_OP_*: what the caller is to do) and the call kinds
 * (MT_K_*) come from the generated layout header: the agent reads MtLoggerEvent back in
 * decodeLoggerEvent. */

/* Pure: the argument patterns of libmalloc's and libsyscall's logger calls.
 *   malloc/valloc/memalign: ALLOC|ZONE,           zone, size, 0, result
 *   calloc:                 ALLOC|ZONE|CLEARED,   zone, n*size, 0, result
 *   realloc:                ALLOC|DEALLOC|ZONE,   zone, old, new_size, result
 *   free:                   DEALLOC|ZONE,         zone, ptr, 0, 0
 *   mach_vm_allocate/map, anonymous mmap: VM_ALLOCATE|tag<<24, task, size, 0, address
 *   file mmap:              VM_ALLOCATE|MAPPED_FILE, task, size, 0, address
 *   mach_vm_deallocate/munmap: VM_DEALLOCATE, task, address, size, 0 */
void
mt_logger_decode (guint32 type, guint64 arg1, guint64 arg2, guint64 arg3, guint64 result, MtLoggerEvent * ev)
{
  guint32 bits = type & 0x00ffffff;
  ev->op = MT_OP_IGNORE;
  ev->kind = 0;
  ev->ptr = 0;
  ev->size = 0;
  ev->old_ptr = 0;
  ev->tag = (type >> 24) & 0xff;
  (void) arg1;

  if (bits & MT_LOG_VM_ALLOCATE)
  {
    ev->op = MT_OP_VM_ALLOC;
    ev->kind = (bits & MT_LOG_MAPPED_FILE) ? MT_K_MAPPED_FILE : MT_K_VM_ALLOCATE;
    ev->size = arg2;
    ev->ptr = result;
    return;
  }
  if (bits & MT_LOG_VM_DEALLOCATE)
  {
    ev->op = MT_OP_VM_FREE;
    ev->kind = MT_K_VM_DEALLOCATE;
    ev->old_ptr = arg2;
    ev->size = arg3;
    ev->tag = 0;
    return;
  }
  ev->tag = 0;
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

void
mt_malloc_logger (guint32 type, guint64 arg1, guint64 arg2, guint64 arg3, guint64 result, guint32 skip)
{
  gpointer fp = __builtin_frame_address (0);
  MtLoggerEvent ev;
  MtSlot * s;
  (void) skip;
  if (!mt_config.enabled)
    return;
  mt_logger_decode (type, arg1, arg2, arg3, result, &ev);
  if (ev.op == MT_OP_IGNORE)
    return;
  s = mt_slot ();
  if (s == NULL)
    return;
  if (G_UNLIKELY (s->busy != 0))
  {
    /* libmalloc logs after the operation: a nested event is a signal handler's (or ours). */
    switch (ev.op)
    {
      case MT_OP_ALLOC:
      case MT_OP_VM_ALLOC:
        mt_nested (s, (guint) ev.kind, ev.ptr, ev.size, 0, TRUE);
        break;
      case MT_OP_FREE:
      case MT_OP_VM_FREE:
        mt_nested (s, (guint) ev.kind, 0, ev.size, ev.old_ptr, FALSE);
        break;
      case MT_OP_REALLOC:
        mt_nested (s, MT_K_REALLOC, ev.ptr, ev.size, ev.old_ptr, TRUE);
        break;
    }
    return;
  }
  mt_set_busy (s, MT_BUSY_HOOK);
  switch (ev.op)
  {
    case MT_OP_ALLOC:
    case MT_OP_VM_ALLOC:
      mt_on_alloc (s, (guint) ev.kind, (gpointer) ev.ptr, ev.size, fp);
      break;
    case MT_OP_FREE:
    case MT_OP_VM_FREE:
      s->counters[MT_C_CALLS + ev.kind]++;
      s->counters[MT_C_BYTES + ev.kind] += ev.size;
      mt_on_release (s, (guint) ev.kind, (gpointer) ev.old_ptr, ev.size, FALSE);
      break;
    case MT_OP_REALLOC:
      if (ev.old_ptr != 0 && (ev.ptr != 0 || ev.size == 0))
        mt_on_release (s, MT_K_REALLOC, (gpointer) ev.old_ptr, 0, FALSE);
      mt_on_alloc (s, MT_K_REALLOC, (gpointer) ev.ptr, ev.size, fp);
      break;
  }
  mt_set_busy (s, 0);
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
    mt_nested (s, kind, (guint64) p, size_expr, 0, TRUE);               \
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
    mt_count_call (s, kind, size_expr);                                 \
    /* The frame address read here is the frame pointer itself: no register kept across the call. */ \
    mt_on_allocated (s, kind, p, size_expr, __builtin_frame_address (0)); \
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
      mt_nested (s, kind, (guint64) p, size_expr, 0, TRUE);             \
      return p;                                                         \
    }                                                                   \
    seq0 = s->nested_seq;                                               \
    mt_set_busy (s, MT_BUSY_COMPOUND);                                  \
    mt_count_call (s, kind, size_expr);                                 \
    p = real_##fn args;                                                 \
    mt_set_busy (s, MT_BUSY_HOOK);                                      \
    mt_reconcile (s, seq0, (guint64) p, 0);                             \
    if (G_UNLIKELY ((mt_alias_kinds & (1ULL << kind)) != 0))            \
      mt_note_site (kind, fp, size_expr);                               \
    mt_on_allocated (s, kind, p, size_expr, fp);                        \
    mt_set_busy (s, 0);                                                 \
    return p;                                                           \
  }

MT_DEFINE_ALLOC (malloc, MT_K_MALLOC, size, (gsize size), (size), (MtSlot * s, gsize size), (s, size))
MT_DEFINE_ALLOC (calloc, MT_K_CALLOC, (guint64) n * (guint64) size, (gsize n, gsize size), (n, size),
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
  guint64 bytes = (guint64) n * (guint64) size;
  gboolean array = kind == MT_K_REALLOCARRAY;
  if (!mt_config.enabled || (s = mt_slot ()) == NULL)
    return array ? real_reallocarray (old, n, size) : real_realloc (old, size);
  if (G_UNLIKELY (s->busy != 0))
  {
    p = array ? real_reallocarray (old, n, size) : real_realloc (old, size);
    mt_nested (s, kind, (guint64) p, bytes, (p != NULL || bytes == 0) ? (guint64) old : 0, TRUE);
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
    mt_on_alloc (s, kind, p, bytes, fp);
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

/* free's uncommon cases, out of its way: hooks off, no slot, or nested. */
static MT_NOINLINE void
mt_free_aside (gpointer p)
{
  MtSlot * s;
  if (mt_config.enabled && (s = mt_slot ()) != NULL && s->busy != 0)
    mt_nested (s, MT_K_FREE, 0, 0, (guint64) p, FALSE);
  real_free (p);
}

void
mt_free (gpointer p)
{
  MtSlot * s;
  if (G_UNLIKELY (!mt_config.enabled) || G_UNLIKELY ((s = mt_slot ()) == NULL) || G_UNLIKELY (s->busy != 0))
  {
    mt_free_aside (p);
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
    mt_nested (s, MT_K_POSIX_MEMALIGN, r == 0 ? (guint64) *out : 0, size, 0, TRUE);
    return r;
  }
  seq0 = s->nested_seq;
  mt_set_busy (s, MT_BUSY_COMPOUND);
  r = real_posix_memalign (out, alignment, size);
  mt_set_busy (s, MT_BUSY_HOOK);
  mt_reconcile (s, seq0, r == 0 ? (guint64) *out : 0, 0);
  mt_on_alloc (s, MT_K_POSIX_MEMALIGN, r == 0 ? *out : NULL, size, fp);
  mt_set_busy (s, 0);
  return r;
}

MT_DEFINE_COMPOUND (memalign, MT_K_MEMALIGN, size, (gsize alignment, gsize size), (alignment, size))
MT_DEFINE_COMPOUND (aligned_alloc, MT_K_ALIGNED_ALLOC, size, (gsize alignment, gsize size), (alignment, size))
MT_DEFINE_COMPOUND (valloc, MT_K_VALLOC, size, (gsize size), (size))
MT_DEFINE_COMPOUND (pvalloc, MT_K_PVALLOC, size, (gsize size), (size))
