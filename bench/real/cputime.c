/* LD_PRELOAD'ed into every run of bench_real.py: prints the process's CPU time (and wall time)
 * from this library's constructor to its destructor, with the process's name, so that the
 * target's own cost is told apart from memtrace's host or heaptrack's interpreter (which get the
 * library too, and print under their own names). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct timespec cpu0, wall0;

static double since(const struct timespec *a, const struct timespec *b) {
  return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) * 1e-9;
}

__attribute__((constructor)) static void bench_start(void) {
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
  clock_gettime(CLOCK_MONOTONIC, &wall0);
}

__attribute__((destructor)) static void bench_stop(void) {
  struct timespec cpu1, wall1;
  char comm[64] = "?", line[200];
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
  clock_gettime(CLOCK_MONOTONIC, &wall1);
  int fd = open("/proc/self/comm", O_RDONLY);
  if (fd >= 0) {
    ssize_t n = read(fd, comm, sizeof comm - 1);
    comm[n > 0 ? n : 0] = 0;
    comm[strcspn(comm, "\n")] = 0;
    close(fd);
  }
  /* then the pid and the monotonic clock at the end (end_bench.py: from the target's end to the
   * command's return) */
  int n = snprintf(line, sizeof line, "\nbench_cpu %s %.4f %.4f %d %ld.%09ld\n", comm, since(&cpu0, &cpu1),
                   since(&wall0, &wall1), (int)getpid(), (long)wall1.tv_sec, wall1.tv_nsec);
  if (n > 0) write(2, line, (size_t)n);
}
