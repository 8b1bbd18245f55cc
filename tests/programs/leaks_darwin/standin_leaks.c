/* The leak scan's Darwin path (cmodule/leaks.c built with MT_DARWIN) run on Linux against the
 * stand-in's Mach calls (demo/darwin/mtmach.c): stopping the world with task_threads /
 * thread_suspend / thread_get_state, never suspending "Frida's" thread, reading with
 * mach_vm_read_overwrite, stacks found by vm_region_submap_info_64's user_tag, signed (PAC-like)
 * pointers stripped.  Prints one JSON object (tests/integration/test_leaks_darwin.py checks it).
 *
 * Built with -I <generated layout header dir> -I tests/programs/leaks_darwin -I cmodule. */
#define MT_DARWIN 1
#include "mt_layout.h"

#define MT_LIVE_SUSPECT 1
#define MT_LIVE_OWED 2
#define MT_LIVE_VM 4
#define BUCKETS 16

/* The core's tables leaks.c reads (mt_leak_candidates), in their own pages: they hold block
 * addresses, so like the agent's tables they are not roots. */
MtConfig mt_config;
static volatile guint64 * mt_live_table_p;
static MtLiveMeta * mt_live_meta_p;
static volatile gint * mt_live_occupancy_p;
#define mt_live_table mt_live_table_p
#define mt_live_meta mt_live_meta_p
#define mt_live_occupancy mt_live_occupancy_p
/* leaks.c reads the live table through core.c's accessors (entry i's address, its size, its stack):
 * here, plain arrays of whole addresses and metas. */
static inline guint64
mt_live_entry_address (guint64 i)
{
  return mt_live_table[i];
}

static inline guint64
mt_live_entry_size (guint64 i, guint64 p)
{
  (void) p;
  return mt_live_meta[i].size;
}
static inline guint32
mt_live_entry_stack_id (guint64 i)
{
  return mt_live_meta[i].stack_id;
}

static inline void
mt_barrier (void)
{
  __atomic_thread_fence (__ATOMIC_SEQ_CST);
}

/* world.c stops the world for the scan (Mach thread suspension on Darwin), compiled first as in
 * the agent's CModule; gum_clear_cache is one of Frida's (unused by the Mach stop's paths here). */
void gum_clear_cache (gpointer address, gsize size) { __builtin___clear_cache ((char *) address, (char *) address + size); }
#include "world.c"
#include "leaks.c"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void * mmap (void * addr, size_t len, int prot, int flags, int fd, long off);
extern guint32 mtmach_thread_self (void);
extern int mtmach_suspend_count (guint32 thread);
extern int mtmach_user_refs (guint32 thread);
extern void mtmach_zone_register (void * p, guint64 size);

#define PAGE_RW 3
#define MAP_ANON_PRIVATE 0x22
#define N_LOST 5

void * volatile g_kept;                 /* a module's data: a root */
void * volatile g_kept_before;          /* a block from before tracing (only the zone knows it), kept */
volatile guint64 g_signed;              /* a pointer with a signature in its top bits (arm64e's PAC) */
static volatile long g_busy_count, g_frida_count;
static volatile guint32 g_sleeper_port, g_busy_port, g_frida_port;
static volatile guint64 g_sleeper_local_at;
static volatile int g_stop_threads;

static void *
fresh (size_t size)
{
  void * p = mmap (NULL, size, PAGE_RW, MAP_ANON_PRIVATE, -1, 0);
  if (p == (void *) -1)
    abort ();
  return p;
}

static void *
sleeper (void * block)
{
  void * volatile held = block;      /* only here: reachable through this thread's stack */
  g_sleeper_local_at = (guint64) &held;
  g_sleeper_port = mtmach_thread_self ();
  while (!g_stop_threads)
  {
    struct timespec ts = { 0, 500 * 1000 * 1000 };  /* long: blocked (its sp known) when the regions are listed */
    nanosleep (&ts, NULL);
  }
  return (void *) held;
}

static void *
busy (void * arg)
{
  (void) arg;
  g_busy_port = mtmach_thread_self ();
  while (!g_stop_threads)
    g_busy_count++;
  return NULL;
}

static void *
frida (void * arg)
{
  (void) arg;
  g_frida_port = mtmach_thread_self ();
  while (!g_stop_threads)
    g_frida_count++;
  return NULL;
}

static void
track (guint64 i, void * p, guint64 size)
{
  mt_live_table[i] = (guint64) p;
  mt_live_meta[i].size = size;
  mt_live_meta[i].stack_id = (guint32) (100 + i);
  mt_live_occupancy[i / MT_LIVE_WAYS]++;
}

typedef struct {
  guint64 base, size;
} Own;

/* The writable mappings (as the agent lists them), minus our own tables. */
static guint64
list_ranges (MtLeakRange * out, guint64 cap, const Own * own, int n_own)
{
  static char maps[1 << 16];
  FILE * f = fopen ("/proc/self/maps", "r");
  size_t len = fread (maps, 1, sizeof (maps) - 1, f);
  guint64 n = 0;
  fclose (f);
  maps[len] = 0;
  for (char * line = strtok (maps, "\n"); line != NULL && n < cap; line = strtok (NULL, "\n"))
  {
    unsigned long lo, hi;
    char perms[5];
    int skip = 0;
    if (sscanf (line, "%lx-%lx %4s", &lo, &hi, perms) != 3 || perms[0] != 'r' || perms[1] != 'w')
      continue;
    for (int k = 0; k < n_own; k++)
      skip |= own[k].base >= lo && own[k].base < hi;
    if (skip || strstr (line, "[vvar") != NULL)
      continue;
    /* as agents/leaks.js lists them on Darwin: malloc's own regions are not roots */
    int tag = mt_leak_region_tag (lo);
    if (tag >= MT_VM_TAG_MALLOC_FIRST && tag <= MT_VM_TAG_MALLOC_LAST)
      continue;
    out[n].base = lo;
    out[n].size = hi - lo;
    out[n].flags = tag == MT_VM_MEMORY_STACK ? MT_LEAK_RANGE_STACK : 0;
    out[n].live_from = 0;
    n++;
  }
  return n;
}

static const char *
verdict (MtLeakJob * job, void * p)
{
  const MtLeakBlock * b = (const MtLeakBlock *) job->blocks;
  static const char * names[] = { "definitely_lost", "possibly_lost", "reachable", "indirectly_lost" };
  for (guint64 i = 0; i < job->n_blocks; i++)
    if (b[i].ptr == (guint64) p)
      return names[((guint8 *) job->marks)[i]];
  return "not_a_candidate";
}

int
main (void)
{
  const guint64 entries = BUCKETS * MT_LIVE_WAYS, cap = 64;
  Own own[8];
  int n_own = 0;
  void * lost[N_LOST];
  pthread_t t_sleep, t_busy, t_frida;

  mt_config.live_mask = BUCKETS - 1;
  mt_live_table = fresh (entries * 8);
  mt_live_meta = fresh (entries * sizeof (MtLiveMeta));
  mt_live_occupancy = fresh (BUCKETS * sizeof (gint));
  own[n_own++] = (Own) { (guint64) mt_live_table, entries * 8 };
  own[n_own++] = (Own) { (guint64) mt_live_meta, entries * sizeof (MtLiveMeta) };
  own[n_own++] = (Own) { (guint64) mt_live_occupancy, BUCKETS * sizeof (gint) };

  for (int i = 0; i < N_LOST; i++)
    lost[i] = calloc (1, 100);
  g_kept = calloc (1, 200);
  void * on_stack = calloc (1, 300);
  void * signed_block = calloc (1, 400);
  g_signed = (guint64) signed_block | (0xa5c3ULL << 48);
  for (int i = 0; i < N_LOST; i++)
    track ((guint64) i, lost[i], 100);
  /* Blocks from before tracing: the zone lists them, the live table does not (and a traced block
   * the zone lists too is not counted twice). */
  void * before[3];
  for (int i = 0; i < 3; i++)
    mtmach_zone_register (before[i] = calloc (1, 64), 64);
  g_kept_before = calloc (1, 72);
  mtmach_zone_register (g_kept_before, 72);
  mtmach_zone_register (lost[0], 100);
  track (N_LOST, g_kept, 200);
  track (N_LOST + 1, on_stack, 300);
  track (N_LOST + 2, signed_block, 400);

  pthread_create (&t_sleep, NULL, sleeper, on_stack);
  on_stack = NULL;
  pthread_create (&t_busy, NULL, busy, NULL);
  pthread_create (&t_frida, NULL, frida, NULL);
  while (g_sleeper_port == 0 || g_busy_port == 0 || g_frida_port == 0 || g_sleeper_local_at == 0)
    usleep (1000);
  usleep (50000);                    /* the sleeper is in nanosleep: its sp is known */

  /* vm_region_submap_info_64: user_tag is word 5 (pack(4)); word 4 is the offset's high half. */
  guint64 a = g_sleeper_local_at, size = 0;
  guint32 depth = 0, count = MT_SUBMAP_INFO_COUNT_64;
  gint32 info[32];
  memset (info, 0, sizeof (info));
  mach_vm_region_recurse (mach_task_self_, &a, &size, &depth, info, &count);
  int tag = mt_leak_region_tag (g_sleeper_local_at);

  MtLeakJob * job = fresh (sizeof (MtLeakJob));
  guint64 * skip = fresh (4096);
  MtLeakThread * threads = fresh (256 * sizeof (MtLeakThread));
  guint64 * regs = fresh (256 * MT_LEAK_REGS * 8);
  MtLeakBlock * blocks = fresh (cap * sizeof (MtLeakBlock));
  guint8 * marks = fresh (cap);
  guint32 * work = fresh (cap * 2 * 4);
  guint8 * scratch = fresh (65536);
  MtLeakSeg * segs = fresh (4096);
  MtLeakRange * ranges = fresh (1 << 20);
  own[n_own++] = (Own) { (guint64) blocks, cap * sizeof (MtLeakBlock) };
  own[n_own++] = (Own) { (guint64) work, cap * 8 };
  own[n_own++] = (Own) { (guint64) threads, 4096 };
  own[n_own++] = (Own) { (guint64) regs, 256 * MT_LEAK_REGS * 8 };
  skip[0] = g_frida_port;
  memset (job, 0, sizeof (*job));
  job->self_tid = mtmach_thread_self ();
  job->skip = (guint64) skip;
  job->n_skip = 1;
  job->threads = (guint64) threads;
  job->threads_cap = 256;
  job->regs = (guint64) regs;
  job->blocks = (guint64) blocks;
  job->blocks_cap = cap;
  job->marks = (guint64) marks;
  job->worklist = (guint64) work;
  job->scratch = (guint64) scratch;
  job->scratch_size = 65536;
  job->segs = (guint64) segs;
  job->segs_cap = 4096 / sizeof (MtLeakSeg);
  job->page_size = 4096;
  job->ptr_mask = 0x0000ffffffffffffULL;     /* the signature bits above the address space */
  job->pagemap_fd = ~(guint64) 0;
  job->budget_us = 10 * 1000000;
  job->ranges = (guint64) ranges;
  job->n_ranges = list_ranges (ranges, (1 << 20) / sizeof (MtLeakRange), own, n_own);

  /* Step by step, to watch the world while it is stopped. */
  mt_leak_stop (job);
  long busy0 = g_busy_count, frida0 = g_frida_count;
  int busy_suspended = mtmach_suspend_count (g_busy_port), frida_suspended = mtmach_suspend_count (g_frida_port);
  usleep (100000);
  long busy1 = g_busy_count, frida1 = g_frida_count;
  guint64 sleeper_sp = 0;
  for (guint64 i = 0; i < job->n_threads; i++)
    if (threads[i].tid == g_sleeper_port)
      sleeper_sp = threads[i].sp;
  mt_leak_collect (job);
  while (!mt_leak_step (job, 1 << 20))
    ;
  guint64 stopped = job->n_threads, failed = job->n_failed;
  const char * v_lost[N_LOST];
  for (int i = 0; i < N_LOST; i++)
    v_lost[i] = verdict (job, lost[i]);
  const char * v_kept = verdict (job, g_kept), * v_stack = verdict (job, (void *) mt_live_table[N_LOST + 1]);
  const char * v_signed = verdict (job, signed_block);
  const char * v_before0 = verdict (job, before[0]), * v_before2 = verdict (job, before[2]);
  const char * v_kept_before = verdict (job, g_kept_before);
  guint64 n_candidates = job->n_blocks, n_untracked = job->n_untracked;
  before[0] = before[1] = before[2] = NULL;
  mt_leak_resume (job);
  usleep (50000);
  long busy2 = g_busy_count;

  /* The whole scan in one call, as the agent makes it on Darwin. */
  memset (marks, 0, cap);
  int complete = mt_leak_scan_all (job);
  const char * v_lost_again = verdict (job, lost[0]), * v_stack_again = verdict (job, (void *) mt_live_table[N_LOST + 1]);
  int sleeper_suspended_after = mtmach_suspend_count (g_sleeper_port);
  /* Not stripped, the signed pointer points nowhere: its block reads as lost. */
  job->ptr_mask = ~(guint64) 0;
  mt_leak_scan_all (job);
  const char * v_signed_unstripped = verdict (job, signed_block);

  printf ("{\"tag\": %d, \"info_word4\": %d, \"info_word5\": %d, \"threads_stopped\": %llu, \"threads_failed\": %llu,"
          " \"busy_suspended\": %d, \"frida_suspended\": %d, \"busy_frozen\": %s, \"frida_ran\": %s,"
          " \"busy_resumed\": %s, \"sleeper_sp_in_its_stack\": %s,"
          " \"lost\": [\"%s\", \"%s\", \"%s\", \"%s\", \"%s\"], \"kept\": \"%s\", \"on_stack\": \"%s\","
          " \"signed\": \"%s\", \"scan_all_complete\": %d, \"scan_all_lost\": \"%s\", \"scan_all_on_stack\": \"%s\","
          " \"scan_all_stopped\": %llu, \"sleeper_suspended_after\": %d,"
          " \"refs\": [%d, %d, %d], \"skip_stack\": %llu, \"signed_unstripped\": \"%s\","
          " \"before\": [\"%s\", \"%s\"], \"kept_before\": \"%s\", \"candidates\": %llu, \"untracked\": %llu}\n",
          tag, info[4], info[5], (unsigned long long) stopped, (unsigned long long) failed,
          busy_suspended, frida_suspended, busy1 == busy0 ? "true" : "false", frida1 > frida0 ? "true" : "false",
          busy2 > busy1 ? "true" : "false",
          (sleeper_sp <= g_sleeper_local_at && g_sleeper_local_at - sleeper_sp < (1 << 20)) ? "true" : "false",
          v_lost[0], v_lost[1], v_lost[2], v_lost[3], v_lost[4], v_kept, v_stack, v_signed, complete, v_lost_again,
          v_stack_again, (unsigned long long) job->n_threads, sleeper_suspended_after,
          mtmach_user_refs (g_sleeper_port), mtmach_user_refs (g_busy_port), mtmach_user_refs (g_frida_port),
          (unsigned long long) job->skip_stack, v_signed_unstripped, v_before0, v_before2, v_kept_before,
          (unsigned long long) n_candidates, (unsigned long long) n_untracked);
  g_stop_threads = 1;
  pthread_join (t_sleep, NULL);
  pthread_join (t_busy, NULL);
  pthread_join (t_frida, NULL);
  return 0;
}
