/*
 * libmtmalloc.so — stand-in for Darwin's libmalloc (libsystem_malloc.dylib), for tests on Linux.
 * Not a real allocator for real programs: it exists so memtrace's malloc_logger path, its VM
 * event filtering and the purgeable tracer's "allocator's own madvise" rule can be exercised
 * against libmalloc's behaviour.  It sits on libmtdarwin (the kernel/libsyscall stand-in), as
 * libmalloc sits on libsystem_kernel.
 *
 * ZONE (one, malloc_default_zone(); thread-safe through one mutex, never held while logging)
 *   tiny   blocks <= 1008 B, small <= 16384 B: 16-byte quanta, a 16-byte header before each
 *          block, LIFO free lists per quantum count (a freed block is the next one handed out
 *          for its size class: what makes the realloc race reproducible).  Carved from 1 MiB
 *          regions mapped with libmtdarwin's mach_vm_map(mach_task_self(), ..., VM_FLAGS_ANYWHERE |
 *          VM_MAKE_TAG(VM_MEMORY_MALLOC_TINY 7 | VM_MEMORY_MALLOC_SMALL 2)), so __syscall_logger
 *          reports each region as libmalloc's own VM (16 | 128 | tag << 24).
 *   large  blocks > 16384 B: a region of their own (page-rounded), mach_vm_map with
 *          VM_MEMORY_MALLOC_LARGE (3); the block is the region's start (malloc(1 MiB) and its VM
 *          event share an address, as on Darwin).  Freed large blocks go to a cache of 4 after
 *          mtdarwin_madvise(MADV_FREE_REUSABLE 7); a malloc of the same page-rounded size takes
 *          one back after mtdarwin_madvise(MADV_FREE_REUSE 8) with no new VM event; a block
 *          pushed out of a full cache is mach_vm_deallocate'd (logged 32, no tag).
 *
 * malloc_logger (exported, NULL until a tracer sets it) is called exactly as libmalloc's
 * malloc.c calls it:
 *   malloc_zone_malloc   ALLOCATE|HAS_ZONE,          zone, size, 0, ptr       after the allocation
 *   malloc_zone_calloc   ALLOCATE|HAS_ZONE|CLEARED,  zone, n*size, 0, ptr     after
 *   malloc_zone_free     DEALLOCATE|HAS_ZONE,        zone, ptr, 0, 0          BEFORE the free
 *   malloc_zone_realloc  ALLOCATE|DEALLOCATE|HAS_ZONE, zone, old, size, new   AFTER the zone's
 *                        realloc, which has already freed the old block when it moved
 *   free(NULL) logs nothing; realloc(NULL, n) logs a realloc with old 0; realloc(p, 0) frees p and
 *   returns a minimum (16-byte) block, as Darwin's does; a realloc that fits the block's size
 *   class (or a large block's pages) stays in place.
 * malloc_size(ptr): the block's usable size (quanta * 16, or the large region's size), 0 for an
 * address that is not a live block.
 *
 * MEMORY PRESSURE: at load, the stand-in does what libdispatch's initialisation does for
 * libmalloc: it creates a DISPATCH_SOURCE_TYPE_MEMORYPRESSURE source whose handler calls
 * malloc_memory_event_handler(data) — with the mask iOS 17/18's libdispatch uses for it, MSL
 * status only (0xf0000000): WARN/CRITICAL/PROC_LIMIT notes never reach the handler.
 * mtmalloc_memory_events() reports what it received.
 */
#define _GNU_SOURCE
#include "mtmalloc.h"
#include "mtdarwin.h"

#include <pthread.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define NOINLINE __attribute__((noinline))

#define QUANTUM 16u
#define N_CLASSES (MTMALLOC_SMALL_MAX / QUANTUM + 1)
#define HEADER_MAGIC 0x6d746d61u   /* 'mtma' */
#define MAX_LARGE 4096
#define PAGE 4096ul

struct _malloc_zone_t {
    const char *zone_name;
};

struct header {
    uint32_t magic;
    uint32_t quanta;
    uint32_t free;
    uint32_t pad;
};

struct free_block {
    struct free_block *next;
};

struct region_cursor {
    unsigned long base;
    unsigned long used;
    unsigned tag;
};

struct large {
    unsigned long addr;
    unsigned long size;
    int live;       /* 1 in use, 0 cached (free), slot unused when addr == 0 */
    unsigned long cached_at;
};

EXPORT malloc_logger_t *malloc_logger;

static malloc_zone_t g_zone = { "DefaultMallocZone" };
static pthread_mutex_t g_zlock = PTHREAD_MUTEX_INITIALIZER;
static struct free_block *g_free[N_CLASSES];
static struct region_cursor g_tiny = { 0, 0, VM_MEMORY_MALLOC_TINY };
static struct region_cursor g_small = { 0, 0, VM_MEMORY_MALLOC_SMALL };
static struct large g_large[MAX_LARGE];
static unsigned long g_cache_clock;
static void (*g_realloc_window)(void *);
static void (*g_alloc_window)(void *);
static unsigned long g_events, g_last_event;

static void log_event(uint32_t type, uintptr_t a2, uintptr_t a3, uintptr_t result)
{
    malloc_logger_t *logger = __atomic_load_n(&malloc_logger, __ATOMIC_ACQUIRE);
    if (logger)
        logger(type, (uintptr_t)&g_zone, a2, a3, result, 0);
}

static unsigned long map_region(unsigned long size, unsigned tag)
{
    unsigned long long addr = 0;
    if (mach_vm_map(mach_task_self(), &addr, size, 0, VM_FLAGS_ANYWHERE | (int)VM_MAKE_TAG(tag), 0, 0, 0, 3, 7, 1)
        != KERN_SUCCESS)
        return 0;
    return (unsigned long)addr;
}

/* Caller holds g_zlock. */
static void *small_alloc_locked(size_t size)
{
    uint32_t quanta = (uint32_t)((size + QUANTUM - 1) / QUANTUM);
    if (quanta == 0)
        quanta = 1;
    struct free_block *b = g_free[quanta];
    if (b) {
        g_free[quanta] = b->next;
        struct header *h = (struct header *)b - 1;
        h->free = 0;
        return b;
    }
    struct region_cursor *rc = (quanta * QUANTUM <= MTMALLOC_TINY_MAX) ? &g_tiny : &g_small;
    unsigned long need = sizeof(struct header) + quanta * QUANTUM;
    if (rc->base == 0 || rc->used + need > MTMALLOC_REGION) {
        unsigned long base;
        pthread_mutex_unlock(&g_zlock);     /* the VM call logs: never under the zone lock */
        base = map_region(MTMALLOC_REGION, rc->tag);
        pthread_mutex_lock(&g_zlock);
        if (base == 0)
            return NULL;
        rc->base = base;
        rc->used = 0;
    }
    struct header *h = (struct header *)(rc->base + rc->used);
    rc->used += need;
    h->magic = HEADER_MAGIC;
    h->quanta = quanta;
    h->free = 0;
    return h + 1;
}

static struct header *small_header(const void *p)
{
    if (!p || ((uintptr_t)p & (QUANTUM - 1)))
        return NULL;
    struct header *h = (struct header *)p - 1;
    return h->magic == HEADER_MAGIC ? h : NULL;
}

static struct large *large_find_locked(unsigned long addr)
{
    for (int i = 0; i < MAX_LARGE; i++)
        if (g_large[i].addr == addr)
            return &g_large[i];
    return NULL;
}

static void *large_alloc(size_t size)
{
    unsigned long rounded = (size + PAGE - 1) & ~(PAGE - 1);
    pthread_mutex_lock(&g_zlock);
    for (int i = 0; i < MAX_LARGE; i++) {
        struct large *l = &g_large[i];
        if (l->addr && !l->live && l->size == rounded) {
            l->live = 1;
            pthread_mutex_unlock(&g_zlock);
            mtdarwin_madvise((void *)l->addr, l->size, MTD_MADV_FREE_REUSE);
            return (void *)l->addr;
        }
    }
    pthread_mutex_unlock(&g_zlock);
    unsigned long addr = map_region(rounded, VM_MEMORY_MALLOC_LARGE);
    if (addr == 0)
        return NULL;
    pthread_mutex_lock(&g_zlock);
    struct large *slot = large_find_locked(0);
    if (slot) {
        slot->addr = addr;
        slot->size = rounded;
        slot->live = 1;
    }
    pthread_mutex_unlock(&g_zlock);
    if (!slot) {
        mach_vm_deallocate(mach_task_self(), addr, rounded);
        return NULL;
    }
    return (void *)addr;
}

/* Into the cache (madvised reusable); the oldest cached block leaves when the cache is full. */
static void large_free(struct large *l)
{
    unsigned long evict_addr = 0, evict_size = 0;
    mtdarwin_madvise((void *)l->addr, l->size, MTD_MADV_FREE_REUSABLE);
    pthread_mutex_lock(&g_zlock);
    l->live = 0;
    l->cached_at = ++g_cache_clock;
    int cached = 0;
    struct large *oldest = NULL;
    for (int i = 0; i < MAX_LARGE; i++) {
        struct large *c = &g_large[i];
        if (c->addr && !c->live) {
            cached++;
            if (!oldest || c->cached_at < oldest->cached_at)
                oldest = c;
        }
    }
    if (cached > MTMALLOC_LARGE_CACHE && oldest) {
        evict_addr = oldest->addr;
        evict_size = oldest->size;
        memset(oldest, 0, sizeof *oldest);
    }
    pthread_mutex_unlock(&g_zlock);
    if (evict_addr)
        mach_vm_deallocate(mach_task_self(), evict_addr, evict_size);
}

static void *zone_alloc(size_t size)
{
    if (size > MTMALLOC_SMALL_MAX)
        return large_alloc(size);
    pthread_mutex_lock(&g_zlock);
    void *p = small_alloc_locked(size);
    pthread_mutex_unlock(&g_zlock);
    return p;
}

/* Large blocks first: one starts a region, where the bytes before it are not ours to read. */
static size_t block_size(const void *p)
{
    size_t n = 0;
    pthread_mutex_lock(&g_zlock);
    struct large *l = p ? large_find_locked((unsigned long)p) : NULL;
    if (l) {
        n = l->live ? l->size : 0;
    } else {
        struct header *h = small_header(p);
        n = (h && !h->free) ? (size_t)h->quanta * QUANTUM : 0;
    }
    pthread_mutex_unlock(&g_zlock);
    return n;
}

static void zone_free(void *p)
{
    pthread_mutex_lock(&g_zlock);
    struct large *l = large_find_locked((unsigned long)p);
    if (l) {
        int live = l->live;
        pthread_mutex_unlock(&g_zlock);
        if (live)
            large_free(l);
        return;
    }
    struct header *h = small_header(p);
    if (h) {
        if (!h->free) {
            struct free_block *b = (struct free_block *)p;
            h->free = 1;
            b->next = g_free[h->quanta];
            g_free[h->quanta] = b;
        }
    }
    pthread_mutex_unlock(&g_zlock);
}

/* The zone's realloc: in place when the block's size class (or pages) still fit, else a new
 * block, the contents copied, and the old block freed -- all before malloc_logger hears of it. */
static void *zone_realloc(void *p, size_t size)
{
    if (!p)
        return zone_alloc(size);
    if (size == 0) {
        zone_free(p);
        return zone_alloc(QUANTUM);
    }
    size_t old = block_size(p);
    if (old == 0)
        return NULL;
    int same;
    if (old > MTMALLOC_SMALL_MAX)
        same = size > MTMALLOC_SMALL_MAX && ((size + PAGE - 1) & ~(PAGE - 1)) == old;
    else
        same = size <= MTMALLOC_SMALL_MAX && (size + QUANTUM - 1) / QUANTUM == old / QUANTUM;
    if (same)
        return p;
    void *n = zone_alloc(size);
    if (!n)
        return NULL;
    memcpy(n, p, old < size ? old : size);
    zone_free(p);
    return n;
}

EXPORT malloc_zone_t *malloc_default_zone(void)
{
    return &g_zone;
}

EXPORT NOINLINE void *malloc_zone_malloc(malloc_zone_t *zone, size_t size)
{
    (void)zone;
    void *p = zone_alloc(size);
    void (*hook)(void *) = __atomic_load_n(&g_alloc_window, __ATOMIC_ACQUIRE);
    if (hook && p)
        hook(p);
    log_event(MALLOC_LOG_TYPE_ALLOCATE | MALLOC_LOG_TYPE_HAS_ZONE, (uintptr_t)size, 0, (uintptr_t)p);
    return p;
}

EXPORT NOINLINE void *malloc_zone_calloc(malloc_zone_t *zone, size_t count, size_t size)
{
    (void)zone;
    if (size && count > (size_t)-1 / size)
        return NULL;
    void *p = zone_alloc(count * size);
    if (p)
        memset(p, 0, count * size);
    void (*hook)(void *) = __atomic_load_n(&g_alloc_window, __ATOMIC_ACQUIRE);
    if (hook && p)
        hook(p);
    log_event(MALLOC_LOG_TYPE_ALLOCATE | MALLOC_LOG_TYPE_HAS_ZONE | MALLOC_LOG_TYPE_CLEARED,
              (uintptr_t)(count * size), 0, (uintptr_t)p);
    return p;
}

EXPORT NOINLINE void malloc_zone_free(malloc_zone_t *zone, void *ptr)
{
    (void)zone;
    if (!ptr)
        return;
    log_event(MALLOC_LOG_TYPE_DEALLOCATE | MALLOC_LOG_TYPE_HAS_ZONE, (uintptr_t)ptr, 0, 0);
    zone_free(ptr);
}

EXPORT NOINLINE void *malloc_zone_realloc(malloc_zone_t *zone, void *ptr, size_t size)
{
    (void)zone;
    void *n = zone_realloc(ptr, size);
    void (*hook)(void *) = __atomic_load_n(&g_realloc_window, __ATOMIC_ACQUIRE);
    if (hook && ptr && n != ptr)
        hook(ptr);
    log_event(MALLOC_LOG_TYPE_ALLOCATE | MALLOC_LOG_TYPE_DEALLOCATE | MALLOC_LOG_TYPE_HAS_ZONE,
              (uintptr_t)ptr, (uintptr_t)size, (uintptr_t)n);
    return n;
}

EXPORT NOINLINE size_t malloc_size(const void *ptr)
{
    return block_size(ptr);
}

EXPORT void mtmalloc_set_hooks(void (*realloc_window)(void *), void (*alloc_window)(void *))
{
    __atomic_store_n(&g_realloc_window, realloc_window, __ATOMIC_RELEASE);
    __atomic_store_n(&g_alloc_window, alloc_window, __ATOMIC_RELEASE);
}

EXPORT NOINLINE void malloc_memory_event_handler(unsigned long event)
{
    __atomic_add_fetch(&g_events, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&g_last_event, event, __ATOMIC_RELAXED);
}

EXPORT void mtmalloc_memory_events(unsigned long *count, unsigned long *last)
{
    if (count)
        *count = __atomic_load_n(&g_events, __ATOMIC_RELAXED);
    if (last)
        *last = __atomic_load_n(&g_last_event, __ATOMIC_RELAXED);
}

static void *g_dispatch_malloc_source;

static void dispatch_malloc_handler(void *context)
{
    malloc_memory_event_handler(dispatch_source_get_data(context));
}

/* libdispatch's _dispatch_memorypressure_init, for libmalloc, with iOS 17/18's mask. */
__attribute__((constructor)) static void register_malloc_pressure_source(void)
{
    void *s = dispatch_source_create(&_dispatch_source_type_memorypressure, 0, DISPATCH_MEMORYPRESSURE_MSL_STATUS,
                                     dispatch_get_global_queue(0, 0));
    if (!s)
        return;
    dispatch_set_context(s, s);
    dispatch_source_set_event_handler_f(s, dispatch_malloc_handler);
    dispatch_activate(s);
    g_dispatch_malloc_source = s;
}
