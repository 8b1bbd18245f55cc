/* A stand-in for the glib.h Frida's CModule runtime gives C code (frida-gum
 * bindings/gumjs/runtime/cmodule/glib.h): the same type names and the few functions memtrace's
 * cmodule/ uses, so that the sources compile natively, unchanged, under the sanitizers.  The
 * functions are implemented in harness.c with what glib does (sequentially consistent atomics). */
#ifndef MT_SHIM_GLIB_H
#define MT_SHIM_GLIB_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifndef FALSE
#define FALSE 0
#endif
#ifndef TRUE
#define TRUE 1
#endif
#undef MAX
#define MAX(a, b) (((a) > (b)) ? (a) : (b))
#undef MIN
#define MIN(a, b) (((a) < (b)) ? (a) : (b))
#define G_N_ELEMENTS(arr) (sizeof (arr) / sizeof ((arr)[0]))

typedef char gchar;
typedef short gshort;
typedef long glong;
typedef int gint;
typedef gint gboolean;
typedef unsigned char guchar;
typedef unsigned short gushort;
typedef unsigned long gulong;
typedef unsigned int guint;
typedef float gfloat;
typedef double gdouble;
typedef void * gpointer;
typedef const void * gconstpointer;
typedef int8_t gint8;
typedef uint8_t guint8;
typedef int16_t gint16;
typedef uint16_t guint16;
typedef int32_t gint32;
typedef uint32_t guint32;
typedef int64_t gint64;
typedef uint64_t guint64;
typedef ssize_t gssize;
typedef size_t gsize;

gint g_atomic_int_add (volatile gint * atomic, gint val);
gssize g_atomic_pointer_add (volatile void * atomic, gssize val);
gint64 g_get_monotonic_time (void);

#endif
