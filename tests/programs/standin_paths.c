/* Darwin entry points through the stand-in (demo/darwin/libmtdarwin.so): two business paths
 * through one purgeable wrapper, and an unrolled loop of five IOSurfaceCreate calls on one
 * source line.  Lines the tests check are tagged @name. */
#include <stdio.h>
#include <stdlib.h>
#include "mtdarwin.h"

#define NOINLINE __attribute__((noinline))
#define FIVE(x) x; x; x; x; x
#define PAGE 16384

static void *volatile g_sink;

/* The wrapper every cache goes through: its own frame is the same for both paths. */
NOINLINE void cache_set_state(unsigned long addr, int state)
{
    vm_purgable_control(mach_task_self(), addr, VM_PURGABLE_SET_STATE, &state); /* @wrapper */
}

NOINLINE void image_cache_trim(unsigned long addr)
{
    cache_set_state(addr, VM_PURGABLE_VOLATILE); /* @image-path */
}

NOINLINE void font_cache_trim(unsigned long addr)
{
    cache_set_state(addr, VM_PURGABLE_VOLATILE); /* @font-path */
}

NOINLINE void make_surfaces(void)
{
    struct mtdarwin_surface_props p = { 64, 64, 4, 0x42475241, "Unrolled" };
    FIVE(g_sink = IOSurfaceCreate(&p)); /* @unrolled-surfaces */
}

int main(void)
{
    unsigned long addr[5];
    for (int i = 0; i < 5; i++) {
        addr[i] = 0;
        if (vm_allocate(mach_task_self(), &addr[i], PAGE, VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE) != 0) {
            fprintf(stderr, "vm_allocate failed\n");
            return 1;
        }
    }
    for (int i = 0; i < 3; i++)
        image_cache_trim(addr[i]);
    for (int i = 3; i < 5; i++)
        font_cache_trim(addr[i]);
    make_surfaces();
    puts("done");
    return 0;
}
