/* What the scan at exit may take for a root, against valgrind's verdicts (exit_patterns.h):
 *   pat_stale_slot    malloc(9000), its only copies left in dead stack slots deeper than main's
 *                     frame (where exit's and Frida's frames run at exit) -> definitely lost
 *   pat_in_register   malloc(7000), held in a callee-saved register of main at its call to exit
 *                     -> still reachable (exit's frames save that register)
 * then exit(0). */
#include "exit_patterns.h"

int main(void) {
  pat_stale_slot();
  char *p = pat_in_register();   /* kept in a callee-saved register across the calls below */
  touch(p);
  touch(p);
  exit(0);
}
