/*
 * Darwin's malloc_logger / __syscall_logger path on the stand-in: libmtmalloc calls malloc_logger
 * as libmalloc does (realloc logged after the zone freed the old block), maps its regions and
 * large blocks with mach_vm_map (VM_MEMORY_MALLOC_* tags), and libmtdarwin logs VM calls as
 * libsyscall does.  Every figure is fixed (tests/integration/test_malloc_logger.py).
 *
 *   vm_phase      the task's own VM (tags 88, 62, 0; anonymous and file mmaps), a failed mmap,
 *                 another task's VM
 *   malloc_phase  tiny/small/large blocks, calloc, a moved large realloc
 *   race_phase    the realloc race, every interleaving: thread B is handed A's old block while
 *                 A's realloc is between the zone's free and its malloc_logger call, B logging
 *                 before or after A's release, each side tracked (4096) or not (4088)
 *   async_alloc   an allocation below a frame whose saved frame pointer has Swift's bit 60
 * Prints "done" when every race got the address it was built for; exits 3 otherwise.
 * With --hammer N: N threads allocate and free through the stand-in until killed (prints "ready").
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mtdarwin.h"
#include "mtmalloc.h"

#define NOINLINE __attribute__((noinline))
#define KIB 1024ul
#define MIB (1024ul * 1024ul)
#define OTHER_TASK 0x207u

static malloc_zone_t *z;

static NOINLINE void vm_phase(void)
{
    unsigned long long a = 0;
    mach_vm_allocate(mach_task_self(), &a, MIB, VM_FLAGS_ANYWHERE | (int)VM_MAKE_TAG(VM_MEMORY_IOSURFACE));
    unsigned long long b = 0;
    mach_vm_allocate(mach_task_self(), &b, 256 * KIB, VM_FLAGS_ANYWHERE | (int)VM_MAKE_TAG(VM_MEMORY_SQLITE));
    mach_vm_deallocate(mach_task_self(), b, 256 * KIB);
    mtdarwin_mmap(NULL, 64 * KIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, (int)VM_MAKE_TAG(0), 0);
    int fd = open("/proc/self/exe", O_RDONLY);
    void *f = mtdarwin_mmap(NULL, 8 * KIB, PROT_READ, MAP_PRIVATE, fd, 0);
    mtdarwin_munmap(f, 8 * KIB);
    close(fd);
    mtdarwin_mmap(NULL, 0, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, (int)VM_MAKE_TAG(0), 0);   /* MAP_FAILED */
    unsigned long long c = 0;
    mach_vm_allocate(OTHER_TASK, &c, 64 * KIB, VM_FLAGS_ANYWHERE);
    mach_vm_deallocate(OTHER_TASK, c, 64 * KIB);
    unsigned long long d = 0;
    mach_vm_map(mach_task_self(), &d, 128 * KIB, 0, VM_FLAGS_ANYWHERE, 0, 0, 0, 3, 7, 1);
}

static NOINLINE void malloc_phase(void)
{
    for (int i = 0; i < 10; i++)
        malloc_zone_free(z, malloc_zone_malloc(z, 100));
    for (int i = 0; i < 3; i++)
        malloc_zone_malloc(z, 5000);
    malloc_zone_calloc(z, 10, 1000);
    malloc_zone_malloc(z, MIB);
    void *p = malloc_zone_malloc(z, 40000);
    malloc_zone_realloc(z, p, 100000);
}

/* ---- the realloc race ---- */

static sem_t go_b, b_done, b_reached, b_continue;
static pthread_t b_thread;
static size_t b_size;
static void *b_ptr;
static volatile int armed_realloc, armed_late_b, late;

static void *thread_b(void *arg)
{
    (void)arg;
    for (;;) {
        sem_wait(&go_b);
        if (b_size == 0)
            return NULL;
        b_ptr = malloc_zone_malloc(z, b_size);
        sem_post(&b_done);
    }
}

/* A's realloc, the old block free again, malloc_logger not yet called. */
static void realloc_window(void *old)
{
    (void)old;
    if (!armed_realloc)
        return;
    armed_realloc = 0;
    armed_late_b = late;
    sem_post(&go_b);
    sem_wait(late ? &b_reached : &b_done);
}

/* B holds the block A freed; its malloc_logger call waits for A's, in the late cases. */
static void alloc_window(void *p)
{
    (void)p;
    if (!armed_late_b || !pthread_equal(pthread_self(), b_thread))
        return;
    armed_late_b = 0;
    sem_post(&b_reached);
    sem_wait(&b_continue);
}

static int races_ok = 1;

static NOINLINE void race(size_t a_size, size_t b_want, int b_late, int b_frees)
{
    void *a = malloc_zone_malloc(z, a_size);
    b_size = b_want;
    late = b_late;
    armed_realloc = 1;
    malloc_zone_realloc(z, a, 8192);      /* moves (another size class): the window opens */
    if (b_late) {
        sem_post(&b_continue);
        sem_wait(&b_done);
    }
    if (b_ptr != a)
        races_ok = 0;
    if (b_frees)
        malloc_zone_free(z, b_ptr);
}

static NOINLINE void no_reuse(void)
{
    void *a = malloc_zone_malloc(z, 4096);
    malloc_zone_realloc(z, a, 8192);
}

static NOINLINE void race_phase(void)
{
    sem_init(&go_b, 0, 0);
    sem_init(&b_done, 0, 0);
    sem_init(&b_reached, 0, 0);
    sem_init(&b_continue, 0, 0);
    pthread_create(&b_thread, NULL, thread_b, NULL);
    mtmalloc_set_hooks(realloc_window, alloc_window);
    race(4096, 4096, 0, 0);    /* both tracked, B logs first */
    race(4096, 4096, 1, 0);    /* both tracked, B logs after A's release */
    race(4096, 4088, 0, 1);    /* old tracked, B not; B frees its block */
    race(4096, 4088, 1, 1);
    race(4088, 4096, 0, 0);    /* old not tracked, B tracked */
    race(4088, 4096, 1, 0);
    no_reuse();
    mtmalloc_set_hooks(NULL, NULL);
    b_size = 0;
    sem_post(&go_b);
    pthread_join(b_thread, NULL);
}

/* ---- Swift's async frame bit ---- */

static NOINLINE void alloc_below(void)
{
    malloc_zone_malloc(z, 20000);
}

static NOINLINE void swift_like_async_frame(void)
{
    volatile unsigned long *fp = (volatile unsigned long *)__builtin_frame_address(0);
    unsigned long saved = fp[0];
    fp[0] = saved | (1UL << 60);
    alloc_below();
    fp[0] = saved;
}

static NOINLINE void async_outer(void)
{
    swift_like_async_frame();
}

static void *hammer(void *arg)
{
    size_t size = 64 + 16 * (size_t)(unsigned long)arg;
    for (;;) {
        void *p = malloc_zone_malloc(z, size);
        p = malloc_zone_realloc(z, p, size * 3);
        malloc_zone_free(z, p);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    z = malloc_default_zone();
    if (argc > 2 && strcmp(argv[1], "--hammer") == 0) {
        int n = atoi(argv[2]);
        for (long i = 0; i < n; i++) {
            pthread_t t;
            pthread_create(&t, NULL, hammer, (void *)i);
        }
        puts("ready");
        fflush(stdout);
        for (;;)
            pause();
    }
    vm_phase();
    malloc_phase();
    race_phase();
    async_outer();
    if (!races_ok) {
        fprintf(stderr, "a race did not get the address it was built for\n");
        return 3;
    }
    puts("done");
    fflush(stdout);
    return 0;
}
