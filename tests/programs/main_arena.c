/* Which glibc arena the main thread's and a second thread's blocks come from, and how many pages
 * the main thread's heap grew by mprotect (a non-main arena's heap grows that way, a page at a time;
 * the main arena's grows by brk).  Prints "main_arena main=<main|other> thread=<main|other>".  Under
 * memtrace the answer must be the one the program gets without it: the thread that loaded the agent
 * made the process's first malloc call and took the main arena with it (cmodule/core.c,
 * mt_adopt_main_arena). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void *volatile sink[20000];

/* glibc keeps "not the main arena's" in bit 2 of the size word before a block. */
static const char *arena_of(void *p) {
  return (((size_t *)p)[-1] & 4) ? "other" : "main";
}

static void *second(void *arg) {
  (void)arg;
  void *p = malloc(64);
  const char *where = arena_of(p);
  free(p);
  return (void *)where;
}

int main(void) {
  void *p = malloc(64);
  const char *main_where = arena_of(p);
  /* Grow the heap: 20,000 blocks of 200 B held at once, then freed. */
  for (int i = 0; i < 20000; i++)
    sink[i] = malloc(200);
  for (int i = 0; i < 20000; i++)
    free(sink[i]);
  free(p);
  pthread_t t;
  void *thread_where = NULL;
  if (pthread_create(&t, NULL, second, NULL) != 0 || pthread_join(t, &thread_where) != 0)
    return 1;
  printf("main_arena main=%s thread=%s\n", main_where, (const char *)thread_where);
  return 0;
}
