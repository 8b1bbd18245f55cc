/* plugin.so, loaded by dlopen_user: plugin_run allocates 3 blocks of 7,777 B through
 * plugin_fill.  Built without frame pointers: only its unwind tables get a stack past it. */
#include <stdlib.h>
#include <string.h>

void *volatile plugin_sink[8];

__attribute__((noinline)) void *plugin_fill(int i) {
  void *p = malloc(7777);
  memset(p, i, 16);
  return p;
}

__attribute__((noinline)) int plugin_run(void) {
  for (int i = 0; i < 3; i++)
    plugin_sink[i] = plugin_fill(i);
  for (int i = 0; i < 3; i++)
    free(plugin_sink[i]);
  return 3;
}
