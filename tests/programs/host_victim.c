/* host_victim STOP_FILE RESULT_FILE: prints "ready <pid>", then until STOP_FILE exists (60 s at
 * most) creates a thread every 5 ms that fills a malloc'd block, checks it and frees it (threads
 * exit: their thread-specific data destructors run), while main does the same.  Writes
 * "ok <threads> <checks>" to RESULT_FILE and exits 0 when every check held; "bad ..." and exit 1
 * otherwise.  SIGPIPE is ignored: its output may have no reader once memtrace is gone. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile long checks, bad;

__attribute__((noinline)) static void fill_and_check(size_t size, int seed) {
  unsigned char *p = malloc(size);
  if (p == NULL) { bad++; return; }
  memset(p, seed & 0xff, size);
  for (size_t i = 0; i < size; i += 97) if (p[i] != (seed & 0xff)) bad++;
  free(p);
  __atomic_add_fetch(&checks, 1, __ATOMIC_RELAXED);
}

static void *victim_thread(void *arg) {
  fill_and_check(20000, (int)(long)arg);
  return arg;
}

int main(int argc, char **argv) {
  const char *stop = argc > 1 ? argv[1] : "/nonexistent";
  const char *result = argc > 2 ? argv[2] : "/dev/null";
  signal(SIGPIPE, SIG_IGN);
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long threads = 0;
  do {
    pthread_t t;
    if (pthread_create(&t, NULL, victim_thread, (void *)threads) == 0) { pthread_join(t, NULL); threads++; }
    fill_and_check(5000, (int)threads);
    usleep(5000);
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while (access(stop, F_OK) != 0 && (now.tv_sec - t0.tv_sec) < 60);
  FILE *f = fopen(result, "w");
  if (f == NULL) return 2;
  fprintf(f, "%s %ld %ld\n", bad == 0 ? "ok" : "bad", threads, checks);
  fclose(f);
  return bad == 0 ? 0 : 1;
}
