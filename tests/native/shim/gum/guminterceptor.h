/* Stand-in for Frida's gum/guminterceptor.h in the CModule runtime: the invocation-context calls
 * cmodule/ makes.  The harness drives the replacements directly (as Interceptor.replaceFast
 * does), so there is no current invocation: gum_interceptor_get_current_invocation returns NULL. */
#ifndef MT_SHIM_GUMINTERCEPTOR_H
#define MT_SHIM_GUMINTERCEPTOR_H

#include <glib.h>

typedef struct _GumInvocationContext GumInvocationContext;
typedef struct _GumCpuContext GumCpuContext;

/* Frida's layouts (gumdefs.h, guminterceptor.h): track.c's slow-hooked walk reads the registers
 * a hooked entry was called with (never reached here: there is no current invocation). */
struct _GumCpuContext
{
#if defined(__x86_64__)
  guint64 rip, r15, r14, r13, r12, r11, r10, r9, r8, rdi, rsi, rbp, rsp, rbx, rdx, rcx, rax;
#elif defined(__aarch64__)
  guint64 pc, sp, nzcv, x[29], fp, lr;
#endif
};

struct _GumInvocationContext
{
  gpointer function;
  GumCpuContext * cpu_context;
  gint system_error;
  gpointer backend;
};

GumInvocationContext * gum_interceptor_get_current_invocation (void);
gpointer gum_invocation_context_get_nth_argument (GumInvocationContext * context, guint n);
gpointer gum_invocation_context_get_return_value (GumInvocationContext * context);
gpointer gum_invocation_context_get_return_address (GumInvocationContext * context);
gpointer gum_invocation_context_get_listener_function_data (GumInvocationContext * context);
guint gum_invocation_context_get_depth (GumInvocationContext * context);

#endif
