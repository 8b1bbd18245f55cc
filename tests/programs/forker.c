/* Allocates in the parent, forks; the child allocates 100 x 8192 and exits; the parent waits,
 * then makes 50 x malloc(20000) from parent_after_fork and exits 0 if the child exited 0. */
#include <stdlib.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile sink[200];

__attribute__((noinline)) void child_work(void) {
  for (int i = 0; i < 100; i++) { sink[i] = malloc(8192); free(sink[i]); }
}
__attribute__((noinline)) void parent_after_fork(void) {
  for (int i = 0; i < 50; i++) sink[i] = malloc(20000);
}

int main(void) {
  for (int i = 0; i < 10; i++) sink[i] = malloc(10000);
  pid_t pid = fork();
  if (pid == 0) { child_work(); _exit(0); }
  int status = 0;
  waitpid(pid, &status, 0);
  parent_after_fork();
  fprintf(stderr, "child status %d\n", status);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 3;
}
