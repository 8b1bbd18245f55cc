/* The stack walk alone, for bench/unwind_bench.py: cmodule/unwind.c's walk (frame pointers and
 * unwind tables) against the frame-pointer loop core.c runs without tables, timed in one
 * process over the same stacks.  Built with the generated layout header; the registry is filled
 * from /proc/self/maps with the tables the bench wrote (DIR/<module>.rows, DIR/<module>.index;
 * a module with neither keeps frame pointers).
 *
 *   unwind_walk DIR N   prints, per stack shape, "shape frames_fp frames_tables ns_fp ns_tables ns_cached"
 *   (ns_cached: the table walk with its frame cache, the same stack again; checked equal to the full walk)
 *
 * Shapes: direct (our frame-pointer code down to main), deep (20 frame-pointer frames more),
 * libc (the walking function is qsort's comparator: the first frame is glibc's, as strdup's is). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRUE 1
#define FALSE 0
#define MT_LINUX 1
volatile guint64 mt_unwind_count;
MtUnwindModule mt_unwind_modules[MT_MAX_UNWIND_MODULES];
guint8 mt_frame_caches[1];
volatile guint64 mt_frame_cache_on;
#include "unwind.c"

/* core.c's mt_walk loop, as it runs when the agent has no tables. */
static guint
fp_walk (guint64 fp, guint64 lo, guint64 hi, guint64 * out, guint max, gboolean * truncated)
{
  guint n = 0;
  *truncated = FALSE;
  while (fp >= lo && fp + 16 <= hi && (fp & 7) == 0)
  {
    guint64 next = ((guint64 *) fp)[0];
    guint64 ret = ((guint64 *) fp)[1];
    if (ret < 4096)
      break;
    if (n == max)
    {
      *truncated = TRUE;
      break;
    }
    out[n++] = ret;
    if (next <= fp)
      break;
    fp = next;
  }
  return n;
}

static const char * g_shape;
static long g_n;
static guint64 g_hi;

static double
now_ns (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Stands where the agent's malloc replacement stands: its own frame is fp0. */
__attribute__((noinline)) static void
measure (void)
{
  static MtFrameCache fc;
  static MtUnwindCache rules;
  guint64 frames[28], cached[28], fp0 = (guint64) __builtin_frame_address (0), lo = (guint64) &frames[0];
  gboolean truncated, truncated_c;
  guint nf = 0, nt = 0, nc = 0, full, got;
  double a, b, c, d;
  long i;
  a = now_ns ();
  for (i = 0; i < g_n; i++)
    nf += fp_walk (fp0, lo, g_hi, frames, 28, &truncated);
  b = now_ns ();
  for (i = 0; i < g_n; i++)
    nt += mt_unwind_walk (fp0, lo, g_hi, frames, 28, &truncated, &rules, NULL);
  c = now_ns ();
  for (i = 0; i < g_n; i++)
    nc += mt_unwind_walk (fp0, lo, g_hi, cached, 28, &truncated_c, &rules, &fc);
  d = now_ns ();
  /* The cached walk must give the full walk's stack exactly. */
  full = mt_unwind_walk (fp0, lo, g_hi, frames, 28, &truncated, &rules, NULL);
  got = mt_unwind_walk (fp0, lo, g_hi, cached, 28, &truncated_c, &rules, &fc);
  if (got != full || truncated != truncated_c || memcmp (frames, cached, full * 8) != 0)
  {
    fprintf (stderr, "%s: the frame cache's walk differs from the full walk\n", g_shape);
    exit (1);
  }
  printf ("%s %u %u %.2f %.2f %.2f\n", g_shape, nf / (guint) g_n, nt / (guint) g_n, (b - a) / g_n, (c - b) / g_n,
      (d - c) / g_n);
}

static int
by_value (const void * x, const void * y)
{
  static int done;
  if (!done)
  {
    done = 1;
    measure ();
  }
  return *(const int *) x - *(const int *) y;
}

__attribute__((noinline)) static void
nested (int depth)
{
  if (depth == 0)
    measure ();
  else
    nested (depth - 1);
  __asm__ volatile ("" ::: "memory");
}

static void
load_registry (const char * dir)
{
  FILE * maps = fopen ("/proc/self/maps", "r");
  char line[4096], last[4096] = "";
  guint64 lo, hi;
  while (fgets (line, sizeof line, maps) != NULL)
  {
    char * path = strchr (line, '/');
    if (path == NULL || sscanf (line, "%llx-%llx", &lo, &hi) != 2)
      continue;
    path[strcspn (path, "\n")] = 0;
    if (strcmp (path, last) == 0)
    {
      mt_unwind_modules[mt_unwind_count - 1].end = hi;
      continue;
    }
    strcpy (last, path);
    MtUnwindModule * m = &mt_unwind_modules[mt_unwind_count++];
    m->start = lo;
    m->end = hi;
    char file[8192];
    const char * base = strrchr (path, '/') + 1;
    snprintf (file, sizeof file, "%s/%s.rows", dir, base);
    FILE * f = fopen (file, "rb");
    if (f == NULL)
      continue;
    static char store[1 << 24];
    static size_t used;
    size_t nr = fread (store + used, 1, sizeof store - used, f);
    fclose (f);
    m->rows = (guint64) (store + used);
    m->n_rows = nr / sizeof (MtUnwindRow);
    used += (nr + 7) & ~7UL;
    snprintf (file, sizeof file, "%s/%s.index", dir, base);
    f = fopen (file, "rb");
    size_t ni = fread (store + used, 1, sizeof store - used, f);
    fclose (f);
    m->index = (guint64) (store + used);
    m->n_index = ni / 4;
    used += (ni + 7) & ~7UL;
  }
  fclose (maps);
}

int
main (int argc, char ** argv)
{
  pthread_attr_t attr;
  void * addr;
  size_t size;
  int v[2] = { 2, 1 };
  pthread_getattr_np (pthread_self (), &attr);
  pthread_attr_getstack (&attr, &addr, &size);
  g_hi = (guint64) addr + size;
  load_registry (argv[1]);
  g_n = atol (argv[2]);
  g_shape = "direct";
  measure ();
  g_shape = "deep";
  nested (20);
  g_shape = "libc";
  qsort (v, 2, sizeof v[0], by_value);
  return 0;
}
