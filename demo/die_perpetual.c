/*
 * die_perpetual — "perpetual allocation stream" death type (memtrace issue 6).
 *
 * Usage: die_perpetual [--lifetime S] [--rate R] [--signal KILL|ABRT]
 *   --lifetime S  seconds from process start after which the watchdog kills the process
 *                 (default 3; 0 = never: the stream runs forever)
 *   --rate R      allocations per second of the stream (default 50000)
 *   --signal SIG  KILL (default) or ABRT
 *   --min-hooked T  the watchdog also waits until malloc has been hooked (its first bytes
 *                 rewritten, as Frida's Interceptor does) for T seconds (default 0: it does not
 *                 look).  A test knob: on a loaded machine attaching can take longer than the
 *                 lifetime, and a process killed during injection is not the death shown here.
 *
 * Thread "prefetch" runs content_prefetch_loop(): every 1 ms tick (absolute deadlines) it calls
 * prefetch_fetch_item(k) R/1000 times (50 per tick by default); each call does one malloc of
 * size {64, 128, 256, 1024, 4096, 16384}[k % 6] (one in six >= 8 KB), writes it and frees it.
 * The stream never stops and never settles: a constant ~R malloc + R free per second as long as
 * the allocator keeps up (when hooked slowly it simply runs as fast as it can).
 * The main thread is the watchdog: it sleeps until S seconds after start (measured from the
 * start of main, NOT from any attach), prints
 *     "die_perpetual: watchdog: lifetime <S> s reached, still streaming (<n> items), raising SIG<KILL|ABRT>"
 * to stderr and raises the signal: the process dies by signal 9 (or 6) at the same time after
 * start whatever the attach delay, with the event rate still high — the perpetual-stream
 * signature (two attempts at different delays both die at ~S s after launch).
 * The process never exits 0 unless --lifetime 0 and it is killed from outside.
 */
#include "mtdemo.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

static int g_per_tick = 50;
static unsigned char g_malloc_head[16];   /* malloc's first bytes at start, before any hook */
static atomic_ulong g_items;

NOINLINE void prefetch_fetch_item(unsigned long k)
{
    static const size_t sizes[6] = { 64, 128, 256, 1024, 4096, 16384 };
    size_t sz = sizes[k % 6];
    unsigned char *p = malloc(sz);
    memset(p, (int)(k & 0xff), sz < 256 ? sz : 256);
    mtdemo_sink(p);
    free(p);
}

NOINLINE void content_prefetch_loop(void)
{
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    unsigned long k = 0;
    for (;;) {
        for (int i = 0; i < g_per_tick; i++)
            prefetch_fetch_item(k++);
        atomic_store(&g_items, k);
        next.tv_nsec += 1000000;
        if (next.tv_nsec >= 1000000000) {
            next.tv_nsec -= 1000000000;
            next.tv_sec++;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
    }
}

static void *prefetch_thread(void *arg)
{
    content_prefetch_loop();
    return NULL;
}

/* Whether an Interceptor patch is on malloc's entry: its bytes changed since start (an attach
 * to the running process), or it already began with a jump at start (spawned, hooked before
 * main: Frida redirects x86-64 entries with jmp rel32 or jmp [rip+d]; glibc's starts otherwise). */
static int malloc_hooked(void)
{
    void *(*volatile entry)(size_t) = malloc;
    const unsigned char *head = (const unsigned char *)entry;
    if (memcmp(head, g_malloc_head, sizeof g_malloc_head) != 0)
        return 1;
#if defined(__x86_64__)
    return head[0] == 0xe9 || (head[0] == 0xff && head[1] == 0x25);
#else
    return 1;      /* cannot tell here: do not wait */
#endif
}

int main(int argc, char **argv)
{
    double t0 = mtdemo_now();
    double lifetime = mtdemo_opt_double(argc, argv, "--lifetime", 3);
    double rate = mtdemo_opt_double(argc, argv, "--rate", 50000);
    const char *sig = mtdemo_opt(argc, argv, "--signal");
    double min_hooked = mtdemo_opt_double(argc, argv, "--min-hooked", 0);
    void *(*volatile entry)(size_t) = malloc;
    memcpy(g_malloc_head, (const void *)entry, sizeof g_malloc_head);
    int signo = (sig && strcmp(sig, "ABRT") == 0) ? SIGABRT : SIGKILL;
    g_per_tick = (int)(rate / 1000.0);
    if (g_per_tick < 1)
        g_per_tick = 1;

    pthread_t th;
    pthread_create(&th, NULL, prefetch_thread, NULL);
    pthread_setname_np(th, "prefetch");
    if (lifetime <= 0)
        for (;;)
            pause();
    double remaining = lifetime - (mtdemo_now() - t0);
    mtdemo_sleep(remaining);
    if (min_hooked > 0) {
        while (!malloc_hooked())
            mtdemo_sleep(0.01);
        mtdemo_sleep(min_hooked);
    }
    fprintf(stderr, "die_perpetual: watchdog: lifetime %.1f s reached, still streaming (%lu items), raising SIG%s\n",
            lifetime, (unsigned long)atomic_load(&g_items), signo == SIGKILL ? "KILL" : "ABRT");
    fflush(stderr);
    if (signo == SIGABRT) {
        signal(SIGABRT, SIG_DFL);
        raise(SIGABRT);
    }
    raise(SIGKILL);
    return 1;
}
