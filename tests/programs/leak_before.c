/* Leaks made before memtrace attaches (--attach-delay, --pid) and after, for the leak scan's
 * allocator walk: blocks the live table never saw are found in glibc's heaps and sorted too.
 * Every size is 16k + 8 bytes, so a chunk's usable size (what the walk can tell) is exactly the
 * size asked for.
 *   before: pat_before_lost      500 x malloc(40), dropped               definitely lost
 *           pat_before_tree      malloc(56) holding 10 x malloc(40), dropped  1 definitely, 10 indirectly
 *           pat_before_kept      50 x malloc(24) on a global list        reachable
 *           pat_before_freed     300 x malloc(40), freed (tcache and fastbins keep some looking in use)
 *   after:  pat_after_lost       20 x malloc(104), dropped               definitely lost
 * argv[1]: seconds to wait before the "after" part; argv[2]: seconds to wait after it; argv[3]
 * "big": pat_before_big too.
 * Prints "before" and "after" as it gets there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct node {
  struct node *next;
  char pad[16];
};

struct node *volatile g_kept;
void *volatile g_sink;

__attribute__((noinline)) void link_to(void **from, void *to) {
  *(void *volatile *) from = to;
}

__attribute__((noinline)) void pat_before_lost(void) {
  for (int i = 0; i < 500; i++)
    g_sink = malloc(40);
  g_sink = NULL;
}

__attribute__((noinline)) void pat_before_tree(void) {
  void **root = malloc(56);
  memset(root, 0, 56);
  for (int i = 0; i < 5; i++)
    link_to(&root[i], malloc(40));
  for (int i = 0; i < 5; i++) {
    void **child = malloc(40);
    memset(child, 0, 40);
    link_to(&((void **) root[i])[0], child);
  }
}

__attribute__((noinline)) void pat_before_kept(void) {
  for (int i = 0; i < 50; i++) {
    struct node *n = malloc(sizeof(struct node));
    memset(n->pad, 'k', sizeof(n->pad));
    link_to((void **) &n->next, g_kept);
    g_kept = n;
  }
}

__attribute__((noinline)) void pat_before_freed(void) {
  void *p[300];
  for (int i = 0; i < 300; i++)
    p[i] = malloc(40);
  for (int i = 0; i < 300; i++)
    free(p[i]);
}

/* argv[3] "big": 2 x malloc(300000) dropped, 1 kept: chunks of their own mappings (glibc's mmap). */
void *volatile g_big;

__attribute__((noinline)) void pat_before_big(void) {
  for (int i = 0; i < 3; i++) {
    char *p = malloc(300000);
    memset(p, 'b', 300000);
    g_big = p;
  }
}

__attribute__((noinline)) void pat_after_lost(void) {
  for (int i = 0; i < 20; i++)
    g_sink = malloc(104);
  g_sink = NULL;
}

__attribute__((noinline)) static void scrub_stack(void) {
  volatile char pad[16384];
  memset((char *) pad, 0, sizeof(pad));
}

int main(int argc, char **argv) {
  pat_before_lost();
  pat_before_tree();
  pat_before_kept();
  pat_before_freed();
  if (argc > 3 && strcmp(argv[3], "big") == 0)
    pat_before_big();
  scrub_stack();
  printf("before\n");
  fflush(stdout);
  sleep(argc > 1 ? atoi(argv[1]) : 0);
  pat_after_lost();
  scrub_stack();
  printf("after\n");
  fflush(stdout);
  sleep(argc > 2 ? atoi(argv[2]) : 0);
  return 0;
}
