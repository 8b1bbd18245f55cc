/* A known peak and live set, for the aggregate core's exact figures.  With the default thresholds
 * (blocks >= 4096 tracked, >= 8192 stacked):
 *   keep_early:  4 x malloc(1 MiB), kept to the end
 *   burst:       64 x malloc(1 MiB), all freed straight away (well within a millisecond of the
 *                first): the peak, 68 MiB in 68 blocks, 64 of them burst's and 4 keep_early's
 *   keep_late:   2 x malloc(256 KiB), kept to the end
 *   small_burst: 16 x malloc(1 MiB), freed (below the peak)
 * Live at the end: keep_early's 4 MiB and keep_late's 512 KiB, 6 blocks.  Nothing goes through stdio
 * (its buffer would be one more tracked block).  argv[1]: milliseconds to sleep between phases. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024 * 1024)
static void *volatile early[4], *volatile late[2];

static void pause_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

__attribute__((noinline)) void keep_early(void) { for (int i = 0; i < 4; i++) early[i] = malloc(MIB); }
__attribute__((noinline)) void *burst_block(void) { return malloc(MIB); }
__attribute__((noinline)) void burst(int n) {
  void *blocks[64];
  for (int i = 0; i < n; i++) blocks[i] = burst_block();
  for (int i = 0; i < n; i++) free(blocks[i]);
}
__attribute__((noinline)) void keep_late(void) { for (int i = 0; i < 2; i++) late[i] = malloc(256 * 1024); }
__attribute__((noinline)) void small_burst(void) {
  void *blocks[16];
  for (int i = 0; i < 16; i++) blocks[i] = malloc(MIB);
  for (int i = 0; i < 16; i++) free(blocks[i]);
}

int main(int argc, char **argv) {
  long ms = argc > 1 ? atol(argv[1]) : 0;
  keep_early();
  pause_ms(ms);
  burst(64);
  pause_ms(ms);
  keep_late();
  small_burst();
  pause_ms(ms);
  const char done[] = "burst done\n";
  if (write(2, done, strlen(done)) < 0) return 1;
  return 0;
}
