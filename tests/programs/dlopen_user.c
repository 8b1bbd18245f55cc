/* dlopen_user PLUGIN: dlopen's PLUGIN, runs its plugin_run through call_plugin, and unloads it
 * at once -- long before the agent's periodic module scan (1 s) would have seen it. */
#include <dlfcn.h>
#include <stdio.h>

__attribute__((noinline)) int call_plugin(const char *path) {
  void *h = dlopen(path, RTLD_NOW);
  if (h == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return -1;
  }
  int (*run)(void) = (int (*)(void)) dlsym(h, "plugin_run");
  int n = run ? run() : -1;
  dlclose(h);
  return n;
}

int main(int argc, char **argv) {
  int n = call_plugin(argc > 1 ? argv[1] : "./plugin.so");
  printf("plugin ran %d\n", n);
  return n == 3 ? 0 : 1;
}
