/*
 * scn_sqlite_cache — an SQLite page cache in purgeable memory, bouncing 0<->1.
 * Single-threaded, deterministic.
 *
 * Usage: scn_sqlite_cache [DELAY_SECONDS]   (optional sleep before any work; none if absent)
 * Output: one line "done: scn_sqlite_cache caches=4 rounds=50 volatile=200 nonvolatile=200 gets=100"
 * MTDEMO_VERBOSE=1 prints the ledger to stderr.
 *
 * 4 caches of 1 MiB (1048576 bytes) each.  EXACT calls:
 *  1. sqlite_pcache_create(): 4 x vm_allocate(mach_task_self(), &addr, 1048576,
 *       VM_FLAGS_ANYWHERE|VM_FLAGS_PURGABLE = 3) -> 4 purgeable objects created NONVOLATILE
 *       (4194304 bytes).  mach_vm_allocate / mach_vm_map: 0 calls.
 *  2. 50 rounds, r = 0..49; in each round:
 *       r even: sqlite3_db_release_memory() -> for each of the 4 caches
 *                 vm_purgable_control(SET_STATE, VOLATILE)           -> 4 x 0->1, caller sqlite3_db_release_memory
 *       r odd:  sqlite_pcache_unpin(cache) for each of the 4 caches
 *                 -> vm_purgable_control(SET_STATE, VOLATILE)         -> 4 x 0->1, caller sqlite_pcache_unpin
 *       then sqlite_pcache_fetch_page(cache, r) for each of the 4 caches:
 *                 r even: vm_purgable_control(GET_STATE) first (reads 1) -> 1 GET, caller sqlite_pcache_fetch_page
 *                 vm_purgable_control(SET_STATE, NONVOLATILE)         -> 1 x 1->0, caller sqlite_pcache_fetch_page
 *  3. sqlite_pcache_destroy(): 4 x vm_deallocate.
 *
 * Totals seen by a vm_purgable_control hook: 400 SET calls, 100 GET calls.
 *   0->1: 200 (209715200 B = 200 x 1 MiB): 100 from sqlite3_db_release_memory, 100 from sqlite_pcache_unpin
 *   1->0: 200 (209715200 B), all from sqlite_pcache_fetch_page
 *   no other transition (no stealing: memory pressure is never applied).
 * mach_vm_purgable_control: 0 calls.  madvise: 0 calls.  created_purgeable: 4 (vm_allocate).
 * Exit status 0 (1 if any read-back differs from the above).
 */
#include "mtdemo.h"
#include "mtdarwin.h"

#define NCACHES 4
#define CACHE_SIZE 1048576UL
#define ROUNDS 50

static unsigned long g_cache[NCACHES];
static int g_errors, g_gets, g_vol, g_nonvol;

static void expect(const char *what, long got, long want)
{
    if (got != want) {
        fprintf(stderr, "scn_sqlite_cache: %s = %ld, expected %ld\n", what, got, want);
        g_errors++;
    }
}

NOINLINE void sqlite_pcache_create(void)
{
    for (int i = 0; i < NCACHES; i++) {
        if (vm_allocate(mach_task_self(), &g_cache[i], CACHE_SIZE, VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE) != 0) {
            fprintf(stderr, "vm_allocate failed\n");
            exit(1);
        }
        memset((void *)g_cache[i], 0x11 * (i + 1), CACHE_SIZE);
    }
}

NOINLINE void sqlite3_db_release_memory(void)
{
    for (int i = 0; i < NCACHES; i++) {
        int st = VM_PURGABLE_VOLATILE;
        vm_purgable_control(mach_task_self(), g_cache[i], VM_PURGABLE_SET_STATE, &st);
        expect("release old", st, 0);
        g_vol++;
    }
}

NOINLINE void sqlite_pcache_unpin(unsigned long cache)
{
    int st = VM_PURGABLE_VOLATILE;
    vm_purgable_control(mach_task_self(), cache, VM_PURGABLE_SET_STATE, &st);
    expect("unpin old", st, 0);
    g_vol++;
}

NOINLINE void sqlite_pcache_fetch_page(unsigned long cache, int round)
{
    int st;
    if (round % 2 == 0) {
        st = -1;
        vm_purgable_control(mach_task_self(), cache, VM_PURGABLE_GET_STATE, &st);
        expect("get state", st, 1);
        g_gets++;
    }
    st = VM_PURGABLE_NONVOLATILE;
    vm_purgable_control(mach_task_self(), cache, VM_PURGABLE_SET_STATE, &st);
    expect("fetch old", st, 1);
    g_nonvol++;
    ((volatile unsigned char *)cache)[round * 64] ^= 1;
}

NOINLINE void sqlite_pcache_destroy(void)
{
    for (int i = 0; i < NCACHES; i++)
        vm_deallocate(mach_task_self(), g_cache[i], CACHE_SIZE);
}

int main(int argc, char **argv)
{
    mtdemo_leading_delay(argc, argv);
    sqlite_pcache_create();
    for (int r = 0; r < ROUNDS; r++) {
        if (r % 2 == 0)
            sqlite3_db_release_memory();
        else
            for (int i = 0; i < NCACHES; i++)
                sqlite_pcache_unpin(g_cache[i]);
        for (int i = 0; i < NCACHES; i++)
            sqlite_pcache_fetch_page(g_cache[i], r);
    }
    if (mtdemo_verbose()) {
        struct mtdarwin_ledger l;
        mtdarwin_ledger(&l);
        fprintf(stderr, "ledger: footprint=%llu nonvolatile=%llu volatile=%llu\n",
                (unsigned long long)l.footprint, (unsigned long long)l.purgeable_nonvolatile,
                (unsigned long long)l.purgeable_volatile);
    }
    sqlite_pcache_destroy();
    printf("done: scn_sqlite_cache caches=%d rounds=%d volatile=%d nonvolatile=%d gets=%d\n",
           NCACHES, ROUNDS, g_vol, g_nonvol, g_gets);
    return g_errors ? 1 : 0;
}
