/*
 * Surfaces made before memtrace attaches, released in its window: surface 1 is created and its
 * client looked up (two references) before "ready"; on SIGUSR1 both references are dropped (two
 * IOSurfaceClientRelease calls on a surface whose count the tracer never saw: neither may count as
 * a release), then surface 2 is created and released in the window (one release), and it exits.
 */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "mtdarwin.h"

static volatile sig_atomic_t go;

static void on_usr1(int sig) { (void)sig; go = 1; }

int main(void)
{
    struct mtdarwin_surface_props p = { 256, 256, 4, kCVPixelFormatType_32BGRA, "Early" };
    signal(SIGUSR1, on_usr1);
    void *early = IOSurfaceCreate(&p);
    void *client = IOSurfaceClientLookup(IOSurfaceGetID(early));
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    while (!go)
        usleep(1000);
    IOSurfaceClientRelease(client);
    CFRelease(early);
    void *late = IOSurfaceCreate(&p);
    CFRelease(late);
    puts("done");
    return 0;
}
