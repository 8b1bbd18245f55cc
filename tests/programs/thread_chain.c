/* A thread made while memtrace's injection boost watches, which makes a thread of its own once it
 * finds itself raised (nice -20, the watcher's value for a new thread): the second thread is born at
 * -20 by inheritance, and must get the program's value back (memtrace.priority).  Prints "ready";
 * on SIGUSR2 main makes the first thread; prints "chained" (stdout) once the second exists. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile sig_atomic_t go;

static void on_usr2(int sig) { (void)sig; go = 1; }

static void *leaf(void *a) {
  (void)a;
  printf("chained\n");
  fflush(stdout);
  for (;;) pause();
  return NULL;
}

static void *middle(void *a) {
  (void)a;
  pid_t self = (pid_t)syscall(SYS_gettid);
  while (getpriority(PRIO_PROCESS, (id_t)self) != -20) usleep(1000);
  pthread_t t;
  pthread_create(&t, NULL, leaf, NULL);
  for (;;) pause();
  return NULL;
}

int main(void) {
  signal(SIGUSR2, on_usr2);
  printf("ready\n");
  fflush(stdout);
  while (!go) usleep(1000);
  pthread_t t;
  pthread_create(&t, NULL, middle, NULL);
  for (;;) pause();
}
