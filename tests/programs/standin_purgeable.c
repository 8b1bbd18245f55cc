/*
 * The purgeable tracer's Darwin details on the stand-in (libmtdarwin + libmtmalloc):
 *   - both overloads of CA::Render::Shmem::new_shmem (size; port + size), through the C bridges;
 *   - the allocator's own madvise (libmtmalloc's large cache: REUSABLE on free, REUSE on reuse)
 *     next to the app's own (app_recycle);
 *   - a transition reached through a frame whose saved frame pointer carries Swift's async bit.
 * Prints "done" and exits.
 */
#include <stdio.h>
#include <string.h>

#include "mtdarwin.h"
#include "mtmalloc.h"

#define NOINLINE __attribute__((noinline))
#define MIB (1024 * 1024)

static NOINLINE void create_layers(void)
{
    mtdarwin_shmem_new(65536);
    mtdarwin_shmem_new(65536);
    mtdarwin_shmem_new_port(0, 131072);
    mtdarwin_shmem_new_port(7, 4096);     /* another port: the stand-in maps only MACH_PORT_NULL */
}

static NOINLINE void allocator_churn(void)
{
    malloc_zone_t *z = malloc_default_zone();
    void *a = malloc_zone_malloc(z, MIB);
    memset(a, 1, MIB);
    malloc_zone_free(z, a);                /* libmtmalloc: madvise REUSABLE, cached */
    void *b = malloc_zone_malloc(z, MIB);  /* the cached block back: madvise REUSE */
    malloc_zone_free(z, b);
}

static NOINLINE void app_recycle(void *p, size_t len)
{
    mtdarwin_madvise(p, len, MTD_MADV_FREE_REUSABLE);
}

static NOINLINE void set_in_async(unsigned long long addr)
{
    int state = VM_PURGABLE_VOLATILE;
    vm_purgable_control(mach_task_self(), (unsigned long)addr, VM_PURGABLE_SET_STATE, &state);
}

/* Swift sets bit 60 of the frame pointer an async frame saves; the walk must clear it to go on. */
static NOINLINE void swift_like_async_frame(unsigned long long addr)
{
    volatile unsigned long *fp = (volatile unsigned long *)__builtin_frame_address(0);
    unsigned long saved = fp[0];
    fp[0] = saved | (1UL << 60);
    set_in_async(addr);
    fp[0] = saved;
}

static NOINLINE void async_outer(unsigned long long addr)
{
    swift_like_async_frame(addr);
}

int main(void)
{
    create_layers();
    allocator_churn();
    unsigned long long addr = 0;
    vm_allocate(mach_task_self(), (unsigned long *)&addr, 65536, VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE);
    app_recycle((void *)(unsigned long)addr, 65536);
    async_outer(addr);
    puts("done");
    return 0;
}
