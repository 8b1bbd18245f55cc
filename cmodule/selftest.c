/* memtrace doctor's in-process self-test (the malloc agent's selfTest rpc compiles it).
 *
 * memtrace_doctor_run (n, size) starts one thread that calls the allocator's malloc and free n
 * times from memtrace_doctor_selftest: the host then expects exactly n allocations of that size,
 * each with a stack whose innermost frame lies in memtrace_doctor_selftest.  malloc and free are
 * the allocator's own entries, passed in as symbols (TinyCC has no libc headers).
 */
typedef unsigned long size_t;
typedef unsigned long pthread_t;

extern void * malloc (size_t size);
extern void free (void * p);
extern int pthread_create (pthread_t * t, const void * attr, void * (* fn) (void *), void * arg);
extern int pthread_join (pthread_t t, void ** ret);

struct job
{
  int n;
  size_t size;
};

void *
memtrace_doctor_selftest (void * arg)
{
  struct job * j = arg;
  int i;

  for (i = 0; i < j->n; i++)
  {
    void * volatile p = malloc (j->size);
    free (p);
  }
  return 0;
}

int
memtrace_doctor_run (int n, size_t size)
{
  struct job j;
  pthread_t t;

  j.n = n;
  j.size = size;
  if (pthread_create (&t, 0, memtrace_doctor_selftest, &j) != 0)
    return -1;
  return pthread_join (t, 0);
}
