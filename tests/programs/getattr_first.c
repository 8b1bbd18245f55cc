/* Threads whose very first call into the allocator comes from inside pthread_getattr_np, as a
 * Rust thread's stack guard or Frida's own injected loader thread do: glibc holds the thread's
 * own lock while it reallocs there.  Usage: getattr_first THREADS.  Each thread then makes 100
 * mallocs of 3000 B (freed); prints "getattr_first ok <threads>". */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void *volatile sink;

__attribute__((noinline)) static void after_getattr(void) {
  for (int i = 0; i < 100; i++) {
    void *p = malloc(3000);
    sink = p;
    free(p);
  }
}

static void *worker(void *arg) {
  (void)arg;
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0)
    return (void *)1;
  pthread_attr_destroy(&attr);
  after_getattr();
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 8;
  for (int i = 0; i < n; i++) {
    pthread_t t;
    void *r = NULL;
    if (pthread_create(&t, NULL, worker, NULL) != 0 || pthread_join(t, &r) != 0 || r != NULL) {
      printf("getattr_first failed at %d\n", i);
      return 1;
    }
  }
  printf("getattr_first ok %d\n", n);
  return 0;
}
