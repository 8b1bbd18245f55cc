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

/* The stack index after the run: every interned id exactly once in the current generation's table,
 * at a hash that finds it (within the 64 probes a lookup makes).  Returns the first broken id + 1,
 * or 0; *gen: the generation reached (the index grew that many times). */
guint64
mt_probe_index_check (guint64 * gen)
{
  guint64 g = mt_core.index_gen, n = mt_core.n_stacks;
  guint64 entries = mt_index_entries (g), i, seen = 0;
  volatile guint64 * table = mt_index_table (g);
  *gen = g;
  for (i = 0; i != entries; i++)
  {
    guint64 h = table[2 * i], id = table[2 * i + 1], d;
    if (h == 0)
      continue;
    seen++;
    if (id >= n)
      return id + 1;
    d = (i - h) & (entries - 1);
    if (d >= 64)
      return id + 1;
  }
  return seen == n ? 0 : n + 1;
}

/* The drain's live block count and the tracked bytes before drain.c clamps what it reports: a
 * harness whose threads free only their own blocks must never see either below zero. */
gint64
mt_probe_live_blocks (void)
{
  return mt_core.live_blocks;
}

gint64
mt_probe_tracked_bytes (void)
{
  return mt_core.tracked_bytes;
}
