/*
 * mtdemo.h — small helpers shared by the demo programs (header-only, static functions).
 *
 * Nothing here allocates memory.  mtdemo_sink() keeps the compiler from eliding
 * malloc/free pairs whose memory is otherwise unused.
 */
#ifndef MTDEMO_H
#define MTDEMO_H

#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

/* Opaque use of a pointer: forces the allocation (and its writes) to happen. */
static NOINLINE __attribute__((unused)) void mtdemo_sink(void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

static inline int mtdemo_verbose(void)
{
    const char *v = getenv("MTDEMO_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}

static inline double mtdemo_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sleep for a (possibly fractional) number of seconds; no allocation. */
static inline void mtdemo_sleep(double seconds)
{
    if (seconds <= 0)
        return;
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Scenario convention: optional first argument = seconds to sleep before starting. */
static inline void mtdemo_leading_delay(int argc, char **argv)
{
    if (argc > 1)
        mtdemo_sleep(strtod(argv[1], NULL));
}

/* Returns the value following option `name` (e.g. "--scale"), or NULL. */
static inline const char *mtdemo_opt(int argc, char **argv, const char *name)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return argv[i + 1];
    return NULL;
}

static inline int mtdemo_flag(int argc, char **argv, const char *name)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return 1;
    return 0;
}

static inline double mtdemo_opt_double(int argc, char **argv, const char *name, double dflt)
{
    const char *v = mtdemo_opt(argc, argv, name);
    return v ? strtod(v, NULL) : dflt;
}

/*
 * Workload convention: --scale N (integer iteration multiplier, default 1), --delay S (sleep S
 * seconds before any work, so a tracer can attach), --linger S (sleep S seconds after the work,
 * before the final line and exit).
 */
struct mtdemo_args {
    int scale;
    double delay;
    double linger;
};

static inline struct mtdemo_args mtdemo_workload_args(int argc, char **argv)
{
    struct mtdemo_args a;
    a.scale = (int)mtdemo_opt_double(argc, argv, "--scale", 1);
    if (a.scale < 1)
        a.scale = 1;
    a.delay = mtdemo_opt_double(argc, argv, "--delay", 0);
    a.linger = mtdemo_opt_double(argc, argv, "--linger", 0);
    return a;
}

/* Run `fn` on n threads named "<prefix>-<i>" (n <= 8) and wait for all of them. */
static inline void mtdemo_run_threads(int n, void *(*fn)(void *), const char *prefix)
{
    pthread_t th[8];
    char name[16];
    for (int i = 0; i < n && i < 8; i++) {
        pthread_create(&th[i], NULL, fn, NULL);
        snprintf(name, sizeof name, "%.10s-%d", prefix, i);
        pthread_setname_np(th[i], name);
    }
    for (int i = 0; i < n && i < 8; i++)
        pthread_join(th[i], NULL);
}

#endif /* MTDEMO_H */
