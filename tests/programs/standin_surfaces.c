/*
 * IOSurfaces on the stand-in, nested and reference counted as on a device:
 *   make_parents   IOSurfaceCreate x 2 (each builds its client with IOSurfaceClientCreateChild(NULL)
 *                  nested inside it): ids 1, 2, 1920 x 1080 BGRA.
 *   make_children  mtdarwin_surface_create_child(parent 2) x 3 (a framework path that never calls
 *                  IOSurfaceCreate: IOSurfaceClientCreateChild(parent client)): ids 3, 4, 5,
 *                  2048 x 512 420v, parent 2.
 *   make_direct    IOSurfaceClientCreateChild(NULL) called directly: id 6, 640 x 480 BGRA, no parent.
 * References: surface 1's client is looked up (+1) and retained (+1); CFRelease of surface 1 drops
 * the surface object's reference (3 -> 2, not destroyed), two IOSurfaceClientRelease calls destroy
 * it.  Children 3 and 4 are CFReleased to zero; surface 6's only reference is released.
 * Six IOSurfaceClientRelease calls, four surfaces destroyed (1, 3, 4, 6); 2 and 5 held at the end.
 */
#include <stdio.h>

#include "mtdarwin.h"

#define NOINLINE __attribute__((noinline))

static void *parents[2];
static void *children[3];
static void *direct;

static NOINLINE void make_parents(void)
{
    struct mtdarwin_surface_props p = { 1920, 1080, 4, kCVPixelFormatType_32BGRA, "Parent" };
    for (int i = 0; i < 2; i++)
        parents[i] = IOSurfaceCreate(&p);
}

static NOINLINE void make_children(void)
{
    struct mtdarwin_surface_props c = { 2048, 512, 1, kCVPixelFormatType_420YpCbCr8BiPlanarVideoRange, "Plane" };
    for (int i = 0; i < 3; i++)
        children[i] = mtdarwin_surface_create_child(parents[1], &c);
}

static NOINLINE void make_direct(void)
{
    struct mtdarwin_surface_props d = { 640, 480, 4, kCVPixelFormatType_32BGRA, "Direct" };
    direct = IOSurfaceClientCreateChild(NULL, &d);
}

int main(void)
{
    make_parents();
    make_children();
    make_direct();
    void *client = IOSurfaceClientLookup(IOSurfaceGetID(parents[0]));
    IOSurfaceClientRetain(client);
    CFRelease(parents[0]);
    IOSurfaceClientRelease(client);
    IOSurfaceClientRelease(client);
    CFRelease(children[0]);
    CFRelease(children[1]);
    IOSurfaceClientRelease(direct);
    puts("done");
    return 0;
}
