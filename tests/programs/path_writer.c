/* Writes its PATH to argv[1] and makes 1000 blocks of 100 B (test_cmodule_gcc_cache.py: the PATH
 * the agent's compile changed is the program's own again by main). */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  static void *volatile keep[1000];
  const char *path = getenv("PATH");
  FILE *f = argc > 1 ? fopen(argv[1], "w") : NULL;
  if (f == NULL)
    return 2;
  fprintf(f, "%s\n", path ? path : "");
  fclose(f);
  for (int i = 0; i < 1000; i++)
    keep[i] = malloc(100);
  return 0;
}
