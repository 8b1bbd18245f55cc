/*
 * huge_zone: a program's own malloc zone handing out address ranges far larger than any memory
 * (as a zone that only reserves address space may), so that memtrace's 64-bit figures pass 2^53,
 * where a JavaScript Number stops being exact.  Each block is logged to malloc_logger exactly as
 * libmalloc's malloc_zone_malloc and malloc_zone_free log a zone's calls (stand-in libmtmalloc);
 * the addresses are never touched.
 *   huge_reserve  3 blocks of 2^52 + 2, 2^52 + 3 and 2^52 + 4 bytes: 3 * 2^52 + 9 in all (odd, so no
 *                 double holds it); then 1.5 s with all three live (periodic drains see them)
 *   huge_release  the first block freed: 2^53 + 7 bytes stay live to the end (odd again)
 * Prints "huge done".
 */
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "mtmalloc.h"

#define NOINLINE __attribute__((noinline))
#define HUGE_BASE (1ull << 52)
#define FAKE_BLOCK(i) ((uintptr_t) 0x7e0000000000ull + (uintptr_t) (i) * 0x100000ull)

static void log_zone(uint32_t type, uintptr_t a2, uintptr_t a3, uintptr_t result)
{
    malloc_logger_t *logger = __atomic_load_n(&malloc_logger, __ATOMIC_ACQUIRE);
    if (logger)
        logger(type, (uintptr_t) malloc_default_zone(), a2, a3, result, 0);
}

static volatile int n_blocks = 3;      /* one call site for all three: the loop is not unrolled */

static NOINLINE void huge_reserve(void)
{
    for (int i = 0; i < n_blocks; i++)
        log_zone(MALLOC_LOG_TYPE_ALLOCATE | MALLOC_LOG_TYPE_HAS_ZONE, HUGE_BASE + 2 + i, 0, FAKE_BLOCK(i));
}

static NOINLINE void huge_release(void)
{
    log_zone(MALLOC_LOG_TYPE_DEALLOCATE | MALLOC_LOG_TYPE_HAS_ZONE, FAKE_BLOCK(0), 0, 0);
}

int main(void)
{
    huge_reserve();
    struct timespec pause = { 1, 500000000 };
    nanosleep(&pause, NULL);
    huge_release();
    printf("huge done\n");
    return 0;
}
