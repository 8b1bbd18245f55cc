/* What the scan at exit may take for a root, against valgrind's verdicts: shared by the programs
 * that exit with these blocks (exit_stale.c, exit_threads.c).
 *   pat_stale_slot    malloc(9000), its only copies left in dead stack slots deeper than the caller's
 *                     frame (where exit's and Frida's frames run at exit) -> definitely lost
 *   pat_in_register   malloc(7000), for the caller to keep in a callee-saved register at its call to
 *                     exit (touch() twice keeps it there) -> still reachable: exit's frames save it */
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) void pat_stale_slot(void) {
  void *volatile slots[2048];
  void *p = malloc(9000);
  memset(p, 1, 9000);
  for (int i = 0; i < 2048; i++)
    slots[i] = p;
}

__attribute__((noinline)) char *pat_in_register(void) {
  char *p = malloc(7000);
  memset(p, 2, 7000);
  return p;
}

__attribute__((noinline)) void touch(char *p) {
  __asm__ volatile("" : : "r"(p) : "memory");
  p[0]++;
}
