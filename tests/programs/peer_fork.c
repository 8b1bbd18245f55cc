/* peer_fork CASE: fork cases of a memory profiler's test programs.
 *   threads   3 threads allocate 1,000 x 512 B each (thread_work) while main forks; the child
 *             makes 2 x malloc(5555) in child_work and exits; the parent waits for it
 *   exec      fork; the child makes malloc(6000) in before_exec, then execs this program with
 *             "leaf", which makes 2 x malloc(6666) in leaf_work
 *   leaf      (the exec'd image)
 *   spawns    3 x posix_spawn of this program with "leaf", one after another
 *   tree      fork; the child forks a grandchild that makes malloc(7070) in grandchild_work
 *   chain [LEAF]  posix_spawn of this program with "mid [LEAF]", which makes malloc(7272) in mid_work
 *             and posix_spawns LEAF (default: this program) with "leaf": a child and a grandchild
 *             by posix_spawn, each living about a millisecond */
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static void *volatile sink[16];

__attribute__((noinline)) void *thread_work(void *arg) {
  for (int i = 0; i < 1000; i++) { void *p = malloc(512); sink[0] = p; free(p); }
  return arg;
}
__attribute__((noinline)) void child_work(void) {
  for (int i = 0; i < 2; i++) sink[1 + i] = malloc(5555);
}
__attribute__((noinline)) void before_exec(void) { sink[3] = malloc(6000); }
__attribute__((noinline)) void leaf_work(void) {
  for (int i = 0; i < 2; i++) sink[4 + i] = malloc(6666);
}
__attribute__((noinline)) void grandchild_work(void) { sink[6] = malloc(7070); }
__attribute__((noinline)) void mid_work(void) { sink[7] = malloc(7272); }



static int wait_for(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

static int spawn_wait(const char *path, char **args) {
  pid_t pid;
  if (posix_spawn(&pid, path, NULL, NULL, args, environ) != 0) return 127;
  return wait_for(pid);
}

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "";
  if (!strcmp(c, "leaf")) {
    leaf_work();
    return 0;
  }
  if (!strcmp(c, "threads")) {
    pthread_t t[3];
    for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, thread_work, NULL);
    pid_t pid = fork();
    if (pid == 0) { child_work(); _exit(0); }
    int st = wait_for(pid);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    printf("threads child %d\n", st);
    return st;
  }
  if (!strcmp(c, "exec")) {
    pid_t pid = fork();
    if (pid == 0) {
      before_exec();
      char *args[] = {argv[0], "leaf", NULL};
      execv("/proc/self/exe", args);
      _exit(127);
    }
    int st = wait_for(pid);
    printf("exec child %d\n", st);
    return st;
  }
  if (!strcmp(c, "spawns")) {
    int bad = 0;
    for (int i = 0; i < 3; i++) {
      pid_t pid;
      char *args[] = {argv[0], "leaf", NULL};
      if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, args, environ) != 0) return 127;
      bad += wait_for(pid) != 0;
    }
    printf("spawns %d\n", bad);
    return bad;
  }
  if (!strcmp(c, "tree")) {
    pid_t pid = fork();
    if (pid == 0) {
      pid_t g = fork();
      if (g == 0) { grandchild_work(); _exit(0); }
      _exit(wait_for(g));
    }
    int st = wait_for(pid);
    printf("tree %d\n", st);
    return st;
  }
  if (!strcmp(c, "chain")) {
    char *args[] = {argv[0], "mid", argc > 2 ? argv[2] : NULL, NULL};
    int st = spawn_wait("/proc/self/exe", args);
    printf("chain %d\n", st);
    return st;
  }
  if (!strcmp(c, "mid")) {
    mid_work();
    char *args[] = {argc > 2 ? argv[2] : argv[0], "leaf", NULL};
    return spawn_wait(argc > 2 ? argv[2] : "/proc/self/exe", args);
  }
  return 2;
}
