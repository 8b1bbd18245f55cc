/*
 * camera_surfaces — a camera-like surface pool with purgeable caches (business fingerprint:
 * media/camera).  Uses libmtdarwin (IOSurface + purgeable VM) plus malloc.
 *
 * Usage: camera_surfaces [--scale N] [--delay S] [--linger S]   (see mtdemo.h; defaults 1, 0, 0)
 * Output: one line "done: camera_surfaces scale=N surfaces=8 surface_bytes=22216704 caches=4 metadata=2000"
 * Exit 0.  --scale multiplies only the metadata loop (surfaces and caches are fixed).
 *
 * Main thread:
 *   camera_session_configure(): IOSurfaceCreate x 8, direct caller camera_session_configure:
 *     6 x 1280x720 '420v' bpe 1 (bytes_per_row 1280, alloc 933888), name "Preview.720p", ids 1..6
 *     2 x 1920x1080 'BGRA' bpe 4 (bytes_per_row 7680, alloc 8306688), name "Photo.1080p", ids 7..8
 *     total 6*933888 + 2*8306688 = 22216704 bytes; none released (held at exit).
 *     Then IOSurfaceSetPurgeable(Volatile) on ids 5 and 6 (2 x 0->1, direct caller
 *     camera_session_configure); they stay VOLATILE until exit.
 *   frame_cache_create(): 4 x vm_allocate(flags 3 = ANYWHERE|PURGABLE, 2097152) -> 4 purgeable objects.
 *   frame_cache_make_purgeable(): vm_purgable_control(SET VOLATILE) on the 4 caches -> 4 x 0->1.
 *   mtdarwin_memory_pressure(): all VOLATILE objects (the 4 caches and surfaces 5, 6) become EMPTY.
 *   frame_cache_reacquire(): vm_purgable_control(SET NONVOLATILE) on the 4 caches -> 4 x 2->0.
 *   frame_cache_make_purgeable() again on caches 0 and 1 only -> 2 x 0->1 (held VOLATILE at exit:
 *     purgeable_volatile 4194304, purgeable_nonvolatile = footprint = 4194304).
 *   vm_purgable_control totals: 10 SET (0->1: 6 from frame_cache_make_purgeable, 12582912 B;
 *     2->0: 4 from frame_cache_reacquire, 8388608 B), 0 GET.
 * Thread "metadata": camera_metadata_alloc(k) for k = 0..1999 (2000 x N): malloc(512) freed;
 *   and when k % 100 == 0 also malloc(12288) kept in a ring until exit (20 x N blocks, reachable).
 * Plus glibc internals (thread creation TLS, stdout buffer) outside these functions.
 */
#include "mtdemo.h"
#include "mtdarwin.h"

#include <pthread.h>

static int g_scale = 1;
void *g_surfaces[8];
unsigned long g_caches[4];
void *g_meta_ring[8192];
static int g_nmeta;

NOINLINE void camera_session_configure(void)
{
    for (int i = 0; i < 8; i++) {
        struct mtdarwin_surface_props p;
        if (i < 6)
            p = (struct mtdarwin_surface_props){ 1280, 720, 1, kCVPixelFormatType_420YpCbCr8BiPlanarVideoRange, "Preview.720p" };
        else
            p = (struct mtdarwin_surface_props){ 1920, 1080, 4, kCVPixelFormatType_32BGRA, "Photo.1080p" };
        g_surfaces[i] = IOSurfaceCreate(&p);
        if (!g_surfaces[i])
            abort();
    }
    for (int i = 4; i < 6; i++) {
        uint32_t old;
        IOSurfaceSetPurgeable(g_surfaces[i], kIOSurfacePurgeableVolatile, &old);
    }
}

NOINLINE void frame_cache_create(void)
{
    for (int i = 0; i < 4; i++) {
        if (vm_allocate(mach_task_self(), &g_caches[i], 2097152, VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE) != 0)
            abort();
        memset((void *)g_caches[i], 0x10 + i, 2097152);
    }
}

NOINLINE void frame_cache_make_purgeable(int n)
{
    for (int i = 0; i < n; i++) {
        int st = VM_PURGABLE_VOLATILE;
        vm_purgable_control(mach_task_self(), g_caches[i], VM_PURGABLE_SET_STATE, &st);
    }
}

NOINLINE void frame_cache_reacquire(void)
{
    for (int i = 0; i < 4; i++) {
        int st = VM_PURGABLE_NONVOLATILE;
        vm_purgable_control(mach_task_self(), g_caches[i], VM_PURGABLE_SET_STATE, &st);
    }
}

NOINLINE void camera_metadata_alloc(int k)
{
    char *m = malloc(512);
    memset(m, 'm', 512);
    mtdemo_sink(m);
    free(m);
    if (k % 100 == 0) {
        char *r = malloc(12288);
        memset(r, 'r', 12288);
        g_meta_ring[g_nmeta++] = r;
        mtdemo_sink(r);
    }
}

static void *metadata_thread(void *arg)
{
    for (int k = 0; k < 2000 * g_scale; k++)
        camera_metadata_alloc(k);
    return NULL;
}

int main(int argc, char **argv)
{
    struct mtdemo_args a = mtdemo_workload_args(argc, argv);
    g_scale = a.scale > 300 ? 300 : a.scale;
    mtdemo_sleep(a.delay);
    pthread_t th;
    pthread_create(&th, NULL, metadata_thread, NULL);
    pthread_setname_np(th, "metadata");

    camera_session_configure();
    frame_cache_create();
    frame_cache_make_purgeable(4);
    mtdarwin_memory_pressure();
    frame_cache_reacquire();
    frame_cache_make_purgeable(2);
    pthread_join(th, NULL);

    unsigned long bytes = 0;
    for (int i = 0; i < 8; i++)
        bytes += IOSurfaceGetAllocSize(g_surfaces[i]);
    mtdemo_sleep(a.linger);
    printf("done: camera_surfaces scale=%d surfaces=8 surface_bytes=%lu caches=4 metadata=%d\n", g_scale, bytes,
           2000 * g_scale);
    return 0;
}
