/* The few GLib names cmodule/leaks.c (and the generated layout header) use, for compiling the leak
 * scan's Darwin path outside a CModule, against the stand-in's Mach calls (standin_leaks.c). */
#ifndef MT_FAKE_GLIB_H
#define MT_FAKE_GLIB_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef int gint;
typedef unsigned int guint;
typedef int32_t gint32;
typedef uint32_t guint32;
typedef uint16_t guint16;
typedef uint8_t guint8;
typedef int64_t gint64;
typedef uint64_t guint64;
typedef char gchar;
typedef int gboolean;
typedef void * gpointer;
typedef size_t gsize;
typedef long gssize;
typedef long glong;
typedef unsigned long gulong;

#define TRUE 1
#define FALSE 0
#ifndef MIN
# define MIN(a, b) (((a) < (b)) ? (a) : (b))
#endif

static inline gint
g_atomic_int_add (volatile gint * p, gint v)
{
  return __atomic_fetch_add (p, v, __ATOMIC_SEQ_CST);
}

static inline gint64
g_get_monotonic_time (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (gint64) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

#endif
