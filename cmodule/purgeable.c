/*
 * memtrace purgeable tracer, C listeners.  Its own CModule (not the malloc core): the hot
 * entries (vm_purgable_control GET, madvise) are counted without entering JavaScript; the
 * transitions worth a stack call back into agents/purgeable.js.
 *
 * The generated layout header (memtrace/layout.py) comes first: MT_PF_* entry numbers (each
 * listener's function data), MT_PURGABLE_* control values, MT_PC_* counter slots.
 *
 * No JavaScript runs on the target's threads: a call worth streaming takes one slot of a ring in
 * the agent's memory (MtPurgEvent + its caller frames, walked here), and agents/purgeable.js drains
 * the ring from its flush, on the agent's own thread.  Before, each such call entered JavaScript
 * through a NativeCallback -- the script's lock, taken by every target thread making these calls,
 * against the agent's thread that needed it for its flush, its stop and its unload (the purgeable
 * storm's hangs: four threads waiting for that lock, docs/hook-storm.md).  The ring takes only
 * atomic adds (all TinyCC offers): a slot is claimed by adding 1 to its state (claimed when it was
 * 0; else the add is taken back and the event dropped, counted in MT_PC_EVENTS_DROPPED), written,
 * and made ready by adding MT_PURG_READY; the drain copies the ready ones out and frees them.  A
 * full ring never makes a thread wait.
 *
 * Each call counts once, at the outermost traced entry: xnu's vm_purgable_control calls
 * mach_vm_purgable_control and vm_allocate calls mach_vm_allocate (libsyscall/mach/mach_vm.c),
 * so a call that arrives while another traced call is in progress on its thread (invocation
 * depth > 0: only the call listeners here and the IOSurfaceSetPurgeable listener push one;
 * the Core Animation hooks are probes and push none) is counted in MT_PC_NESTED and not
 * streamed.
 */
#include <gum/guminterceptor.h>

extern volatile gint mt_counts[MT_PURGEABLE_N_COUNTS];
extern volatile gint mt_madv_stream[2];   /* bit masks of advice values to stream, per table */
extern volatile gint mt_madv_stream_hi[2];
/* [start, end) pairs: the allocator's own code (libsystem_malloc on Darwin; the C library and the
 * stand-in libmtmalloc on Linux); unused pairs are 0, 0. */
extern guint64 mt_alloc_ranges[2 * MT_ALLOCATOR_RANGES];
/* The event ring: MT_PURG_RING_SLOTS slots of MT_PURG_SLOT_BYTES (an MtPurgEvent, then its frames). */
extern guint8 mt_purg_ring[];
extern volatile gint mt_purg_head[1];      /* tickets handed out (wraps) */
extern guint mt_purg_next[1];              /* the slot the next drain looks at first (the drain's own) */
/* From the agent: [0, 1) the main thread's stack [lo, hi) and [2] its thread id (Linux: from
 * /proc/self/maps; 0 when unknown), [3] the bits of a return address that are the address, and
 * the C library's functions by address (TinyCC links none of them here): [4] syscall (Linux) or
 * pthread_mach_thread_np (Darwin), [5] pthread_self, [6] pthread_get_stackaddr_np (Darwin). */
extern guint64 mt_purg_cfg[7];
typedef guint64 (* MtPurgFn0) (void);
typedef guint64 (* MtPurgFn1) (guint64 arg);

typedef struct {
  gpointer p;
  gint * statep;
  guint64 size;
  gint control;
  gint new_state;
  gint flags;
  gint report;
  gpointer ret;
  gpointer fp;
  gpointer sp;
} MtInv;

#if defined (__aarch64__)
# define MT_FP(ic) ((gpointer) (ic)->cpu_context->fp)
# define MT_SP(ic) ((gpointer) (ic)->cpu_context->sp)
# define MT_GETTID_NR 178
#else
# define MT_FP(ic) ((gpointer) (ic)->cpu_context->rbp)
# define MT_SP(ic) ((gpointer) (ic)->cpu_context->rsp)
# define MT_GETTID_NR 186
#endif
/* A thread's descriptor farther than this above its stack pointer is not taken as its stack's top. */
#define MT_PURG_STACK_MAX (1ULL << 30)

/* The id Frida's Process.getCurrentThreadId() gives (the JavaScript tracers' tids): the kernel's
 * thread id on Linux, the Mach port name on Darwin. */
static guint64
purg_tid (void)
{
  MtPurgFn1 fn = (MtPurgFn1) mt_purg_cfg[4];
#ifdef MT_DARWIN
  return (guint32) fn (((MtPurgFn0) mt_purg_cfg[5]) ());
#else
  return (guint32) fn (MT_GETTID_NR);
#endif
}

/* The top of the calling thread's stack, or 0 when unknown (then only the return address is
 * kept).  Linux: the main thread's from the agent; any other thread pthread_create made has its
 * descriptor at the top of its stack block (as cmodule/core.c's mt_fetch_stack_bounds).  Darwin:
 * pthread_get_stackaddr_np.  DEVICE-UNVERIFIED on Darwin. */
static guint64
purg_stack_hi (guint64 sp, guint64 tid)
{
  guint64 top;
  if (mt_purg_cfg[1] != 0 && tid == mt_purg_cfg[2] && sp >= mt_purg_cfg[0] && sp < mt_purg_cfg[1])
    return mt_purg_cfg[1];
  top = ((MtPurgFn0) mt_purg_cfg[5]) ();
#ifdef MT_DARWIN
  top = ((MtPurgFn1) mt_purg_cfg[6]) (top);
#endif
  return (top > sp && top - sp < MT_PURG_STACK_MAX) ? top : 0;
}

/* The return address, then the frame-pointer chain above it, within [sp, hi) and rising (what
 * agents/runtime/stacks.js walkFrames read with guarded reads in JavaScript). */
static gint
purg_walk (guint64 * out, gpointer ret, gpointer fp0, gpointer sp0, guint64 tid)
{
  guint64 mask = mt_purg_cfg[3];
  guint64 sp = (guint64) sp0, fp = (guint64) fp0 & ~(1ULL << 60);
  guint64 hi = purg_stack_hi (sp, tid);
  gint n = 0;
  out[n++] = (guint64) ret & mask;
  while (hi != 0 && n < MT_PURG_FRAMES && fp >= sp && fp + 16 <= hi && (fp & 7) == 0)
  {
    guint64 next = ((guint64 *) fp)[0] & ~(1ULL << 60);
    guint64 r = ((guint64 *) fp)[1] & mask;
    if (r == 0)
      break;
    out[n++] = r;
    if (next <= fp)
      break;
    fp = next;
  }
  return n;
}

/* A slot for one event, or NULL (ring full: dropped, counted). */
static MtPurgEvent *
purg_claim (gint kind, gint fn)
{
  guint ticket = (guint) g_atomic_int_add (&mt_purg_head[0], 1);
  MtPurgEvent * e = (MtPurgEvent *) (mt_purg_ring + (gsize) (ticket & (MT_PURG_RING_SLOTS - 1)) * MT_PURG_SLOT_BYTES);
  if (g_atomic_int_add ((volatile gint *) &e->state, 1) != 0)
  {
    g_atomic_int_add ((volatile gint *) &e->state, -1);
    g_atomic_int_add (&mt_counts[MT_PC_EVENTS_DROPPED], 1);
    return NULL;
  }
  e->kind = kind;
  e->fn = fn;
  e->ticket = ticket;
  e->tid = purg_tid ();
  return e;
}

/* Its frames, then ready for the drain. */
static void
purg_publish (MtPurgEvent * e, gpointer ret, gpointer fp, gpointer sp)
{
  e->nframes = purg_walk ((guint64 *) ((guint8 *) e + sizeof (MtPurgEvent)), ret, fp, sp, e->tid);
  g_atomic_int_add ((volatile gint *) &e->state, MT_PURG_READY);
}

/* The agent's drain (its own thread, one at a time): up to `max` ready slots copied to `out`
 * (MT_PURG_SLOT_BYTES each, in slot order from where the last drain stopped -- so that no part
 * of a ring kept full is left behind -- the agent sorts them by ticket) and freed.  A slot being
 * written, or with a claim being taken back, waits for the next drain. */
guint
purg_drain (guint8 * out, guint max)
{
  guint i, n = 0, at = mt_purg_next[0];
  for (i = 0; i != MT_PURG_RING_SLOTS && n != max; i++)
  {
    guint8 * slot = mt_purg_ring + (gsize) ((at + i) & (MT_PURG_RING_SLOTS - 1)) * MT_PURG_SLOT_BYTES;
    MtPurgEvent * e = (MtPurgEvent *) slot;
    guint64 * src = (guint64 *) slot;
    guint64 * dst = (guint64 *) (out + (gsize) n * MT_PURG_SLOT_BYTES);
    guint k;
    if (g_atomic_int_add ((volatile gint *) &e->state, 0) != MT_PURG_READY + 1)
      continue;
    for (k = 0; k != MT_PURG_SLOT_BYTES / 8; k++)
      dst[k] = src[k];
    g_atomic_int_add ((volatile gint *) &e->state, -(MT_PURG_READY + 1));
    n++;
  }
  mt_purg_next[0] = (at + i) & (MT_PURG_RING_SLOTS - 1);
  return n;
}

static gint
fn_of (GumInvocationContext * ic)
{
  return (gint) (gsize) gum_invocation_context_get_listener_function_data (ic);
}

/* Inside another traced call on this thread: counted apart, never twice. */
static gboolean
nested (GumInvocationContext * ic, gint fn)
{
  if (gum_invocation_context_get_depth (ic) == 0)
    return FALSE;
  g_atomic_int_add (&mt_counts[MT_PC_NESTED + fn], 1);
  return TRUE;
}

/* MT_PF_VM_PURGABLE_CONTROL, MT_PF_MACH_VM_PURGABLE_CONTROL */
void
purg_enter (GumInvocationContext * ic)
{
  MtInv * d = GUM_IC_GET_INVOCATION_DATA (ic, MtInv);
  gint fn = fn_of (ic);
  gint control = (gint) (gsize) gum_invocation_context_get_nth_argument (ic, 2);
  gint * statep = (gint *) gum_invocation_context_get_nth_argument (ic, 3);
  gint base = MT_PC_CONTROLS + fn * MT_PC_CONTROL_STRIDE;
  d->report = 0;
  d->control = control;
  if (nested (ic, fn))
    return;
  if (control >= 0 && control <= MT_PURGABLE_SET_STATE_FROM_KERNEL)
    g_atomic_int_add (&mt_counts[base + control], 1);
  else
    g_atomic_int_add (&mt_counts[base + MT_PC_CONTROL_OTHER], 1);
  if ((control == MT_PURGABLE_SET_STATE || control == MT_PURGABLE_SET_STATE_FROM_KERNEL) && statep != NULL)
  {
    d->report = 1;
    d->p = gum_invocation_context_get_nth_argument (ic, 1);
    d->new_state = *statep;
    d->statep = statep;
    d->ret = gum_invocation_context_get_return_address (ic);
    d->fp = MT_FP (ic);
    d->sp = MT_SP (ic);
  }
}

void
purg_leave (GumInvocationContext * ic)
{
  MtInv * d = GUM_IC_GET_INVOCATION_DATA (ic, MtInv);
  MtPurgEvent * e;
  if (!d->report)
    return;
  e = purg_claim (MT_PURG_KIND_SET, fn_of (ic));
  if (e == NULL)
    return;
  e->addr = (guint64) (gsize) d->p;
  e->control = d->control;
  e->new_state = d->new_state;
  e->old_state = *d->statep;
  e->kr = (gint) (gsize) gum_invocation_context_get_return_value (ic);
  purg_publish (e, d->ret, d->fp, d->sp);
}

/* MT_PF_VM_ALLOCATE, MT_PF_MACH_VM_ALLOCATE (flags = arg 3); MT_PF_MACH_VM_MAP (flags = arg 4) */
void
create_enter (GumInvocationContext * ic)
{
  MtInv * d = GUM_IC_GET_INVOCATION_DATA (ic, MtInv);
  gint fn = fn_of (ic);
  gint flags = (gint) (gsize) gum_invocation_context_get_nth_argument (ic, fn == MT_PF_MACH_VM_MAP ? 4 : 3);
  d->report = 0;
  if (nested (ic, fn))
    return;
  g_atomic_int_add (&mt_counts[MT_PC_CREATION + fn], 1);
  d->report = (flags & MT_VM_FLAGS_PURGABLE) != 0;
  if (!d->report)
    return;
  d->p = gum_invocation_context_get_nth_argument (ic, 1);
  d->size = (guint64) (gsize) gum_invocation_context_get_nth_argument (ic, 2);
  d->flags = flags;
  d->ret = gum_invocation_context_get_return_address (ic);
  d->fp = MT_FP (ic);
  d->sp = MT_SP (ic);
}

void
create_leave (GumInvocationContext * ic)
{
  MtInv * d = GUM_IC_GET_INVOCATION_DATA (ic, MtInv);
  MtPurgEvent * e;
  if (!d->report)
    return;
  e = purg_claim (MT_PURG_KIND_CREATE, fn_of (ic));
  if (e == NULL)
    return;
  e->addr = d->p != NULL ? *(guint64 *) d->p : 0;
  e->size = d->size;
  e->flags = d->flags;
  e->kr = (gint) (gsize) gum_invocation_context_get_return_value (ic);
  purg_publish (e, d->ret, d->fp, d->sp);
}

/* MT_PF_MADVISE: the C library's madvise (platform advice table 0); MT_PF_MTDARWIN_MADVISE: the
 * stand-in's Darwin madvise (table 1).  Counted per advice value; the last slot takes
 * anything larger. */
void
madv_enter (GumInvocationContext * ic)
{
  gint fn = fn_of (ic);
  gint table = fn - MT_PF_MADVISE;
  gint advice = (gint) (gsize) gum_invocation_context_get_nth_argument (ic, 2);
  gint slot = (advice >= 0 && advice < MT_PC_MADVISE_SLOTS - 1) ? advice : MT_PC_MADVISE_SLOTS - 1;
  gboolean stream;
  g_atomic_int_add (&mt_counts[MT_PC_MADVISE + MT_PC_MADVISE_SLOTS * table + slot], 1);
  if (advice < 0 || advice >= 64)
    return;
  stream = advice < 32 ? ((mt_madv_stream[table] >> advice) & 1) : ((mt_madv_stream_hi[table] >> (advice - 32)) & 1);
  /* The allocator's own madvise calls (glibc trimming its heaps with an arena lock held;
   * libmalloc madvising freed pages reusable, which on iOS it does on most large frees) are
   * counted but never streamed: entering JavaScript there can take the target down, and they
   * are the allocator's business, not the app's reusable line. */
  if (stream)
  {
    guint64 ret = (guint64) (gsize) gum_invocation_context_get_return_address (ic);
    gint r;
    for (r = 0; r != MT_ALLOCATOR_RANGES; r++)
    {
      if (ret >= mt_alloc_ranges[2 * r] && ret < mt_alloc_ranges[2 * r + 1])
      {
        g_atomic_int_add (&mt_counts[MT_PC_MADVISE_INTERNAL], 1);
        return;
      }
    }
  }
  if (stream)
  {
    MtPurgEvent * e = purg_claim (MT_PURG_KIND_MADVISE, fn);
    if (e == NULL)
      return;
    e->addr = (guint64) (gsize) gum_invocation_context_get_nth_argument (ic, 0);
    e->size = (guint64) (gsize) gum_invocation_context_get_nth_argument (ic, 1);
    e->advice = advice;
    purg_publish (e, gum_invocation_context_get_return_address (ic), MT_FP (ic), MT_SP (ic));
  }
}
