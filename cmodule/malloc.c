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
  s = mt_enter ();
  if (s == NULL)
    return;
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
      mt_on_release (s, (guint) ev.kind, (gpointer) ev.old_ptr, ev.size);
      break;
    case MT_OP_REALLOC:
      if (ev.old_ptr != 0 && (ev.ptr != 0 || ev.size == 0))
        mt_on_release (s, MT_K_REALLOC, (gpointer) ev.old_ptr, 0);
      mt_on_alloc (s, MT_K_REALLOC, (gpointer) ev.ptr, ev.size, fp);
      break;
  }
  mt_leave (s);
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
