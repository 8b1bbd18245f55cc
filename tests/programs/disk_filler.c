/* disk_filler FILE: fills FILE's filesystem (64 KiB writes until ENOSPC), then makes 2000 x
 * malloc(16384) in after_fill, and exits 3: whatever its tracer writes after that finds the disk
 * full, while the target's death is still to be told. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink[2000];

__attribute__((noinline)) void after_fill(void) {
  for (int i = 0; i < 2000; i++) sink[i] = malloc(16384);
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) { perror("open"); return 2; }
  static char chunk[65536];
  memset(chunk, 'f', sizeof chunk);
  for (;;) {
    ssize_t n = write(fd, chunk, sizeof chunk);
    if (n < 0 && errno == ENOSPC) break;
    if (n < 0) { perror("write"); return 2; }
    if (n < (ssize_t) sizeof chunk) continue;     /* the last partial write: the next one says ENOSPC */
  }
  fprintf(stderr, "disk full\n");
  after_fill();
  exit(3);
}
