/* Leak patterns for the memtrace-vs-valgrind parity tests (tests/integration/test_leak_parity.py).
 * Every allocation is made under a function named pat_*, which is how both tools' stacks are
 * matched.  Blocks of every size: nothing here depends on a threshold.
 *
 *   pat_lose_small        1000 x malloc(48), pointers dropped                  definitely lost
 *   pat_lose_large        10 x malloc(8192), pointers dropped                   definitely lost
 *   pat_lose_map          a heap std::map<int, std::string *> of 1000 long
 *                         strings, its pointer dropped (3001 blocks: the map,
 *                         its nodes, the strings and their buffers)             1 definitely, 3000 indirectly
 *   pat_freed_index       100 x malloc(64) whose only pointers sat in an index
 *                         that was then freed                                   definitely lost
 *   pat_vector_shrank     a std::vector<int *> held from a global that grew to 1000 and
 *                         was shrunk to 500: the 500 popped blocks' pointers
 *                         are only in the freed buffers                         500 definitely lost; the
 *                                                                               vector's own buffer and
 *                                                                               500 blocks reachable
 *   pat_cycle             a 3-block cycle, dropped                              1 definitely, 2 indirectly
 *   pat_global_list       a 100-node list held from a global                    reachable (at the window's
 *                                                                               end; dropped before exit:
 *                                                                               leaked then)
 *   pat_thread_local      a thread's __thread pointer to a block; the thread
 *                         waits until exit                                     reachable
 *   pat_freed_elsewhere   200 blocks made on one thread, freed on another       none left
 *   pat_joined_threads    4 threads started and joined (glibc keeps their DTVs
 *                         in its stack cache)                                   nothing of ours
 *
 * argv[1]: seconds to wait at the checkpoint (memtrace's window ends meanwhile; under valgrind
 * a leak check runs there instead).  Then the list head is dropped and main returns.
 * Prints "ready" at the checkpoint. */
#include <map>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <unistd.h>
#include <valgrind/memcheck.h>
#include <vector>

#define NOINLINE __attribute__((noinline))

struct Node {
  Node *next;
  char payload[40];
};

Node *volatile g_list;
std::vector<int *> *volatile g_vector;   /* on the heap: no destructor runs at exit (see the tests) */
void *volatile g_sink;
__thread void *volatile t_block;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static int g_tls_ready;
static void *g_handoff[200];

/* Overwrites the dead frames below the caller, so no stale pointer survives there by chance. */
NOINLINE static void scrub_stack(void) {
  volatile char pad[16384];
  memset((char *) pad, 0, sizeof(pad));
}

NOINLINE void pat_lose_small(void) {
  for (int i = 0; i < 1000; i++) {
    char *volatile p = (char *) malloc(48);
    memset(p, 's', 48);
  }
}

NOINLINE void pat_lose_large(void) {
  for (int i = 0; i < 10; i++) {
    char *volatile p = (char *) malloc(8192);
    memset(p, 'l', 8192);
  }
}

NOINLINE void pat_lose_map(void) {
  std::map<int, std::string *> *volatile m = new std::map<int, std::string *>();
  for (int i = 0; i < 1000; i++)
    (*m)[i] = new std::string(std::string("a string long enough for the heap #") + std::to_string(i));
  m = NULL;
}

NOINLINE void pat_freed_index(void) {
  void **index = (void **) malloc(100 * sizeof(void *));
  for (int i = 0; i < 100; i++)
    index[i] = malloc(64);
  g_sink = index;
  free(index);
  g_sink = NULL;
}

NOINLINE void pat_vector_shrank(void) {
  std::vector<int *> *v = new std::vector<int *>();
  for (int i = 0; i < 1000; i++)
    v->push_back((int *) malloc(16));
  v->resize(500);
  v->shrink_to_fit();
  g_vector = v;
}

/* Out of line, so the compiler cannot drop the stores into blocks nobody reads back. */
NOINLINE void link_to(void **from, void *to) {
  *(void *volatile *) from = to;
}

NOINLINE void pat_cycle(void) {
  void **a = (void **) malloc(32);
  void **b = (void **) malloc(32);
  void **c = (void **) malloc(32);
  link_to(a, b);
  link_to(b, c);
  link_to(c, a);
}

NOINLINE void pat_global_list(void) {
  for (int i = 0; i < 100; i++) {
    Node *n = (Node *) malloc(sizeof(Node));
    memset(n->payload, 'n', sizeof(n->payload));
    link_to((void **) &n->next, g_list);
    g_list = n;
  }
}

NOINLINE void pat_thread_local_alloc(void) {
  t_block = malloc(1000);
  memset(t_block, 't', 1000);
}

static void *tls_thread(void *) {
  pat_thread_local_alloc();
  scrub_stack();
  pthread_mutex_lock(&g_lock);
  g_tls_ready = 1;
  pthread_cond_broadcast(&g_cond);
  pthread_mutex_unlock(&g_lock);
  for (;;)
    pause();
  return NULL;
}

NOINLINE void pat_freed_elsewhere_alloc(void) {
  for (int i = 0; i < 200; i++)
    g_handoff[i] = malloc(24 + i);
}

static void *freer_thread(void *) {
  for (int i = 0; i < 200; i++) {
    free(g_handoff[i]);
    g_handoff[i] = NULL;
  }
  return NULL;
}

static void *idle_thread(void *) {
  return NULL;
}

NOINLINE void pat_joined_threads(void) {
  for (int i = 0; i < 4; i++) {
    pthread_t t;
    pthread_create(&t, NULL, idle_thread, NULL);
    pthread_join(t, NULL);
  }
}

int main(int argc, char **argv) {
  int wait_s = argc > 1 ? atoi(argv[1]) : 0;
  pthread_t tls, freer;

  pat_lose_small();
  pat_lose_large();
  pat_lose_map();
  pat_freed_index();
  pat_vector_shrank();
  pat_cycle();
  pat_global_list();
  pthread_create(&tls, NULL, tls_thread, NULL);
  pthread_mutex_lock(&g_lock);
  while (!g_tls_ready)
    pthread_cond_wait(&g_cond, &g_lock);
  pthread_mutex_unlock(&g_lock);
  pat_freed_elsewhere_alloc();
  pthread_create(&freer, NULL, freer_thread, NULL);
  pthread_join(freer, NULL);
  pat_joined_threads();
  scrub_stack();

  /* The checkpoint: memtrace's window ends while we sleep; valgrind checks here. */
  if (RUNNING_ON_VALGRIND) {
    VALGRIND_DO_LEAK_CHECK;
  } else {
    printf("ready\n");
    fflush(stdout);
    sleep(wait_s);
  }

  g_list = NULL;     /* the list is lost as the program exits */
  scrub_stack();
  return 0;
}
