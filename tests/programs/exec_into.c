/* exec_into PROGRAM ARGS...: makes 40 x malloc(12288) in before_exec, prints
 * "exec_into <pid>", then execs PROGRAM ARGS (same pid).  Exits 127 if the exec fails. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *volatile sink;

__attribute__((noinline)) void before_exec(void) {
  for (int i = 0; i < 40; i++) { void *p = malloc(12288); sink = p; free(p); }
}

int main(int argc, char **argv) {
  before_exec();
  printf("exec_into %d\n", (int)getpid());
  fflush(stdout);
  if (argc > 1) execv(argv[1], argv + 1);
  perror("execv");
  return 127;
}
