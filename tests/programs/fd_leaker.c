/* fd_leaker DIR: a known pattern of descriptor creations and releases, then exits with some
 * still open.  Expected (see tests/integration/test_fds.py):
 *   open_config_files  open x30 (DIR/cfg-NN), close x10            -> 20 open
 *   make_socket_pairs  socketpair x5, every fd closed                -> 0
 *   make_pipes         pipe x3, the first pipe closed                -> 4
 *   dup_log            dup x2 of cfg-10, dup2(cfg-10 -> cfg-11)      -> 2 + 1, cfg-11 replaced
 *   write_with_stdio   fopen x10 (DIR/data-N), fclose x6             -> 4
 *   list_dir           opendir x3, closedir x3                       -> 0
 *   open_missing       open x7 of DIR/missing-N                      -> 7 failures (ENOENT)
 *   open_behind_libc   DIR/raw-secret through the raw openat syscall -> no hook sees it
 * Prints "done" and exits with 31 descriptors it opened still open (30 seen by hooks). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static int cfg[30];

NOINLINE void open_config_files(const char *dir) {
  char path[512];
  for (int i = 0; i < 30; i++) {
    snprintf(path, sizeof path, "%s/cfg-%02d", dir, i);
    cfg[i] = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
  }
  for (int i = 0; i < 10; i++) close(cfg[i]);
}

NOINLINE void make_socket_pairs(void) {
  for (int i = 0; i < 5; i++) {
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    close(sv[0]);
    close(sv[1]);
  }
}

NOINLINE void make_pipes(void) {
  int p[3][2];
  for (int i = 0; i < 3; i++) pipe(p[i]);
  close(p[0][0]);
  close(p[0][1]);
}

NOINLINE void dup_log(void) {
  dup(cfg[10]);
  dup(cfg[10]);
  dup2(cfg[10], cfg[11]);
}

NOINLINE void write_with_stdio(const char *dir) {
  FILE *f[10];
  char path[512];
  for (int i = 0; i < 10; i++) {
    snprintf(path, sizeof path, "%s/data-%d", dir, i);
    f[i] = fopen(path, "w");
  }
  for (int i = 0; i < 6; i++) fclose(f[i]);
}

NOINLINE void list_dir(const char *dir) {
  for (int i = 0; i < 3; i++) {
    DIR *d = opendir(dir);
    closedir(d);
  }
}

NOINLINE void open_missing(const char *dir) {
  char path[512];
  for (int i = 0; i < 7; i++) {
    snprintf(path, sizeof path, "%s/missing-%d", dir, i);
    open(path, O_RDONLY);
  }
}

NOINLINE void open_behind_libc(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/raw-secret", dir);
  syscall(SYS_openat, AT_FDCWD, path, O_CREAT | O_WRONLY, 0644);
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "/tmp";
  open_config_files(dir);
  make_socket_pairs();
  make_pipes();
  dup_log();
  write_with_stdio(dir);
  list_dir(dir);
  open_missing(dir);
  open_behind_libc(dir);
  printf("done\n");
  fflush(stdout);
  return 0;
}
