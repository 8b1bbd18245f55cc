/* N threads (default 1100: past glibc's 1024 keys and the old 1024-thread listing) that only
 * sleep, and one block left unreferenced.  Prints "ready" once all are running. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void *sleeper(void *a) { (void)a; for (;;) pause(); return NULL; }
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 1100;
  pthread_attr_t at; pthread_attr_init(&at); pthread_attr_setstacksize(&at, 65536);
  for (int i = 0; i < n; i++) { pthread_t t; if (pthread_create(&t, &at, sleeper, NULL)) { perror("pthread_create"); return 3; } }
  void *leak = malloc(4096); leak = NULL; (void)leak;
  printf("ready\n"); fflush(stdout);
  for (;;) pause();
}
