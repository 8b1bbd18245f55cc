/* Stress target for hooks going in and out (tests/stress/hook_storm.py): T threads calling, in a
 * tight loop and forever, the functions a tracer hooks.  Usage: hook_storm KIND [threads].
 *   malloc   malloc / free / calloc / realloc / posix_memalign (the malloc tracer's entries)
 *   fds      open / close / dup / pipe / socket / fopen / fclose (the fds tracer's)
 *   threads  pthread_create / pthread_join (the threads tracer's)
 *   iosurface  IOSurfaceCreate / CFRelease of the Darwin stand-in (demo/darwin, libmtdarwin.so,
 *              path in MTDARWIN_LIB): the iosurface tracer's
 *   purgeable  vm_allocate (purgeable) / vm_purgable_control / mtdarwin_madvise / vm_deallocate
 *              of the same stand-in: the purgeable tracer's
 * Prints "ready" once every thread runs; a death (signal) is the failure the storm looks for. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void *volatile sink;
static volatile int started;

static void *nothing(void *arg) { return arg; }

static void *malloc_loop(void *arg) {
  unsigned long i = (unsigned long)arg;
  __sync_fetch_and_add(&started, 1);
  for (;;) {
    void *p = malloc(16 + (i++ % 512));
    sink = p;
    p = realloc(p, 64 + (i % 4096));
    sink = p;
    free(p);
    p = calloc(4, 32);
    sink = p;
    free(p);
    if (posix_memalign(&p, 64, 128) == 0) free(p);
  }
  return NULL;
}

static void *fds_loop(void *arg) {
  (void)arg;
  __sync_fetch_and_add(&started, 1);
  for (;;) {
    int fd = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
      int d = dup(fd);
      if (d >= 0) close(d);
      close(fd);
    }
    int p[2];
    if (pipe(p) == 0) { close(p[0]); close(p[1]); }
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s >= 0) close(s);
    FILE *f = fopen("/dev/null", "r");
    if (f != NULL) fclose(f);
  }
  return NULL;
}

static void *threads_loop(void *arg) {
  (void)arg;
  __sync_fetch_and_add(&started, 1);
  for (;;) {
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) == 0) pthread_join(t, NULL);
  }
  return NULL;
}

/* The stand-in's entries, looked up by name (the program is not linked with it). */
struct props { uint32_t width, height, bytes_per_element, pixel_format; const char *name; };
static void *(*surface_create)(void *);
static void (*cf_release)(const void *);
static int (*vm_alloc)(unsigned, unsigned long *, unsigned long, int);
static int (*vm_dealloc)(unsigned, unsigned long, unsigned long);
static int (*purgable_control)(unsigned, unsigned long, int, int *);
static int (*darwin_madvise)(void *, size_t, int);

static void *must(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (p == NULL) {
    fprintf(stderr, "hook_storm: %s not in MTDARWIN_LIB\n", name);
    exit(4);
  }
  return p;
}

static void load_standin(void) {
  const char *path = getenv("MTDARWIN_LIB");
  void *lib = path == NULL ? NULL : dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) {
    fprintf(stderr, "hook_storm: set MTDARWIN_LIB to the stand-in libmtdarwin.so\n");
    exit(4);
  }
  surface_create = (void *(*)(void *))must(lib, "IOSurfaceCreate");
  cf_release = (void (*)(const void *))must(lib, "CFRelease");
  vm_alloc = (int (*)(unsigned, unsigned long *, unsigned long, int))must(lib, "vm_allocate");
  vm_dealloc = (int (*)(unsigned, unsigned long, unsigned long))must(lib, "vm_deallocate");
  purgable_control = (int (*)(unsigned, unsigned long, int, int *))must(lib, "vm_purgable_control");
  darwin_madvise = (int (*)(void *, size_t, int))must(lib, "mtdarwin_madvise");
}

static void *iosurface_loop(void *arg) {
  (void)arg;
  struct props p = { 64, 64, 4, 0x42475241u, "storm" };
  __sync_fetch_and_add(&started, 1);
  for (;;) {
    void *s = surface_create(&p);
    if (s != NULL) cf_release(s);
  }
  return NULL;
}

static void *purgeable_loop(void *arg) {
  (void)arg;
  __sync_fetch_and_add(&started, 1);
  for (;;) {
    unsigned long addr = 0;
    /* VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE; control 0 = VM_PURGABLE_SET_STATE, 1 = VOLATILE */
    if (vm_alloc(0, &addr, 16384, 0x1 | 0x2) == 0) {
      int state = 1;
      purgable_control(0, addr, 0, &state);
      darwin_madvise((void *)addr, 16384, 5);
      vm_dealloc(0, addr, 16384);
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  const char *kind = argc > 1 ? argv[1] : "malloc";
  int n = argc > 2 ? atoi(argv[2]) : 4;
  void *(*loop)(void *) = strcmp(kind, "fds") == 0 ? fds_loop
      : strcmp(kind, "threads") == 0 ? threads_loop
      : strcmp(kind, "iosurface") == 0 ? iosurface_loop
      : strcmp(kind, "purgeable") == 0 ? purgeable_loop : malloc_loop;
  if (loop == iosurface_loop || loop == purgeable_loop) load_standin();
  if (n < 1 || n > 64) return 2;
  for (long i = 0; i < n; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, loop, (void *)i) != 0) return 3;
  }
  while (started < n) usleep(1000);
  printf("ready\n");
  fflush(stdout);
  for (;;) pause();
}
