/* Compiled after the core in the harness's build only.  The tables whose type only the core
 * knows are defined here at their exact size (an index past the slot array is then an ASan
 * report), and a few views of the core's private state for the harness's checks. */
#include <stdio.h>

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

/* The live table's keys and its big blocks, checked directly (cmodule/core.c, "the live-pointer
 * table"): every address a key can name comes back whole from its bucket and key, flag bits and
 * all; one it cannot name (past 2^48 with the smallest table) is refused, not mistaken for another;
 * a bucket's ninth block goes to its alternate and is found there; a block of 4 GiB or
 * more keeps its exact size through the side list, which refuses the one block too many and is
 * empty again once they are gone.  Returns the failures (each said on stderr); leaves the table
 * as it found it. */
guint64
mt_probe_live_keys (void)
{
  static const guint64 addresses[] = {
    0x10, 0x1000, 0x55555555a2a0ULL, 0x55555555a2a8ULL | MT_LIVE_OWED, 0x7ffff7a00010ULL,
    0x7ffff7a000f0ULL | MT_LIVE_VM, 0xffffffffff0ULL, 0xfffffffffff0ULL, 0x123456789ab0ULL,
  };
  guint64 failures = 0, i, b;
  MtLiveMeta m;
  for (i = 0; i != G_N_ELEMENTS (addresses); i++)
  {
    guint64 p = addresses[i];
    guint32 key = mt_live_key (p);
    b = mt_live_bucket (p);
    if (key == 0 || mt_live_address (b, key) != p)
    {
      fprintf (stderr, "probe: %#llx keyed %#x comes back as %#llx\n", (unsigned long long) p, key,
               (unsigned long long) (key == 0 ? 0 : mt_live_address (b, key)));
      failures++;
    }
  }
  {
    guint64 far = (guint64) MT_LIVE_KEY_WINDOWS << (MT_LIVE_SHIFT + mt_config.live_bits);
    if (far < (1ULL << 48) || mt_live_key (far) != 0 || mt_live_insert (far, 64, 1, 0, 16)
        || mt_live_address (mt_live_bucket (far - 16), mt_live_key (far - 16)) != far - 16)
    {
      fprintf (stderr, "probe: the first address a key cannot name (%#llx) was keyed, or the last one not\n",
               (unsigned long long) far);
      failures++;
    }
  }
  /* An entry's stack id and sampling multiplier share a word: every id the stack table can give and
   * every pseudo stack come back whole, with k beside them. */
  {
    static const guint32 ids[] = { 0, 1, (1u << 23) - 1, 0xFFFFFFFDu, 0xFFFFFFFEu, 0xFFFFFFFFu };
    static const guint ks[] = { 0, 1, 255 };
    guint j, q;
    for (j = 0; j != G_N_ELEMENTS (ids); j++)
      for (q = 0; q != G_N_ELEMENTS (ks); q++)
      {
        guint64 p = 0x7f2000000040ULL;
        if (!mt_live_insert (p, 48, ids[j], ks[q], 16) || !mt_live_remove (p, &m) || m.size != 48
            || m.stack_id != ids[j] || m.k != ks[q])
        {
          fprintf (stderr, "probe: stack %#x with k %u came back as %#x, k %u\n", ids[j], ks[q], m.stack_id,
                   m.k);
          failures++;
        }
      }
  }
  for (i = 0; i != MT_LIVE_BIG_BLOCKS + 1; i++)
  {
    guint64 p = 0x100000000000ULL + i * 0x100000000ULL;
    gboolean in = mt_live_insert (p, (5ULL << 32) + i, 7, 0, 16);
    if (in != (i < MT_LIVE_BIG_BLOCKS))
    {
      fprintf (stderr, "probe: big block %llu %s\n", (unsigned long long) i, in ? "taken past the list" : "refused");
      failures++;
    }
  }
  for (i = 0; i != MT_LIVE_BIG_BLOCKS; i++)
  {
    guint64 p = 0x100000000000ULL + i * 0x100000000ULL;
    gint way = mt_live_find (p, &b);
    if (way < 0 || mt_live_entry_size (b * MT_LIVE_WAYS + (guint64) way, p) != (5ULL << 32) + i
        || !mt_live_remove (p, &m) || m.size != (5ULL << 32) + i || m.stack_id != 7)
    {
      fprintf (stderr, "probe: big block %llu lost its size\n", (unsigned long long) i);
      failures++;
    }
  }
  /* The logger path's owed big block and a new big block at its address: each keeps its own size. */
  {
    guint64 p = 0x7f1000000010ULL, at = 0;
    gint way;
    MtLiveMeta m2;
    /* (A block listed first and gone again leaves the list's first pair free for the new block.) */
    mt_live_insert (p + 0x100, 5ULL << 32, 3, 0, 16);
    mt_live_insert (p, 6ULL << 32, 3, 0, 16);
    mt_live_remove (p + 0x100, &m);
    way = mt_live_find (p, &at);
    if (way >= 0)
      mt_bucket_rekey (at, way, p | MT_LIVE_OWED);
    mt_live_insert (p, 7ULL << 32, 4, 0, 16);
    if (way < 0 || !mt_live_remove (p | MT_LIVE_OWED, &m) || m.size != 6ULL << 32
        || !mt_live_remove (p, &m2) || m2.size != 7ULL << 32)
    {
      fprintf (stderr, "probe: an owed big block and a new one at its address mixed up their sizes\n");
      failures++;
    }
    /* A pair left listed (its removal could not have the list's lock) is taken over, not doubled. */
    mt_live_big_add (p, 8ULL << 32);
    mt_live_big_add (p, 9ULL << 32);
    if (mt_live_big_size (p, TRUE) != 9ULL << 32 || mt_live_big_size (p, TRUE) != 0)
    {
      fprintf (stderr, "probe: a stale big pair was doubled\n");
      failures++;
    }
  }

  /* The last alternate: the home of p and its first six alternates filled with stand-in keys, p goes
   * to the seventh, is found there (its home said it spilled), named, and taken out. */
  {
    guint64 p = 0x7f0000fff0a0ULL, home = mt_live_bucket (p), at = 0;
    guint32 key = mt_live_key (p), j, w;
    gint way;
    for (w = 0; w != MT_LIVE_WAYS; w++)
      mt_live_entries (home)[w].key = 0x1000 + w;
    for (j = 1; j != MT_LIVE_ALTS; j++)
      for (w = 0; w != MT_LIVE_WAYS; w++)
        mt_live_entries (mt_live_alt (home, key, j))[w].key = 0x2000 + w;
    if (!mt_live_insert (p, 77, 5, 0, 16) || mt_live_spill[home] != 1
        || (way = mt_live_find (p, &at)) < 0 || at != mt_live_alt (home, key, MT_LIVE_ALTS)
        || mt_live_entry_address (at * MT_LIVE_WAYS + (guint64) way) != p
        || !mt_live_remove (p, &m) || m.size != 77 || mt_live_find (p, &at) >= 0)
    {
      fprintf (stderr, "probe: a block in its last alternate was not kept, found or named\n");
      failures++;
    }
    if (mt_live_insert (p + 0x10, 78, 5, 0, 16) || mt_live_insert (p + 0x20, 78, 5, 0, 16)
        ? FALSE : TRUE)
    {
      /* (two more fit: the seventh alternate has 8 ways) */
      fprintf (stderr, "probe: the seventh alternate took nothing more\n");
      failures++;
    }
    mt_live_remove (p + 0x10, &m);
    mt_live_remove (p + 0x20, &m);
    for (w = 0; w != MT_LIVE_WAYS; w++)
      mt_live_entries (home)[w].key = 0;
    for (j = 1; j != MT_LIVE_ALTS; j++)
      for (w = 0; w != MT_LIVE_WAYS; w++)
        mt_live_entries (mt_live_alt (home, key, j))[w].key = 0;
    mt_live_spill[home] = 0;
  }

  /* A crowded bucket: 16 blocks 16 bytes apart in one span, 8 in their home and 8 in their
   * alternates, each found, named and taken out. */
  for (i = 0; i != 16; i++)
  {
    guint64 p = 0x7f0000001000ULL + 16 * i;
    if (!mt_live_insert (p, 16 + i, 9, 0, 16))
    {
      fprintf (stderr, "probe: block %llu of a crowded bucket refused\n", (unsigned long long) i);
      failures++;
    }
  }
  for (i = 0; i != 16; i++)
  {
    guint64 p = 0x7f0000001000ULL + 16 * i;
    gint way = mt_live_find (p, &b);
    if (way < 0 || (b == mt_live_bucket (p)) != (i < 8) || mt_live_entry_address (b * MT_LIVE_WAYS + (guint64) way) != p
        || !mt_live_remove (p, &m) || m.size != 16 + i)
    {
      fprintf (stderr, "probe: block %llu of a crowded bucket lost (way %d)\n", (unsigned long long) i, way);
      failures++;
    }
  }
  for (i = 0; i != 2 * MT_LIVE_BIG_BLOCKS; i++)
    if (i % 2 == 1 && mt_globals.live_big[i] != 0)
    {
      fprintf (stderr, "probe: the big blocks' list kept pair %llu\n", (unsigned long long) (i / 2));
      failures++;
    }
  return failures;
}
