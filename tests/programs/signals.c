/* Allocations made inside a signal handler, counted by the program itself.  The main thread storms
 * malloc(48)/free pairs (tier <= 256 B) while SIGPROF fires every 200 us of CPU time; each handler
 * run makes one calloc(1, 1000) (tier 257 B-1 KB) and frees it.  Prints
 * "main_pairs N handler_calls M" on stderr at the end (no stdio buffer: write(2)).
 *
 * glibc's malloc is not async-signal-safe in general: this stays safe because the storm only ever
 * touches its thread cache (the 48-byte bin, refilled before the timer starts), so the handler,
 * which goes to the arena, never interrupts the arena's own code.  argv[1]: pairs (default 20 M). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static void *volatile sink;
static volatile long handler_calls;

__attribute__((noinline)) void in_handler(void) {
  void *p = calloc(1, 1000);
  sink = p;
  free(p);
}

static void on_prof(int sig) {
  (void)sig;
  in_handler();
  handler_calls++;
}

__attribute__((noinline)) void storm_pair(void) {
  void *p = malloc(48);
  sink = p;
  free(p);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 20000000;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_prof;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGPROF, &sa, NULL);
  storm_pair();
  struct itimerval every = {{0, 200}, {0, 200}}, off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &every, NULL);
  for (long i = 0; i < n; i++) storm_pair();
  setitimer(ITIMER_PROF, &off, NULL);
  char line[96];
  int len = snprintf(line, sizeof line, "main_pairs %ld handler_calls %ld\n", n + 1, handler_calls);
  if (write(2, line, (size_t)len) < 0) return 1;
  return 0;
}
