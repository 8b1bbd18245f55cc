/*
 * memtrace purgeable tracer, C listeners.  Its own CModule (not the malloc core): the hot
 * entries (vm_purgable_control GET, madvise) are counted without entering JavaScript; the
 * transitions worth a stack call back into agents/purgeable.js.
 *
 * The generated layout header (memtrace/layout.py) comes first: MT_PF_* entry numbers (each
 * listener's function data), MT_PURGABLE_* control values, MT_PC_* counter slots.
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
extern void mt_on_set (gint fn, gpointer addr, gint control, gint new_state, gint old_state, gint kr,
    gpointer ret, gpointer fp);
extern void mt_on_create (gint fn, guint64 addr, guint64 size, gint flags, gint kr, gpointer ret, gpointer fp);
/* [start, end) pairs: the allocator's own code (libsystem_malloc on Darwin; the C library and the
 * stand-in libmtmalloc on Linux); unused pairs are 0, 0. */
extern guint64 mt_alloc_ranges[2 * MT_ALLOCATOR_RANGES];
extern void mt_on_madvise (gint fn, gpointer addr, guint64 len, gint advice, gpointer ret, gpointer fp);

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
} MtInv;

#if defined (__aarch64__)
# define MT_FP(ic) ((gpointer) (ic)->cpu_context->fp)
#else
# define MT_FP(ic) ((gpointer) (ic)->cpu_context->rbp)
#endif

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
  }
}

void
purg_leave (GumInvocationContext * ic)
{
  MtInv * d = GUM_IC_GET_INVOCATION_DATA (ic, MtInv);
  gint kr;
  if (!d->report)
    return;
  kr = (gint) (gsize) gum_invocation_context_get_return_value (ic);
  mt_on_set (fn_of (ic), d->p, d->control, d->new_state, *d->statep, kr, d->ret, d->fp);
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
}

void
create_leave (GumInvocationContext * ic)
{
  MtInv * d = GUM_IC_GET_INVOCATION_DATA (ic, MtInv);
  gint kr;
  if (!d->report)
    return;
  kr = (gint) (gsize) gum_invocation_context_get_return_value (ic);
  mt_on_create (fn_of (ic), d->p != NULL ? *(guint64 *) d->p : 0, d->size, d->flags, kr, d->ret, d->fp);
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
    mt_on_madvise (fn, gum_invocation_context_get_nth_argument (ic, 0),
        (guint64) (gsize) gum_invocation_context_get_nth_argument (ic, 1), advice,
        gum_invocation_context_get_return_address (ic), MT_FP (ic));
}
