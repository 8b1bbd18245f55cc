/* spawner PROGRAM ARGS...: makes 30 x malloc(12288) in before_spawn, runs PROGRAM ARGS with
 * posix_spawn (glibc: clone(CLONE_VM | CLONE_VFORK), then execve in the child), waits for it
 * and exits with its exit status. */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static void *volatile sink;

__attribute__((noinline)) void before_spawn(void) {
  for (int i = 0; i < 30; i++) { void *p = malloc(12288); sink = p; free(p); }
}

int main(int argc, char **argv) {
  before_spawn();
  if (argc < 2) return 2;
  pid_t pid;
  if (posix_spawn(&pid, argv[1], NULL, NULL, argv + 1, environ) != 0) { perror("posix_spawn"); return 127; }
  int status = 0;
  waitpid(pid, &status, 0);
  printf("spawned %d status %d\n", (int)pid, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  fflush(stdout);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
