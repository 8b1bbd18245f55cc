/* What a fork child inherits of its parent's heap (every block >= 4096 B):
 *   parent_lose   2 x malloc(5000), pointers dropped before the fork  -> lost, in the parent and the child
 *   parent_keep   1 x malloc(6000) held from a global                 -> reachable in both
 * The child exits at once (its scan runs as it exits); the parent waits for it and exits 0 if the
 * child exited 0.  valgrind --trace-children=yes says 2 blocks (10,000 B) definitely lost in each.
 * With an argument, the child first loses 1 x malloc(7000) (child_lose) and forks a grandchild of
 * its own, which exits at once: 3 blocks (17,000 B) lost in the child and in the grandchild. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void *g_kept;

__attribute__((noinline)) void parent_lose(void) {
  for (int i = 0; i < 2; i++) {
    char *volatile p = malloc(5000);
    memset(p, 'p', 5000);
    p = NULL;
  }
}

__attribute__((noinline)) void parent_keep(void) {
  g_kept = malloc(6000);
  memset(g_kept, 'k', 6000);
}

/* The dropped pointers' dead stack slots cleared (as fork_leaker.c does): the verdict is the
 * program's pointers' alone. */
__attribute__((noinline)) void clear_dead_stack(void) {
  char pad[32768];
  explicit_bzero(pad, sizeof pad);
}

__attribute__((noinline)) void child_lose(void) {
  char *volatile p = malloc(7000);
  memset(p, 'c', 7000);
  p = NULL;
}

/* Forks; the child runs `in_child` (when not NULL) and exits 0.  Returns 0 if the child exited 0. */
static int fork_and_wait(void (*in_child)(void)) {
  pid_t pid = fork();
  if (pid == 0) {
    if (in_child != NULL)
      in_child();
    exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  fprintf(stderr, "child %d status %d\n", (int)pid, status);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 3;
}

static void lose_and_fork(void) {
  child_lose();
  clear_dead_stack();
  if (fork_and_wait(NULL) != 0)
    exit(3);
}

int main(int argc, char **argv) {
  (void)argv;
  parent_lose();
  parent_keep();
  clear_dead_stack();
  return fork_and_wait(argc > 1 ? lose_and_fork : NULL);
}
