/*
 * scn_ca_backing — Core Animation layer backing stores: volatile on backgrounding, stolen under
 * memory pressure, reacquired on return to foreground.  Single-threaded, deterministic.
 *
 * Usage: scn_ca_backing [DELAY_SECONDS]   (optional sleep before any work; none if absent)
 * Output: one line "done: scn_ca_backing layers=12 volatile=12 stolen=8 kept=4 bytes=7864320"
 * MTDEMO_VERBOSE=1 prints each step to stderr.
 *
 * 12 layers, layer i (0..11) has size 262144 * (1 + i % 4) bytes
 *   (256 KiB, 512 KiB, 768 KiB, 1 MiB, repeated 3x; total 7864320 bytes).
 *
 * Steps and EXACT calls (CA:: = CA::Render::Shmem::, all in libmtdarwin):
 *  1. ca_layer_backing_create(i) for i = 0..11  -> CA::new_shmem(size)
 *       -> 12 x mach_vm_allocate(flags = VM_FLAGS_ANYWHERE|VM_FLAGS_PURGABLE = 3): 12 purgeable
 *          objects created NONVOLATILE, 7864320 bytes.  (new_shmem also mallocs its 24-byte
 *          descriptor: 12 x malloc(24) with direct caller CA::Render::Shmem::new_shmem.)
 *       Each store is filled (memset) by ca_layer_draw.
 *  2. Backgrounding, wave 1 (layers 0..7, 5242880 bytes), 8 transitions 0->1:
 *       layers 0..3: ca_layer_backing_update(layer, 1) -> CA::set_volatile(true)      (4 calls)
 *       layers 4..7: ca_context_background_stores()   -> CABackingStoreSetVolatile(s, 1)
 *                                                      -> CA::set_volatile(true)      (4 calls)
 *  3. mtdarwin_memory_pressure(): the kernel steals the 8 VOLATILE stores (-> EMPTY).  No hooked
 *     entry is called.
 *  4. Backgrounding, wave 2 (layers 8..11, 2621440 bytes), 4 transitions 0->1:
 *       ca_layer_backing_update(layer, 1) -> CA::set_volatile(true)                 (4 calls)
 *  5. Foreground: ca_layer_backing_update(layer, 0) for layers 0..11 -> CA::set_volatile(false):
 *       layers 0..7 read back 2: 8 transitions 2->0 ("stolen", 5242880 bytes), redrawn by
 *       ca_layer_draw;  layers 8..11 read back 1: 4 transitions 1->0 (2621440 bytes).
 *  6. ca_layer_backing_destroy: CA::unref() -> 12 x mach_vm_deallocate.
 *
 * Totals seen by a mach_vm_purgable_control hook: 24 SET_STATE calls, 0 GET_STATE calls,
 *   0->1: 12 (7864320 B), 2->0: 8 (5242880 B), 1->0: 4 (2621440 B); every direct caller is
 *   CA::Render::Shmem::set_volatile.  vm_purgable_control: 0 calls.
 * CA::Render::Shmem::set_volatile hook: 24 calls; direct callers ca_layer_backing_update (20:
 *   4 + 4 in backgrounding, 12 in foreground) and CABackingStoreSetVolatile (4).
 * CABackingStoreSetVolatile hook: 4 calls (isVolatile=1), direct caller ca_context_background_stores.
 * CA::Render::Shmem::new_shmem: 12 calls, direct caller ca_layer_backing_create.
 * madvise: 0 calls.  IOSurfaceCreate: 0 calls.
 * Ledger at the end of step 4 (before foreground): footprint 0, purgeable_volatile 2621440,
 *   purgeable_nonvolatile 0; after step 5: footprint = purgeable_nonvolatile = 7864320.
 * Exit status 0 (1 if any read-back differs from the above).
 */
#include "mtdemo.h"
#include "mtdarwin.h"

#include <stdbool.h>

/* The C++ entry points, called directly by their mangled names (this = first argument). */
extern void *CA_Shmem_new_shmem(unsigned long size) __asm__("_ZN2CA6Render5Shmem9new_shmemEm");
extern bool CA_Shmem_set_volatile(void *self, bool v, int *old) __asm__("_ZN2CA6Render5Shmem12set_volatileEbPi");
extern void CA_Shmem_unref(void *self) __asm__("_ZN2CA6Render5Shmem5unrefEv");

#define NLAYERS 12

struct layer {
    void *store;
    unsigned long size;
    int last_old;
};

static struct layer g_layers[NLAYERS];
static int g_errors;

NOINLINE void ca_layer_draw(struct layer *l)
{
    memset(mtdarwin_shmem_data(l->store), 0x5a, l->size);
}

NOINLINE void ca_layer_backing_create(struct layer *l, unsigned long size)
{
    l->size = size;
    l->store = CA_Shmem_new_shmem(size);
    if (!l->store) {
        fprintf(stderr, "new_shmem failed\n");
        exit(1);
    }
    ca_layer_draw(l);
}

NOINLINE int ca_layer_backing_update(struct layer *l, int is_volatile)
{
    int old = -1;
    bool survived = CA_Shmem_set_volatile(l->store, is_volatile != 0, &old);
    l->last_old = old;
    if (!is_volatile && !survived)
        ca_layer_draw(l);
    return old;
}

NOINLINE void ca_context_background_stores(struct layer *ls, int n)
{
    for (int i = 0; i < n; i++)
        CABackingStoreSetVolatile(ls[i].store, 1);
}

NOINLINE void ca_layer_backing_destroy(struct layer *l)
{
    CA_Shmem_unref(l->store);
    l->store = NULL;
}

static void expect(const char *what, long got, long want)
{
    if (got != want) {
        fprintf(stderr, "scn_ca_backing: %s = %ld, expected %ld\n", what, got, want);
        g_errors++;
    }
}

int main(int argc, char **argv)
{
    mtdemo_leading_delay(argc, argv);
    int verbose = mtdemo_verbose();
    unsigned long total = 0;

    for (int i = 0; i < NLAYERS; i++) {
        ca_layer_backing_create(&g_layers[i], 262144UL * (1 + i % 4));
        total += g_layers[i].size;
    }
    for (int i = 0; i < 4; i++)
        expect("wave1 old", ca_layer_backing_update(&g_layers[i], 1), 0);
    ca_context_background_stores(&g_layers[4], 4);
    for (int i = 4; i < 8; i++)
        expect("wave1 state", mtdarwin_get_state((unsigned long)mtdarwin_shmem_data(g_layers[i].store)), 1);

    mtdarwin_memory_pressure();

    for (int i = 8; i < 12; i++)
        expect("wave2 old", ca_layer_backing_update(&g_layers[i], 1), 0);

    struct mtdarwin_ledger l;
    mtdarwin_ledger(&l);
    if (verbose)
        fprintf(stderr, "background ledger: footprint=%llu volatile=%llu nonvolatile=%llu\n",
                (unsigned long long)l.footprint, (unsigned long long)l.purgeable_volatile,
                (unsigned long long)l.purgeable_nonvolatile);

    int stolen = 0, kept = 0;
    for (int i = 0; i < NLAYERS; i++) {
        int old = ca_layer_backing_update(&g_layers[i], 0);
        if (verbose)
            fprintf(stderr, "foreground layer %d size %lu: %d->0\n", i, g_layers[i].size, old);
        if (old == 2)
            stolen++;
        else if (old == 1)
            kept++;
        expect("foreground old", old, i < 8 ? 2 : 1);
    }
    mtdarwin_ledger(&l);
    expect("footprint", (long)l.footprint, (long)total);
    if (verbose)
        fprintf(stderr, "foreground ledger: footprint=%llu\n", (unsigned long long)l.footprint);

    for (int i = 0; i < NLAYERS; i++)
        ca_layer_backing_destroy(&g_layers[i]);

    printf("done: scn_ca_backing layers=%d volatile=%d stolen=%d kept=%d bytes=%lu\n",
           NLAYERS, NLAYERS, stolen, kept, total);
    return g_errors ? 1 : 0;
}
