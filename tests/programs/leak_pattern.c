/* A known leak pattern for `memtrace malloc --leaks` (every block >= 4096 B, so all are tracked).
 *   leak_dropped     5 x malloc(5000), pointers dropped                       -> leaked
 *   leak_cycle       2 x malloc(6000) pointing at each other, both dropped    -> leaked (a cycle)
 *   keep_global      4 x malloc(7000) held from a global array                -> reachable
 *   keep_nested      malloc(8000) held from a global, and a malloc(9000) held
 *                    only from inside the first                               -> reachable (both)
 *   keep_on_stack    malloc(10000) held only by a local variable of a thread
 *                    that sleeps                                              -> reachable
 * argv[1]: seconds to sleep once all is set up (the window ends meanwhile); 0 = exit at once
 * (the scan then runs as the process exits).  argv[2] (optional): MB of untouched anonymous
 * memory to map first, a large root for the scan's time budget.  Prints "ready" when set up. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void *g_kept[4];
void **g_parent;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static int g_thread_ready;

__attribute__((noinline)) void leak_dropped(void) {
  for (int i = 0; i < 5; i++) {
    char *volatile p = malloc(5000);
    memset(p, 'd', 5000);
    p = NULL;
  }
}

__attribute__((noinline)) void leak_cycle(void) {
  void **volatile a = malloc(6000);
  void **volatile b = malloc(6000);
  memset(a, 0, 6000);
  memset(b, 0, 6000);
  a[0] = b;
  b[0] = a;
  a = NULL;
  b = NULL;
}

__attribute__((noinline)) void keep_global(void) {
  for (int i = 0; i < 4; i++) {
    g_kept[i] = malloc(7000);
    memset(g_kept[i], 'g', 7000);
  }
}

__attribute__((noinline)) void *keep_nested_child(void) {
  void *c = malloc(9000);
  memset(c, 'c', 9000);
  return c;
}

__attribute__((noinline)) void keep_nested(void) {
  void **parent = malloc(8000);
  memset(parent, 0, 8000);
  parent[0] = keep_nested_child();
  g_parent = parent;
}

__attribute__((noinline)) void *keep_on_stack(void *arg) {
  char *volatile mine = malloc(10000);
  memset(mine, 's', 10000);
  pthread_mutex_lock(&g_lock);
  g_thread_ready = 1;
  pthread_cond_signal(&g_cond);
  pthread_mutex_unlock(&g_lock);
  sleep(3600);
  return (void *)mine;
}

/* Overwrites the stack below main's frame, where the calls above left copies of their pointers. */
__attribute__((noinline)) void clobber_stack(void) {
  volatile char junk[65536];
  memset((char *)junk, 0, sizeof junk);
}

int main(int argc, char **argv) {
  double linger = argc > 1 ? atof(argv[1]) : 0;
  pthread_t t;
  if (argc > 2)
    (void)mmap(NULL, (size_t)atoi(argv[2]) << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  pthread_create(&t, NULL, keep_on_stack, NULL);
  pthread_mutex_lock(&g_lock);
  while (!g_thread_ready)
    pthread_cond_wait(&g_cond, &g_lock);
  pthread_mutex_unlock(&g_lock);
  leak_dropped();
  leak_cycle();
  keep_global();
  keep_nested();
  clobber_stack();
  printf("ready\n");
  fflush(stdout);
  if (linger > 0)
    usleep((useconds_t)(linger * 1e6));
  return 0;
}
