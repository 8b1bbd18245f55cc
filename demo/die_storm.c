/*
 * die_storm — "launch storm" death type (memtrace issue 6).
 *
 * Usage: die_storm [--threads N] [--storm S] [--calm S] [--watchdog-ms M] [--max-slowdown X]
 *                  [--grace K] [--no-watchdog]
 *   --threads N        storm threads (default 4)
 *   --storm S          length of the launch storm in seconds (default 2)
 *   --calm S           seconds of calm, low-rate activity after the storm before exiting 0 (default 3)
 *   --watchdog-ms M    watchdog window in milliseconds (default 100)
 *   --max-slowdown X   kill threshold (default 10; see below)
 *   --grace K          consecutive slow windows needed to kill (default 2)
 *   --no-watchdog      baseline: never kill
 *
 * Phases (all threads named "storm-<i>", the watchdog is the main thread):
 *  1. Calibration, NO malloc: every storm thread runs a pure arithmetic loop (calib_arith_unit:
 *     64 dependent LCG steps) concurrently for 100 ms; the watchdog records the aggregate
 *     arithmetic rate A (units/ms).  Threads start behind a barrier, so calibration shares the
 *     CPUs exactly like the storm will.  (pthread_create itself makes a few glibc-internal TLS
 *     allocations before this; nothing else allocates.)
 *  2. Storm (--storm seconds): every thread loops on launch_storm_unit(): one malloc of
 *     32 + (i * 37) % 480 bytes (32..511), one byte written, free, plus the same 64 LCG steps.
 *     Natively ~2 x (malloc+free) = tens of millions of events per second on 4 threads.
 *     Every window of M ms the watchdog computes the aggregate storm rate U (units/ms) and
 *     slowdown = A / U.  Natively the slowdown is ~1.2-3 (one malloc+free pair costs about as
 *     much as the arithmetic).  If slowdown > X for K consecutive windows, it prints
 *       "die_storm: watchdog: slowdown <s> > <X> for <K> windows (<U> units/ms vs calibrated <A>), raising SIGKILL"
 *     to stderr and raises SIGKILL: the process dies by signal 9.
 *     Being hooked per allocation from JavaScript (~1-2 us per call, i.e. slowdown ~30-100) or
 *     with JS stack capture triggers it within K windows of the hooks going live; a native
 *     CModule hot path (tens of ns extra) normally does not at the default X=10 (pass a lower
 *     --max-slowdown, e.g. 2, to make lighter hooks trigger it).  A Frida attach in the middle of
 *     the storm stalls the threads briefly and can trigger it too: that is a launch-storm death.
 *  3. Calm (--calm seconds): the watchdog is off; calm_idle_tick() does one malloc(256)+free
 *     every 10 ms.  Attaching after the storm therefore never kills it.
 *  4. Prints "done: die_storm threads=N storm_units=<n> max_slowdown_seen=<s>" and exits 0.
 */
#include "mtdemo.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

static int g_threads = 4;
static volatile int g_phase; /* 0 calibrate, 1 storm, 2 stop */
static atomic_ulong g_calib_units;
static atomic_ulong g_storm_units;
static pthread_barrier_t g_barrier;

NOINLINE unsigned long calib_arith_unit(unsigned long x)
{
    for (int i = 0; i < 64; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

NOINLINE unsigned long launch_storm_unit(unsigned long i, unsigned long x)
{
    size_t sz = 32 + (i * 37) % 480;
    unsigned char *p = malloc(sz);
    p[0] = (unsigned char)x;
    mtdemo_sink(p);
    free(p);
    return calib_arith_unit(x);
}

NOINLINE void calm_idle_tick(void)
{
    void *p = malloc(256);
    memset(p, 1, 256);
    mtdemo_sink(p);
    free(p);
}

static void *storm_thread(void *arg)
{
    unsigned long x = (unsigned long)arg + 1, i = 0;
    pthread_barrier_wait(&g_barrier);
    while (g_phase == 0) {
        x = calib_arith_unit(x);
        atomic_fetch_add_explicit(&g_calib_units, 1, memory_order_relaxed);
    }
    while (g_phase == 1) {
        x = launch_storm_unit(i++, x);
        atomic_fetch_add_explicit(&g_storm_units, 1, memory_order_relaxed);
    }
    mtdemo_sink((void *)x);
    return NULL;
}

int main(int argc, char **argv)
{
    g_threads = (int)mtdemo_opt_double(argc, argv, "--threads", 4);
    double storm = mtdemo_opt_double(argc, argv, "--storm", 2);
    double calm = mtdemo_opt_double(argc, argv, "--calm", 3);
    double window_ms = mtdemo_opt_double(argc, argv, "--watchdog-ms", 100);
    double max_slowdown = mtdemo_opt_double(argc, argv, "--max-slowdown", 10);
    int grace = (int)mtdemo_opt_double(argc, argv, "--grace", 2);
    int watchdog = !mtdemo_flag(argc, argv, "--no-watchdog");
    if (g_threads < 1 || g_threads > 64)
        g_threads = 4;

    pthread_t th[64];
    pthread_barrier_init(&g_barrier, NULL, (unsigned)g_threads + 1);
    for (int i = 0; i < g_threads; i++) {
        char name[16];
        pthread_create(&th[i], NULL, storm_thread, (void *)(long)i);
        snprintf(name, sizeof name, "storm-%d", i);
        pthread_setname_np(th[i], name);
    }
    pthread_barrier_wait(&g_barrier);
    double t0 = mtdemo_now();
    mtdemo_sleep(0.1);
    /* A calibration that got no CPU would leave the watchdog blind (slowdown 0): extend it. */
    while (atomic_load(&g_calib_units) == 0 && mtdemo_now() - t0 < 5)
        mtdemo_sleep(0.01);
    unsigned long cu = atomic_load(&g_calib_units);
    double calib_rate = cu / ((mtdemo_now() - t0) * 1000.0); /* units per ms */
    g_phase = 1;

    double start = mtdemo_now(), last = start, worst = 0;
    unsigned long last_units = atomic_load(&g_storm_units);
    int slow_windows = 0;
    while (mtdemo_now() - start < storm) {
        mtdemo_sleep(window_ms / 1000.0);
        double now = mtdemo_now();
        unsigned long u = atomic_load(&g_storm_units);
        double rate = (u - last_units) / ((now - last) * 1000.0);
        double slowdown = rate > 0 ? calib_rate / rate : 1e9;
        if (slowdown > worst)
            worst = slowdown;
        last = now;
        last_units = u;
        if (!watchdog)
            continue;
        slow_windows = slowdown > max_slowdown ? slow_windows + 1 : 0;
        if (slow_windows >= grace) {
            fprintf(stderr,
                    "die_storm: watchdog: slowdown %.1f > %.1f for %d windows (%.0f units/ms vs calibrated %.0f), raising SIGKILL\n",
                    slowdown, max_slowdown, slow_windows, rate, calib_rate);
            fflush(stderr);
            raise(SIGKILL);
        }
    }
    g_phase = 2;
    for (int i = 0; i < g_threads; i++)
        pthread_join(th[i], NULL);
    double cstart = mtdemo_now();
    while (mtdemo_now() - cstart < calm) {
        calm_idle_tick();
        mtdemo_sleep(0.01);
    }
    if (mtdemo_verbose())
        fprintf(stderr, "die_storm: calibrated %.0f units/ms\n", calib_rate);
    printf("done: die_storm threads=%d storm_units=%lu max_slowdown_seen=%.2f\n", g_threads,
           (unsigned long)atomic_load(&g_storm_units), worst);
    return 0;
}
