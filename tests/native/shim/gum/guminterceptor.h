/* Stand-in for Frida's gum/guminterceptor.h in the CModule runtime: the invocation-context calls
 * cmodule/ makes.  The harness drives the replacements directly (as Interceptor.replaceFast
 * does), so there is no current invocation: gum_interceptor_get_current_invocation returns NULL. */
#ifndef MT_SHIM_GUMINTERCEPTOR_H
#define MT_SHIM_GUMINTERCEPTOR_H

#include <glib.h>

typedef struct _GumInvocationContext GumInvocationContext;

GumInvocationContext * gum_interceptor_get_current_invocation (void);
gpointer gum_invocation_context_get_nth_argument (GumInvocationContext * context, guint n);
gpointer gum_invocation_context_get_return_value (GumInvocationContext * context);
gpointer gum_invocation_context_get_return_address (GumInvocationContext * context);
gpointer gum_invocation_context_get_listener_function_data (GumInvocationContext * context);
guint gum_invocation_context_get_depth (GumInvocationContext * context);

#endif
