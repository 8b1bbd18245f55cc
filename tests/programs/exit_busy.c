/* Threads that allocate and free in a loop until main exits: exit() runs while they are inside
 * the allocator's hooks (tests/integration/test_exit_patches.py).  Prints "ready" once they run,
 * then exits when a line arrives on stdin. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void *churn(void *arg) {
  (void) arg;
  for (;;) {
    void *volatile p = malloc(64);
    free(p);
  }
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  char line[16];
  for (int i = 0; i < n; i++) {
    pthread_t t;
    pthread_create(&t, NULL, churn, NULL);
  }
  printf("ready\n");
  fflush(stdout);
  if (fgets(line, sizeof line, stdin) == NULL)
    return 1;
  exit(0);
}
