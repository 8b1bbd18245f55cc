/* Solo mode's end (cmodule/core.c, mt_solo_joined): the main thread allocates alone, then three
 * threads start and all four allocate and free at once, each call from a function of its own.
 * Deterministic counts:
 *   main_alone     20,000 malloc(48), 10,000 of them freed before the threads start, 10,000 kept
 *   main_churn     50,000 malloc(64)/free pairs while the threads run
 *   thread_churn   3 x 50,000 malloc(80)/free pairs, and 3 x 1,000 malloc(96) kept
 * Live at the end: 10,000 x 48 + 3,000 x 96 bytes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline))

static void *kept_main[20000];
static void *kept_thread[3][1000];

NOINLINE static void main_alone(void) {
  for (int i = 0; i < 20000; i++)
    kept_main[i] = malloc(48);
  for (int i = 0; i < 20000; i += 2)
    free(kept_main[i]);
}

NOINLINE static void main_churn(void) {
  for (int i = 0; i < 50000; i++) {
    void *p = malloc(64);
    __asm__ volatile("" : : "r"(p) : "memory");
    free(p);
  }
}

NOINLINE static void thread_churn(int t) {
  for (int i = 0; i < 50000; i++) {
    void *p = malloc(80);
    __asm__ volatile("" : : "r"(p) : "memory");
    free(p);
    if (i % 50 == 0)
      kept_thread[t][i / 50] = malloc(96);
  }
}

static void *run(void *arg) {
  thread_churn((int)(long)arg);
  return NULL;
}

int main(void) {
  pthread_t th[3];
  main_alone();
  for (long t = 0; t < 3; t++)
    pthread_create(&th[t], NULL, run, (void *)t);
  main_churn();
  for (int t = 0; t < 3; t++)
    pthread_join(th[t], NULL);
  printf("done %p %p\n", kept_main[1], kept_thread[2][999]);
  return 0;
}
