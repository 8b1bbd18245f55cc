/* Compiled after the core in the harness's build only.  The tables whose type only the core
 * knows are defined here at their exact size (an index past the slot array is then an ASan
 * report), and a few views of the core's private state for the harness's checks. */
#define MT_HARNESS_SLOTS 64

MtGlobals mt_globals;
MtCore mt_core;
MtSlot mt_slots[MT_HARNESS_SLOTS + 1];     /* + the shared slot of threads past n_slots (core.c) */

guint64
mt_probe_n_slots (void)
{
  return MT_HARNESS_SLOTS;
}

guint64
mt_probe_slots_hw (void)
{
  return (guint64) (gint64) mt_globals.slots_hw;
}

void
mt_probe_set_slots_hw (gint hw)
{
  mt_globals.slots_hw = hw;
}

/* Takes (+1) or lets go of (-1) the peak's lock, as another thread holding it would. */
void
mt_probe_peak_lock (gint delta)
{
  g_atomic_int_add (&mt_core.peak_lock, delta);
}

guint64
mt_probe_live_bucket (guint64 p)
{
  return mt_live_bucket (p);
}
