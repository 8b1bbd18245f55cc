/* Stress target for hooks going in and out (tests/stress/hook_storm.py): T threads calling, in a
 * tight loop and forever, the functions a tracer hooks.  Usage: hook_storm KIND [threads].
 *   malloc   malloc / free / calloc / realloc / posix_memalign (the malloc tracer's entries)
 *   fds      open / close / dup / pipe / socket / fopen / fclose (the fds tracer's)
 *   threads  pthread_create / pthread_join (the threads tracer's)
 * Prints "ready" once every thread runs; a death (signal) is the failure the storm looks for. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void *volatile sink;
static volatile int started;

static void *nothing(void *arg) { return arg; }

static void *malloc_loop(void *arg) {
  unsigned long i = (unsigned long)arg;
  __sync_fetch_and_add(&started, 1);
  for (;;) {
    void *p = malloc(16 + (i++ % 512));
    sink = p;
    p = realloc(p, 64 + (i % 4096));
    sink = p;
    free(p);
    p = calloc(4, 32);
    sink = p;
    free(p);
    if (posix_memalign(&p, 64, 128) == 0) free(p);
  }
  return NULL;
}

static void *fds_loop(void *arg) {
  (void)arg;
  __sync_fetch_and_add(&started, 1);
  for (;;) {
    int fd = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
      int d = dup(fd);
      if (d >= 0) close(d);
      close(fd);
    }
    int p[2];
    if (pipe(p) == 0) { close(p[0]); close(p[1]); }
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s >= 0) close(s);
    FILE *f = fopen("/dev/null", "r");
    if (f != NULL) fclose(f);
  }
  return NULL;
}

static void *threads_loop(void *arg) {
  (void)arg;
  __sync_fetch_and_add(&started, 1);
  for (;;) {
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) == 0) pthread_join(t, NULL);
  }
  return NULL;
}

int main(int argc, char **argv) {
  const char *kind = argc > 1 ? argv[1] : "malloc";
  int n = argc > 2 ? atoi(argv[2]) : 4;
  void *(*loop)(void *) = strcmp(kind, "fds") == 0 ? fds_loop
      : strcmp(kind, "threads") == 0 ? threads_loop : malloc_loop;
  if (n < 1 || n > 64) return 2;
  for (long i = 0; i < n; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, loop, (void *)i) != 0) return 3;
  }
  while (started < n) usleep(1000);
  printf("ready\n");
  fflush(stdout);
  for (;;) pause();
}
