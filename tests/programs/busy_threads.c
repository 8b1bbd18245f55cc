/* N threads (argv[1], default 256) that allocate all the time, one block left unreferenced.
 *   churn (argv[2], the default): each thread makes 20 malloc/free pairs every 10 ms, from the
 *          start -- always some inside the allocator (and memtrace's hooks) when the world stops,
 *          at a load two CPUs carry;
 *   spin:  the threads sleep until SIGUSR1, then spin on the CPU with a malloc/free pair now and
 *          then.  Sleeping first lets an agent go in: Frida's injector gives its agent 5 s to
 *          answer, which hundreds of spinning threads on two CPUs outlast (it then unmaps its
 *          loader under the running loader thread: SIGSEGV, Frida's own, docs/domain/frida.md).
 * Prints "ready" once every thread is created, "spinning" (to stderr) once told to spin. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t go;
static int churn = 1;
static void *volatile sink;

static void on_usr1(int sig) { (void)sig; go = 1; }

__attribute__((noinline)) static void spin_alloc(unsigned long i) {
  void *p = malloc(64 + (i & 255));
  sink = p;
  free(p);
}

static void *spinner(void *a) {
  (void)a;
  if (churn)
    for (unsigned long i = 0;; i++) {
      for (int k = 0; k < 20; k++) spin_alloc(i + k);
      usleep(10000);
    }
  while (!go) usleep(20000);
  for (unsigned long i = 0;; i++)
    if ((i & 0x3fff) == 0) spin_alloc(i >> 14);
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 256;
  churn = !(argc > 2 && strcmp(argv[2], "spin") == 0);
  signal(SIGUSR1, on_usr1);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, 65536);
  for (int i = 0; i < n; i++) {
    pthread_t t;
    if (pthread_create(&t, &at, spinner, NULL)) { perror("pthread_create"); return 3; }
  }
  void *leak = malloc(4096);
  leak = NULL;
  (void)leak;
  printf("ready\n");
  fflush(stdout);
  while (!go) pause();
  fprintf(stderr, "spinning\n");
  for (;;) pause();
}
