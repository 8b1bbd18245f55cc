/* A thread that calls through memtrace's descriptor guard, then waits in a live frame's unwritten
 * buffer over what that call left on its stack (tests/integration/test_quiesce.py).
 *
 * Given "close" on stdin, a second thread closes a descriptor 8 frames deep (through the guard),
 * comes back up, then calls hold(), whose 64 KiB buffer is never written: it spans where those frames were, so
 * what they left sits inside a live frame, beyond the 8 KiB world.js reads for Frida's frames
 * (FRIDA_DEPTH), within the 256 KiB it reads for ours when a thread is counted inside them.  It says
 * "held" and waits for a byte on stdin; then it returns and the program exits 0. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void __attribute__ ((noinline)) deep_close (int n)
{
  volatile char pad[512];
  pad[0] = (char) n;
  if (n > 0)
    deep_close (n - 1);
  else
    close (open ("/dev/null", O_RDONLY));
  __asm__ volatile ("" : : "r" (pad) : "memory");
}

static void __attribute__ ((noinline)) hold (void)
{
  volatile unsigned long frame[8192];   /* never written: keeps what deep_close left there */
  char c;
  __asm__ volatile ("" : : "r" (frame) : "memory");
  write (1, "held\n", 5);
  (void) read (0, &c, 1);
}

static void *
run (void *arg)
{
  (void) arg;
  deep_close (8);
  hold ();
  return NULL;
}

int
main (void)
{
  char line[32];
  pthread_t t;
  setvbuf (stdout, NULL, _IONBF, 0);
  printf ("ready\n");
  if (fgets (line, sizeof line, stdin) == NULL || strcmp (line, "close\n") != 0)
    return 2;
  pthread_create (&t, NULL, run, NULL);
  pthread_join (t, NULL);
  return 0;
}
