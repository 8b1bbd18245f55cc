/* ctor_user: links libctor_lib.so, whose constructor allocates 12,345 B before main. */
#include <stdio.h>

extern void *ctor_block;

int main(void) {
  printf("ctor block %s\n", ctor_block ? "allocated" : "missing");
  return 0;
}
