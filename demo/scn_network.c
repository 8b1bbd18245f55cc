/*
 * scn_network — a network stack emptying purgeable segments (0->2) and reacquiring them (2->0),
 * polling their state (GET), and recycling buffers with madvise.  Single-threaded, deterministic.
 *
 * Usage: scn_network [DELAY_SECONDS]   (optional sleep before any work; none if absent)
 * Output: one line "done: scn_network segments=6 rounds=3 emptied=18 reacquired=18 gets=36 reusable=327680"
 *
 * EXACT calls:
 *  1. nw_segment_create(): 6 x mach_vm_map(task, &addr, 65536, 0, VM_FLAGS_ANYWHERE|VM_FLAGS_PURGABLE = 3,
 *       object 0, ...) -> 6 purgeable objects of 65536 bytes, NONVOLATILE (393216 bytes).
 *       mach_vm_allocate / vm_allocate: 0 calls.
 *  2. 3 rounds; each round, for each of the 6 segments:
 *       nw_segment_fill      (memset only)
 *       nw_segment_poll_state -> mach_vm_purgable_control(GET_STATE) (reads 0)   1 GET
 *       nw_segment_empty      -> mach_vm_purgable_control(SET_STATE, EMPTY)     0->2, caller nw_segment_empty
 *       nw_segment_poll_state -> mach_vm_purgable_control(GET_STATE) (reads 2)   1 GET
 *       nw_segment_reacquire  -> mach_vm_purgable_control(SET_STATE, NONVOLATILE) 2->0, caller nw_segment_reacquire
 *     Totals (mach_vm_purgable_control): 36 SET, 36 GET; 0->2: 18 (1179648 B), 2->0: 18 (1179648 B).
 *     vm_purgable_control: 0 calls.
 *  3. nw_buffer_recycle() on a separate plain mmap of 262144 bytes (not purgeable), Darwin advice via
 *     libmtdarwin's mtdarwin_madvise (ledger "reusable" only, no syscall), each call len 65536:
 *       advice 7 (MADV_FREE_REUSABLE) x 4, advice 5 (MADV_FREE) x 3, advice 8 (MADV_FREE_REUSE) x 2
 *     -> mtdarwin_madvise: 9 calls, direct caller nw_buffer_recycle; reusable ledger ends at
 *        (4 + 3 - 2) x 65536 = 327680.  mtdarwin_madvise(…, 4) is never called, so libmtdarwin makes
 *        no libc madvise() call here.
 *  4. nw_buffer_trim() on a separate plain mmap of 1048576 bytes: real glibc madvise() with Linux
 *     advice values, each call len 65536 at distinct page-aligned offsets, direct caller nw_buffer_trim:
 *       MADV_FREE (8) x 2, MADV_DONTNEED (4) x 3, MADV_COLD (20) x 1, MADV_PAGEOUT (21) x 1
 *     -> libc madvise: exactly 7 calls (return values ignored: COLD/PAGEOUT may fail with EINVAL on
 *        old kernels, the call still happens).
 *  5. Segments are released with 6 x mach_vm_deallocate; the two plain buffers with munmap.
 * Ledger at the end (before release): purgeable_nonvolatile = footprint = 393216, reusable = 327680.
 * Exit status 0 (1 if any read-back differs from the above).
 */
#include "mtdemo.h"
#include "mtdarwin.h"

#include <sys/mman.h>

#ifndef MADV_COLD
#define MADV_COLD 20
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

#define NSEG 6
#define SEG_SIZE 65536ULL
#define ROUNDS 3

static unsigned long long g_seg[NSEG];
static int g_errors, g_gets, g_emptied, g_reacq;

static void expect(const char *what, long got, long want)
{
    if (got != want) {
        fprintf(stderr, "scn_network: %s = %ld, expected %ld\n", what, got, want);
        g_errors++;
    }
}

NOINLINE void nw_segment_create(void)
{
    for (int i = 0; i < NSEG; i++)
        if (mach_vm_map(mach_task_self(), &g_seg[i], SEG_SIZE, 0, VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE,
                        0, 0, 0, 3, 7, 1) != 0) {
            fprintf(stderr, "mach_vm_map failed\n");
            exit(1);
        }
}

NOINLINE void nw_segment_fill(unsigned long long seg, int round)
{
    memset((void *)(unsigned long)seg, 'a' + round, SEG_SIZE);
}

NOINLINE int nw_segment_poll_state(unsigned long long seg)
{
    int st = -1;
    mach_vm_purgable_control(mach_task_self(), seg, VM_PURGABLE_GET_STATE, &st);
    g_gets++;
    return st;
}

NOINLINE void nw_segment_empty(unsigned long long seg)
{
    int st = VM_PURGABLE_EMPTY;
    mach_vm_purgable_control(mach_task_self(), seg, VM_PURGABLE_SET_STATE, &st);
    expect("empty old", st, 0);
    g_emptied++;
}

NOINLINE void nw_segment_reacquire(unsigned long long seg)
{
    int st = VM_PURGABLE_NONVOLATILE;
    mach_vm_purgable_control(mach_task_self(), seg, VM_PURGABLE_SET_STATE, &st);
    expect("reacquire old", st, 2);
    expect("contents lost", ((unsigned char *)(unsigned long)seg)[100], 0);
    g_reacq++;
}

NOINLINE void nw_buffer_recycle(unsigned char *buf)
{
    for (int i = 0; i < 4; i++)
        mtdarwin_madvise(buf + i * 65536, 65536, MTD_MADV_FREE_REUSABLE);
    for (int i = 0; i < 3; i++)
        mtdarwin_madvise(buf + i * 65536, 65536, MTD_MADV_FREE);
    for (int i = 0; i < 2; i++)
        mtdarwin_madvise(buf + i * 65536, 65536, MTD_MADV_FREE_REUSE);
}

NOINLINE void nw_buffer_trim(unsigned char *buf)
{
    madvise(buf + 0 * 65536, 65536, MADV_FREE);
    madvise(buf + 1 * 65536, 65536, MADV_FREE);
    madvise(buf + 2 * 65536, 65536, MADV_DONTNEED);
    madvise(buf + 3 * 65536, 65536, MADV_DONTNEED);
    madvise(buf + 4 * 65536, 65536, MADV_DONTNEED);
    madvise(buf + 5 * 65536, 65536, MADV_COLD);
    madvise(buf + 6 * 65536, 65536, MADV_PAGEOUT);
}

int main(int argc, char **argv)
{
    mtdemo_leading_delay(argc, argv);
    nw_segment_create();
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < NSEG; i++) {
            nw_segment_fill(g_seg[i], r);
            expect("poll before", nw_segment_poll_state(g_seg[i]), 0);
            nw_segment_empty(g_seg[i]);
            expect("poll after", nw_segment_poll_state(g_seg[i]), 2);
            nw_segment_reacquire(g_seg[i]);
        }
    }
    unsigned char *rbuf = mmap(NULL, 262144, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *tbuf = mmap(NULL, 1048576, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (rbuf == MAP_FAILED || tbuf == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(rbuf, 1, 262144);
    memset(tbuf, 2, 1048576);
    nw_buffer_recycle(rbuf);
    nw_buffer_trim(tbuf);

    struct mtdarwin_ledger l;
    mtdarwin_ledger(&l);
    expect("reusable", (long)l.reusable, 327680);
    expect("footprint", (long)l.footprint, 393216);
    if (mtdemo_verbose())
        fprintf(stderr, "ledger: footprint=%llu reusable=%llu\n",
                (unsigned long long)l.footprint, (unsigned long long)l.reusable);

    for (int i = 0; i < NSEG; i++)
        mach_vm_deallocate(mach_task_self(), g_seg[i], SEG_SIZE);
    munmap(rbuf, 262144);
    munmap(tbuf, 1048576);
    printf("done: scn_network segments=%d rounds=%d emptied=%d reacquired=%d gets=%d reusable=%llu\n",
           NSEG, ROUNDS, g_emptied, g_reacq, g_gets, (unsigned long long)l.reusable);
    return g_errors ? 1 : 0;
}
