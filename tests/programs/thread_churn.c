/* Runs until killed: every 10 ms, churn_once creates a thread and joins it. */
#include <pthread.h>
#include <unistd.h>

static void *churn_task(void *arg) { return arg; }

__attribute__((noinline)) void churn_once(void) {
  pthread_t t;
  pthread_create(&t, NULL, churn_task, NULL);
  pthread_join(t, NULL);
}

int main(void) {
  for (;;) { churn_once(); usleep(10000); }
}
