/*
 * slow_start — "slow start" death type (memtrace issue 6).
 *
 * Usage: slow_start [SECONDS]   (default 30)
 *
 * Sleeps silently for SECONDS (no allocation, no output, single thread: splash_screen_wait()),
 * then startup_finish_launch() allocates briefly: 100 x malloc(1024) and 10 x malloc(65536),
 * all freed; prints "done: slow_start waited=<SECONDS> allocations=110" and exits 0.
 * A tracer attached during the wait sees zero allocation events.
 */
#include "mtdemo.h"

NOINLINE void splash_screen_wait(double seconds)
{
    mtdemo_sleep(seconds);
}

NOINLINE void startup_finish_launch(void)
{
    void *small[100], *big[10];
    for (int i = 0; i < 100; i++) {
        small[i] = malloc(1024);
        memset(small[i], i, 1024);
    }
    for (int i = 0; i < 10; i++) {
        big[i] = malloc(65536);
        memset(big[i], i, 65536);
    }
    for (int i = 0; i < 100; i++) {
        mtdemo_sink(small[i]);
        free(small[i]);
    }
    for (int i = 0; i < 10; i++) {
        mtdemo_sink(big[i]);
        free(big[i]);
    }
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? strtod(argv[1], NULL) : 30;
    splash_screen_wait(seconds);
    startup_finish_launch();
    printf("done: slow_start waited=%g allocations=110\n", seconds);
    return 0;
}
