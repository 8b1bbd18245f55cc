/* Two threads taking turns, for the peak with several threads (memtrace keeps a thread's frees of
 * small blocks as its credit before they reach the shared total: cmodule/track.c,
 * mt_tracked_add_own).  keeper allocates 100 x 32 B in keeper_small and frees them (credit it may
 * hold), then spender allocates 1 MiB in spender_block (the peak) and frees it, then keeper keeps
 * 2 KiB from keeper_kept to the end (spending part of its credit), and both threads live on for
 * 300 ms (drains sample the total while keeper may hold credit).  No output until the end. */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static sem_t keeper_turn, spender_turn, done, finish;
static void *volatile sink;
static void *kept;

__attribute__((noinline)) static void *keeper_small(void) { return malloc(32); }
__attribute__((noinline)) static void *spender_block(void) { return malloc(1 << 20); }
__attribute__((noinline)) static void *keeper_kept(void) { return malloc(2048); }

static void *keeper(void *arg) {
  void *small[100];
  sem_wait(&keeper_turn);
  for (int i = 0; i < 100; i++) small[i] = keeper_small();
  for (int i = 0; i < 100; i++) free(small[i]);
  sem_post(&spender_turn);
  sem_wait(&keeper_turn);
  kept = keeper_kept();
  sem_post(&done);
  sem_wait(&finish);
  return arg;
}

static void *spender(void *arg) {
  sem_wait(&spender_turn);
  void *p = spender_block();
  sink = p;
  free(p);
  sem_post(&keeper_turn);
  sem_wait(&finish);
  return arg;
}

int main(void) {
  pthread_t a, b;
  sem_init(&keeper_turn, 0, 0);
  sem_init(&spender_turn, 0, 0);
  sem_init(&done, 0, 0);
  sem_init(&finish, 0, 0);
  pthread_create(&a, NULL, keeper, NULL);
  pthread_create(&b, NULL, spender, NULL);
  sem_post(&keeper_turn);
  sem_wait(&done);
  usleep(300000);
  sem_post(&finish);
  sem_post(&finish);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  fprintf(stderr, "kept %p\n", kept);
  return 0;
}
