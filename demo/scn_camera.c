/*
 * scn_camera — a camera pipeline creating a pool of large IOSurfaces, marking some purgeable,
 * and releasing part of the pool.  Single-threaded, deterministic.
 *
 * Usage: scn_camera [DELAY_SECONDS]   (optional sleep before any work; none if absent)
 * Output: one line
 *   "done: scn_camera surfaces=12 bytes=149356544 released=5 released_bytes=41500672 held=7 held_bytes=107855872"
 *
 * Surfaces (IOSurfaceCreate, all with direct caller camera_pool_create_surface), ids in order:
 *   ids 1..8:  1920x1080, bytes_per_element 1, '420v' (0x34323076), name "CameraPool.1080p"
 *              bytes_per_row 1920, alloc size round_up(1920*1080, 16384) = 2080768
 *   ids 9..12: 3840x2160, bytes_per_element 4, 'BGRA' (0x42475241), name "CameraPool.4K"
 *              bytes_per_row 15360, alloc size 33177600
 *   total 12 surfaces, 8*2080768 + 4*33177600 = 16646144 + 132710400 = 149356544 bytes.
 *
 * EXACT calls after creation:
 *  1. camera_capture_frame(s) for all 12: IOSurfaceIncrementUseCount then IOSurfaceDecrementUseCount
 *     (12 + 12 calls; use count back to 0).
 *  2. camera_pool_mark_purgeable(): IOSurfaceSetPurgeable(s, kIOSurfacePurgeableVolatile) on ids
 *     5,6,7,8,11,12 -> 6 transitions 0->1 (4*2080768 + 2*33177600 = 74678272 B).
 *  3. mtdarwin_memory_pressure(): the 6 volatile surfaces become EMPTY (no hooked call).
 *  4. camera_pool_reclaim(): IOSurfaceSetPurgeable(NonVolatile) on ids 5,6,11 -> 3 transitions 2->0
 *     ("stolen", 2*2080768 + 33177600 = 37339136 B); IOSurfaceSetPurgeable(KeepCurrent) on id 7
 *     -> reads old state 2, no transition.
 *     IOSurfaceSetPurgeable totals: 10 calls, direct callers camera_pool_mark_purgeable (6) and
 *     camera_pool_reclaim (4).  IOSurfaceSetPurgeable never goes through vm_purgable_control /
 *     mach_vm_purgable_control (SET_STATE_FROM_KERNEL path): those see 0 calls.
 *  5. camera_pool_release_surface(): CFRetain(id 3) + CFRelease(id 3) (count back to 1, not
 *     destroyed), then CFRelease on ids 1,2,7,8,12 -> 5 destroyed through mtdarwin_surface_destroy
 *     (4*2080768 + 33177600 = 41500672 B).  CFRelease: 6 calls, CFRetain: 1 call,
 *     mtdarwin_surface_destroy: 5 calls (direct caller CFRelease).
 *  6. Held at exit (never released): ids 3,4,5,6 (1080p) and 9,10,11 (4K):
 *     7 surfaces, 4*2080768 + 3*33177600 = 107855872 bytes.
 * No mach_vm_* / vm_* calls, no madvise calls.  Exit status 0 (1 if any check fails).
 */
#include "mtdemo.h"
#include "mtdarwin.h"

#define N1080 8
#define N4K 4
#define NSURF (N1080 + N4K)

static void *g_surf[NSURF + 1]; /* indexed by id */
static int g_errors;

static void expect(const char *what, long got, long want)
{
    if (got != want) {
        fprintf(stderr, "scn_camera: %s = %ld, expected %ld\n", what, got, want);
        g_errors++;
    }
}

NOINLINE void *camera_pool_create_surface(uint32_t w, uint32_t h, uint32_t bpe, uint32_t fmt, const char *name)
{
    struct mtdarwin_surface_props p = { w, h, bpe, fmt, name };
    void *s = IOSurfaceCreate(&p);
    if (!s) {
        fprintf(stderr, "IOSurfaceCreate failed\n");
        exit(1);
    }
    return s;
}

NOINLINE void camera_capture_frame(void *s)
{
    IOSurfaceIncrementUseCount(s);
    memset(IOSurfaceGetBaseAddress(s), 0x80, 4096);
    IOSurfaceDecrementUseCount(s);
}

NOINLINE void camera_pool_mark_purgeable(void)
{
    static const int ids[] = { 5, 6, 7, 8, 11, 12 };
    for (unsigned i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        uint32_t old = 99;
        IOSurfaceSetPurgeable(g_surf[ids[i]], kIOSurfacePurgeableVolatile, &old);
        expect("mark old", old, 0);
    }
}

NOINLINE void camera_pool_reclaim(void)
{
    static const int ids[] = { 5, 6, 11 };
    for (unsigned i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        uint32_t old = 99;
        IOSurfaceSetPurgeable(g_surf[ids[i]], kIOSurfacePurgeableNonVolatile, &old);
        expect("reclaim old", old, 2);
    }
    uint32_t old = 99;
    IOSurfaceSetPurgeable(g_surf[7], kIOSurfacePurgeableKeepCurrent, &old);
    expect("keepcurrent old", old, 2);
}

NOINLINE void camera_pool_release_surface(void)
{
    CFRetain(g_surf[3]);
    CFRelease(g_surf[3]);
    static const int ids[] = { 1, 2, 7, 8, 12 };
    for (unsigned i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        CFRelease(g_surf[ids[i]]);
        g_surf[ids[i]] = NULL;
    }
}

int main(int argc, char **argv)
{
    mtdemo_leading_delay(argc, argv);
    unsigned long total = 0;
    for (int i = 1; i <= NSURF; i++) {
        if (i <= N1080)
            g_surf[i] = camera_pool_create_surface(1920, 1080, 1, kCVPixelFormatType_420YpCbCr8BiPlanarVideoRange,
                                                   "CameraPool.1080p");
        else
            g_surf[i] = camera_pool_create_surface(3840, 2160, 4, kCVPixelFormatType_32BGRA, "CameraPool.4K");
        expect("id", IOSurfaceGetID(g_surf[i]), i);
        total += IOSurfaceGetAllocSize(g_surf[i]);
    }
    expect("total bytes", (long)total, 149356544L);
    for (int i = 1; i <= NSURF; i++)
        camera_capture_frame(g_surf[i]);
    camera_pool_mark_purgeable();
    mtdarwin_memory_pressure();
    camera_pool_reclaim();
    camera_pool_release_surface();

    unsigned long held = 0;
    int nheld = 0;
    for (int i = 1; i <= NSURF; i++)
        if (g_surf[i]) {
            held += IOSurfaceGetAllocSize(g_surf[i]);
            nheld++;
        }
    expect("held", (long)held, 107855872L);
    if (mtdemo_verbose())
        for (int i = 1; i <= NSURF; i++)
            if (g_surf[i])
                fprintf(stderr, "held id=%u %zux%zu bpr=%zu alloc=%zu fmt=%08x name=%s\n", IOSurfaceGetID(g_surf[i]),
                        IOSurfaceGetWidth(g_surf[i]), IOSurfaceGetHeight(g_surf[i]), IOSurfaceGetBytesPerRow(g_surf[i]),
                        IOSurfaceGetAllocSize(g_surf[i]), IOSurfaceGetPixelFormat(g_surf[i]),
                        mtdarwin_surface_name(g_surf[i]));
    printf("done: scn_camera surfaces=%d bytes=%lu released=%d released_bytes=%lu held=%d held_bytes=%lu\n",
           NSURF, total, NSURF - nheld, total - held, nheld, held);
    return g_errors ? 1 : 0;
}
