/* A running program whose threads use their environment all the time (test_environ_untouched.py):
 * one reads PATH in a loop and counts every value that is not the one it started with, another
 * sets MT_CHURN to one of ten values in a loop and reads it back.  Prints "ready" once both run;
 * each line read on stdin is answered with what they saw so far; end of input ends it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A pause between turns: each thread still looks ~10,000 times a second (the compile it must
 * not see lasts 10-250 ms), without holding a CPU of a loaded machine. */
static void pause_briefly(void) {
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
}

static const char *start_path;
static atomic_long path_reads, path_changes, churn_sets, churn_wrong;
static atomic_int running = 1;

/* One turn of a thread: `name` read back as `want` or counted wrong; then a pause. */
static void check(const char *name, const char *want, atomic_long *turns, atomic_long *wrong) {
  const char *got = getenv(name);
  if (got == NULL || strcmp(got, want) != 0)
    atomic_fetch_add(wrong, 1);
  atomic_fetch_add(turns, 1);
  pause_briefly();
}

static void *read_path(void *arg) {
  (void)arg;
  while (atomic_load(&running))
    check("PATH", start_path, &path_reads, &path_changes);
  return NULL;
}

static void *churn(void *arg) {
  static const char *values[] = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  (void)arg;
  /* Only this thread writes MT_CHURN, so it reads back what it set unless someone else wrote. */
  for (long i = 0; atomic_load(&running); i++) {
    setenv("MT_CHURN", values[i % 10], 1);
    check("MT_CHURN", values[i % 10], &churn_sets, &churn_wrong);
  }
  return NULL;
}

int main(void) {
  pthread_t reader, writer;
  char line[64];
  start_path = strdup(getenv("PATH") ? getenv("PATH") : "");
  setenv("MT_CHURN", "0", 1);
  if (pthread_create(&reader, NULL, read_path, NULL) || pthread_create(&writer, NULL, churn, NULL))
    return 2;
  while (atomic_load(&path_reads) == 0 || atomic_load(&churn_sets) == 0)
    ;
  printf("ready\n");
  fflush(stdout);
  while (fgets(line, sizeof line, stdin) != NULL) {
    const char *p = getenv("PATH");
    printf("path_reads=%ld path_changes=%ld churn_sets=%ld churn_wrong=%ld path=%s\n",
           atomic_load(&path_reads), atomic_load(&path_changes), atomic_load(&churn_sets),
           atomic_load(&churn_wrong), p ? p : "(unset)");
    fflush(stdout);
  }
  atomic_store(&running, 0);
  pthread_join(reader, NULL);
  pthread_join(writer, NULL);
  return 0;
}
