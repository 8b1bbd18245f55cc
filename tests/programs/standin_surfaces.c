/*
 * IOSurfaces on the stand-in: two made with IOSurfaceCreate, three child surfaces made through
 * IOSurfaceClientCreateChild (mtdarwin_surface_create_child: a framework path that never calls
 * IOSurfaceCreate); one parent and two children released (CFRelease to zero).
 * IDs in creation order: parents 1, 2; children 3, 4, 5.
 */
#include <stdio.h>

#include "mtdarwin.h"

#define NOINLINE __attribute__((noinline))

static void *parents[2];
static void *children[3];

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

int main(void)
{
    make_parents();
    make_children();
    CFRelease(parents[0]);
    CFRelease(children[0]);
    CFRelease(children[1]);
    puts("done");
    return 0;
}
