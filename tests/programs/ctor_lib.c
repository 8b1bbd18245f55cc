/* libctor_lib.so: its constructor allocates 12,345 B before main runs (ctor_user links it). */
#include <stdlib.h>

void *ctor_block;

__attribute__((constructor)) static void ctor_lib_init(void) { ctor_block = malloc(12345); }
