/* 4 threads x N malloc/free pairs (argv[1], default 1000000) of 64 bytes from thread_worker,
 * plus one 16384-byte malloc per thread (stacked, freed). */
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>

static long n_iter = 1000000;
static void *volatile sink;

__attribute__((noinline)) void *thread_worker(void *arg) {
  for (long i = 0; i < n_iter; i++) { void *p = malloc(64); sink = p; free(p); }
  void *big = malloc(16384); sink = big; free(big);
  return arg;
}

int main(int argc, char **argv) {
  if (argc > 1) n_iter = atol(argv[1]);
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, thread_worker, NULL);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  fprintf(stderr, "threads done\n");
  return 0;
}
