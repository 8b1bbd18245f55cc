/* Stand-in for Frida's gum/gummemory.h in the CModule runtime (cmodule/process.c). */
#ifndef MT_SHIM_GUMMEMORY_H
#define MT_SHIM_GUMMEMORY_H

#include <glib.h>

void gum_clear_cache (gpointer address, gsize size);

#endif
