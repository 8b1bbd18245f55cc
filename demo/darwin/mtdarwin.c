/*
 * libmtdarwin.so — Darwin stand-in library (memtrace issue 3).  Not a real library: the name
 * "mtdarwin" is deliberately unlike any system library.
 *
 * Exports Darwin-named functions with xnu's semantics so the memtrace agents, which hook by
 * symbol name, can be tested on Linux.  Thread-safe: one pthread mutex guards all state.
 *
 * PURGEABLE OBJECTS (xnu vm_purgable.h / vm_object.c)
 *   - Created by mach_vm_allocate / vm_allocate / mach_vm_map with VM_FLAGS_PURGABLE (0x2): an
 *     anonymous mmap (size rounded up to 4096) registered as NONVOLATILE (0).  Without 0x2 the
 *     mapping is registered as a plain (non-purgeable) allocation.  VM_FLAGS_ANYWHERE is implied
 *     (the address is always chosen by the library); the VM tag in the top byte is ignored.
 *     mach_vm_map: object must be 0 (MACH_PORT_NULL) else KERN_INVALID_ARGUMENT; mask, offset,
 *     copy, protections and inheritance are ignored.
 *   - mach_vm_deallocate / vm_deallocate (addr = start of a registered object): munmap + unregister.
 *     Unknown address -> KERN_INVALID_ADDRESS.
 *   - vm_purgable_control / mach_vm_purgable_control(map, addr, control, *state): addr may be
 *     anywhere inside a registered object.  Unknown address -> KERN_INVALID_ADDRESS (1); a
 *     non-purgeable allocation -> KERN_INVALID_ARGUMENT (4); state NULL -> KERN_INVALID_ARGUMENT.
 *       GET_STATE (1):  *state = current state.  No change.
 *       SET_STATE (0) and SET_STATE_FROM_KERNEL (3): new = *state & 3 (3 = DENY ->
 *           KERN_INVALID_ARGUMENT).  *state is overwritten with the OLD state (vm_object.c).
 *           Transitions:  NONVOLATILE->VOLATILE, VOLATILE->NONVOLATILE: as asked.
 *                         any->EMPTY: contents discarded at once (pages dropped; reads as 0).
 *                         EMPTY->NONVOLATILE: "reacquire": old state read back is 2, object is
 *                           NONVOLATILE again, contents lost (zero).
 *                         EMPTY->VOLATILE: stays EMPTY (what's been emptied stays empty until
 *                           reacquired); old state read back 2.
 *                         same->same: no change, old state read back = same.
 *       PURGE_ALL (2): every VOLATILE object becomes EMPTY (same as mtdarwin_memory_pressure);
 *           *state untouched.
 *     Returns KERN_SUCCESS (0).  Both entries are thin wrappers over one internal function;
 *     neither calls the other, so a hook on one never sees the other's calls.
 *   - mtdarwin_memory_pressure(): the kernel steal.  Every VOLATILE object (purgeable VM objects
 *     AND IOSurfaces) becomes EMPTY without any call through the hooked entries; a later
 *     SET NONVOLATILE reads back 2 ("stolen").
 *   - mtdarwin_get_state(addr): current state of the object containing addr (0/1/2), -1 if
 *     unknown, without going through the hooked API.
 *
 * LEDGER (mtdarwin_ledger, and task_info TASK_VM_INFO)
 *   footprint             = bytes of NONVOLATILE purgeable objects + bytes of non-purgeable
 *                           allocations made through mach_vm_allocate/vm_allocate/mach_vm_map.
 *                           VOLATILE and EMPTY objects are "held but not counted".
 *   purgeable_nonvolatile = bytes of NONVOLATILE purgeable objects.
 *   purgeable_volatile    = bytes of VOLATILE purgeable objects (EMPTY objects count 0).
 *   reusable              = moved ONLY by mtdarwin_madvise: advice 5 (MADV_FREE) and
 *                           7 (MADV_FREE_REUSABLE) add len; 8 (MADV_FREE_REUSE) subtracts len
 *                           (clamped at 0).  Note: on real xnu MADV_FREE (5) does not feed the
 *                           reusable ledger; the stand-in follows the project brief (5 and 7 add).
 *   IOSurfaces are kernel (IOKit) memory and are NOT in this ledger.
 *   task_info(task, TASK_VM_INFO=22, info, *count) fills task_vm_info_data_t (xnu
 *   osfmk/mach/task_info.h, #pragma pack(4)) at the real offsets, in bytes:
 *       0 virtual_size (sum of all registered mapping sizes)   8 region_count (registered objects)
 *      12 page_size (4096)                                     80 reusable
 *     112 purgeable_volatile_virtual (= purgeable_volatile)   144 phys_footprint (= footprint)
 *     176 ledger_purgeable_nonvolatile                        192 ledger_purgeable_volatile
 *     all other fields 0.  *count (natural_t words) in: at least 42 required (rev2) else
 *     KERN_INVALID_ARGUMENT; fills min(*count, 89) words and sets *count to that.  Other
 *     flavors -> KERN_INVALID_ARGUMENT.
 *
 * MADVISE-LIKE ENTRY
 *   mtdarwin_madvise(addr, len, advice) — Darwin advice values: 4 MADV_DONTNEED (no ledger move;
 *   calls the real glibc madvise(addr, len, MADV_DONTNEED) — the ONLY libc madvise() call the
 *   library ever makes), 5/7 reusable += len, 8 reusable -= len; no syscall for 5/7/8.  Other
 *   advice -> -1/EINVAL.  Returns 0.  (Dropping pages of EMPTY objects uses syscall(SYS_madvise)
 *   directly, never the libc madvise symbol, so it is invisible to a libc-madvise hook.)
 *
 * IOSURFACE
 *   IOSurfaceCreate(props) with props = struct mtdarwin_surface_props* (mtdarwin.h).  Returns an
 *   opaque surface (NULL if props NULL, width/height/bpe 0 or out of slots: max 4096 live):
 *     bytes_per_row = round_up(width * bytes_per_element, 64)
 *     alloc_size    = round_up(bytes_per_row * height, 16384)
 *     id            = 1, 2, 3, ... in creation order (never reused in a process)
 *   memory = anonymous mmap of alloc_size; retain count 1; use count 0; purgeable state 0.
 *   The surface descriptor lives in a static table (IOSurfaceCreate itself never calls malloc).
 *   IOSurfaceSetPurgeable(s, new, *old): same state machine as above (new 0/1/2; 3 KeepCurrent
 *   = read only), *old = previous state; applied internally ("from the kernel"), it does NOT go
 *   through vm_purgable_control.  Returns 0, or KERN_INVALID_ARGUMENT for new > 3 / bad surface.
 *   CFRetain: retain count + 1.  CFRelease: retain count - 1; at 0 calls
 *   mtdarwin_surface_destroy(s) (exported, noinline) which munmaps and frees the slot.
 *   CFRetain/CFRelease on anything that is not a live surface are no-ops.
 *
 * CORE ANIMATION
 *   CA::Render::Shmem (ca_shmem.cpp): new_shmem(size) = mach_vm_allocate(VM_FLAGS_ANYWHERE |
 *   VM_FLAGS_PURGABLE) -> NONVOLATILE purgeable object; set_volatile(v, *old) calls
 *   mach_vm_purgable_control(SET_STATE, v ? VOLATILE : NONVOLATILE) — so the state-machine hook
 *   sees every set_volatile transition, with direct caller CA::Render::Shmem::set_volatile.
 *   CABackingStoreSetVolatile(store, v) (store = a Shmem*) calls CA::Render::Shmem::set_volatile
 *   and returns 1 if the contents survived (old state != EMPTY), else 0; -1 for NULL store.
 */
#define _GNU_SOURCE
#include "mtdarwin.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define NOINLINE __attribute__((noinline))

#define MAX_OBJECTS 8192
#define MAX_SURFACES 4096
#define SURFACE_MAGIC 0x494f5366u /* 'IOSf' */

struct vmobj {
    unsigned long start;
    unsigned long size;
    int used;
    int purgeable;
    int state;
};

struct surface {
    uint32_t magic;
    uint32_t id;
    int32_t retain;
    int32_t use_count;
    uint32_t width, height, bpe, pixel_format;
    size_t bytes_per_row;
    size_t alloc_size;
    void *base;
    int state;
    char name[64];
};

EXPORT unsigned int mach_task_self_ = 0x103;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vmobj g_objs[MAX_OBJECTS];
static struct surface g_surfaces[MAX_SURFACES];
static uint32_t g_next_surface_id = 1;
static uint64_t g_reusable;

static unsigned long page_round(unsigned long long n) { return (unsigned long)((n + 4095ULL) & ~4095ULL); }

static void drop_pages(unsigned long start, unsigned long size)
{
    /* Raw syscall: must not go through the libc madvise symbol a tracer may hook. */
    syscall(SYS_madvise, (void *)start, (size_t)size, MADV_DONTNEED);
}

static struct vmobj *find_obj_locked(unsigned long addr)
{
    for (int i = 0; i < MAX_OBJECTS; i++) {
        struct vmobj *o = &g_objs[i];
        if (o->used && addr >= o->start && addr < o->start + o->size)
            return o;
    }
    return NULL;
}

EXPORT unsigned int mach_task_self(void) { return mach_task_self_; }

static int vm_alloc_common(unsigned long long *addr, unsigned long long size, int flags)
{
    if (!addr || size == 0)
        return KERN_INVALID_ARGUMENT;
    unsigned long sz = page_round(size);
    void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return KERN_NO_SPACE;
    pthread_mutex_lock(&g_lock);
    struct vmobj *slot = NULL;
    for (int i = 0; i < MAX_OBJECTS; i++)
        if (!g_objs[i].used) { slot = &g_objs[i]; break; }
    if (!slot) {
        pthread_mutex_unlock(&g_lock);
        munmap(p, sz);
        return KERN_RESOURCE_SHORTAGE;
    }
    slot->used = 1;
    slot->start = (unsigned long)p;
    slot->size = sz;
    slot->purgeable = (flags & VM_FLAGS_PURGABLE) != 0;
    slot->state = VM_PURGABLE_NONVOLATILE;
    pthread_mutex_unlock(&g_lock);
    *addr = (unsigned long long)(unsigned long)p;
    return KERN_SUCCESS;
}

EXPORT int mach_vm_allocate(unsigned task, unsigned long long *addr, unsigned long long size, int flags)
{
    (void)task;
    return vm_alloc_common(addr, size, flags);
}

EXPORT int vm_allocate(unsigned task, unsigned long *addr, unsigned long size, int flags)
{
    (void)task;
    if (!addr)
        return KERN_INVALID_ARGUMENT;
    unsigned long long a = 0;
    int kr = vm_alloc_common(&a, size, flags);
    if (kr == KERN_SUCCESS)
        *addr = (unsigned long)a;
    return kr;
}

EXPORT int mach_vm_map(unsigned task, unsigned long long *addr, unsigned long long size,
                       unsigned long long mask, int flags, unsigned object, unsigned long long offset,
                       int copy, int cur_prot, int max_prot, int inheritance)
{
    (void)task; (void)mask; (void)offset; (void)copy; (void)cur_prot; (void)max_prot; (void)inheritance;
    if (object != 0)
        return KERN_INVALID_ARGUMENT;
    return vm_alloc_common(addr, size, flags);
}

static int vm_dealloc_common(unsigned long addr)
{
    pthread_mutex_lock(&g_lock);
    struct vmobj *o = find_obj_locked(addr);
    if (!o || o->start != addr) {
        pthread_mutex_unlock(&g_lock);
        return KERN_INVALID_ADDRESS;
    }
    unsigned long start = o->start, size = o->size;
    memset(o, 0, sizeof *o);
    pthread_mutex_unlock(&g_lock);
    munmap((void *)start, size);
    return KERN_SUCCESS;
}

EXPORT int mach_vm_deallocate(unsigned task, unsigned long long addr, unsigned long long size)
{
    (void)task; (void)size;
    return vm_dealloc_common((unsigned long)addr);
}

EXPORT int vm_deallocate(unsigned task, unsigned long addr, unsigned long size)
{
    (void)task; (void)size;
    return vm_dealloc_common(addr);
}

/* Apply a SET to an object/surface state; returns old state.  Caller holds the lock. */
static int apply_set_locked(int *cur, int new_state, unsigned long start, unsigned long size)
{
    int old = *cur;
    switch (new_state) {
    case VM_PURGABLE_NONVOLATILE:
        *cur = VM_PURGABLE_NONVOLATILE;
        break;
    case VM_PURGABLE_VOLATILE:
        if (old != VM_PURGABLE_EMPTY)
            *cur = VM_PURGABLE_VOLATILE;
        break;
    case VM_PURGABLE_EMPTY:
        if (old != VM_PURGABLE_EMPTY && start)
            drop_pages(start, size);
        *cur = VM_PURGABLE_EMPTY;
        break;
    }
    return old;
}

static void steal_locked(void)
{
    for (int i = 0; i < MAX_OBJECTS; i++) {
        struct vmobj *o = &g_objs[i];
        if (o->used && o->purgeable && o->state == VM_PURGABLE_VOLATILE) {
            drop_pages(o->start, o->size);
            o->state = VM_PURGABLE_EMPTY;
        }
    }
    for (int i = 0; i < MAX_SURFACES; i++) {
        struct surface *s = &g_surfaces[i];
        if (s->magic == SURFACE_MAGIC && s->state == VM_PURGABLE_VOLATILE) {
            drop_pages((unsigned long)s->base, s->alloc_size);
            s->state = VM_PURGABLE_EMPTY;
        }
    }
}

static int purgable_control_common(unsigned long addr, int control, int *state)
{
    if (control == VM_PURGABLE_PURGE_ALL) {
        pthread_mutex_lock(&g_lock);
        steal_locked();
        pthread_mutex_unlock(&g_lock);
        return KERN_SUCCESS;
    }
    if (!state)
        return KERN_INVALID_ARGUMENT;
    if (control != VM_PURGABLE_SET_STATE && control != VM_PURGABLE_GET_STATE &&
        control != VM_PURGABLE_SET_STATE_FROM_KERNEL)
        return KERN_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    struct vmobj *o = find_obj_locked(addr);
    int kr = KERN_SUCCESS;
    if (!o) {
        kr = KERN_INVALID_ADDRESS;
    } else if (!o->purgeable) {
        kr = KERN_INVALID_ARGUMENT;
    } else if (control == VM_PURGABLE_GET_STATE) {
        *state = o->state;
    } else {
        int new_state = *state & VM_PURGABLE_STATE_MASK;
        if (new_state == VM_PURGABLE_DENY)
            kr = KERN_INVALID_ARGUMENT;
        else
            *state = apply_set_locked(&o->state, new_state, o->start, o->size);
    }
    pthread_mutex_unlock(&g_lock);
    return kr;
}

EXPORT NOINLINE int vm_purgable_control(unsigned map, unsigned long addr, int control, int *state)
{
    (void)map;
    return purgable_control_common(addr, control, state);
}

EXPORT NOINLINE int mach_vm_purgable_control(unsigned map, unsigned long long addr, int control, int *state)
{
    (void)map;
    return purgable_control_common((unsigned long)addr, control, state);
}

EXPORT void mtdarwin_memory_pressure(void)
{
    pthread_mutex_lock(&g_lock);
    steal_locked();
    pthread_mutex_unlock(&g_lock);
}

EXPORT int mtdarwin_get_state(unsigned long addr)
{
    pthread_mutex_lock(&g_lock);
    struct vmobj *o = find_obj_locked(addr);
    int st = o ? o->state : -1;
    pthread_mutex_unlock(&g_lock);
    return st;
}

static void ledger_locked(struct mtdarwin_ledger *l, uint64_t *virt, uint32_t *regions)
{
    memset(l, 0, sizeof *l);
    uint64_t v = 0;
    uint32_t n = 0;
    for (int i = 0; i < MAX_OBJECTS; i++) {
        struct vmobj *o = &g_objs[i];
        if (!o->used)
            continue;
        n++;
        v += o->size;
        if (!o->purgeable) {
            l->footprint += o->size;
        } else if (o->state == VM_PURGABLE_NONVOLATILE) {
            l->footprint += o->size;
            l->purgeable_nonvolatile += o->size;
        } else if (o->state == VM_PURGABLE_VOLATILE) {
            l->purgeable_volatile += o->size;
        }
    }
    l->reusable = g_reusable;
    if (virt)
        *virt = v;
    if (regions)
        *regions = n;
}

EXPORT void mtdarwin_ledger(struct mtdarwin_ledger *out)
{
    if (!out)
        return;
    pthread_mutex_lock(&g_lock);
    ledger_locked(out, NULL, NULL);
    pthread_mutex_unlock(&g_lock);
}

static void put64(unsigned char *buf, size_t limit, size_t off, uint64_t v)
{
    if (off + 8 <= limit)
        memcpy(buf + off, &v, 8);
}

static void put32(unsigned char *buf, size_t limit, size_t off, uint32_t v)
{
    if (off + 4 <= limit)
        memcpy(buf + off, &v, 4);
}

EXPORT int task_info(unsigned task, int flavor, int *info, unsigned *count)
{
    (void)task;
    if (flavor != TASK_VM_INFO || !info || !count || *count < 42)
        return KERN_INVALID_ARGUMENT;
    unsigned words = *count < TASK_VM_INFO_COUNT ? *count : TASK_VM_INFO_COUNT;
    size_t limit = (size_t)words * 4;
    unsigned char *buf = (unsigned char *)info;
    memset(buf, 0, limit);
    struct mtdarwin_ledger l;
    uint64_t virt;
    uint32_t regions;
    pthread_mutex_lock(&g_lock);
    ledger_locked(&l, &virt, &regions);
    pthread_mutex_unlock(&g_lock);
    put64(buf, limit, 0, virt);                    /* virtual_size */
    put32(buf, limit, 8, regions);                 /* region_count */
    put32(buf, limit, 12, 4096);                   /* page_size */
    put64(buf, limit, 80, l.reusable);             /* reusable */
    put64(buf, limit, 112, l.purgeable_volatile);  /* purgeable_volatile_virtual */
    put64(buf, limit, 144, l.footprint);           /* phys_footprint */
    put64(buf, limit, 176, l.purgeable_nonvolatile); /* ledger_purgeable_nonvolatile */
    put64(buf, limit, 192, l.purgeable_volatile);  /* ledger_purgeable_volatile */
    *count = words;
    return KERN_SUCCESS;
}

EXPORT NOINLINE int mtdarwin_madvise(void *addr, size_t len, int advice)
{
    switch (advice) {
    case MTD_MADV_DONTNEED:
        return madvise(addr, len, MADV_DONTNEED);
    case MTD_MADV_FREE:
    case MTD_MADV_FREE_REUSABLE:
        pthread_mutex_lock(&g_lock);
        g_reusable += len;
        pthread_mutex_unlock(&g_lock);
        return 0;
    case MTD_MADV_FREE_REUSE:
        pthread_mutex_lock(&g_lock);
        g_reusable = g_reusable >= len ? g_reusable - len : 0;
        pthread_mutex_unlock(&g_lock);
        return 0;
    default:
        errno = EINVAL;
        return -1;
    }
}

/* ---------------- IOSurface ---------------- */

static struct surface *as_surface(const void *p)
{
    const struct surface *s = (const struct surface *)p;
    if (!s || s < &g_surfaces[0] || s >= &g_surfaces[MAX_SURFACES])
        return NULL;
    if (((const char *)s - (const char *)&g_surfaces[0]) % sizeof(struct surface) != 0)
        return NULL;
    if (s->magic != SURFACE_MAGIC)
        return NULL;
    return (struct surface *)s;
}

EXPORT NOINLINE void *IOSurfaceCreate(void *properties)
{
    const struct mtdarwin_surface_props *pr = (const struct mtdarwin_surface_props *)properties;
    if (!pr || !pr->width || !pr->height || !pr->bytes_per_element)
        return NULL;
    size_t bpr = ((size_t)pr->width * pr->bytes_per_element + 63) & ~(size_t)63;
    size_t alloc = (bpr * pr->height + 16383) & ~(size_t)16383;
    void *mem = mmap(NULL, alloc, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return NULL;
    pthread_mutex_lock(&g_lock);
    struct surface *s = NULL;
    for (int i = 0; i < MAX_SURFACES; i++)
        if (g_surfaces[i].magic != SURFACE_MAGIC) { s = &g_surfaces[i]; break; }
    if (!s) {
        pthread_mutex_unlock(&g_lock);
        munmap(mem, alloc);
        return NULL;
    }
    memset(s, 0, sizeof *s);
    s->magic = SURFACE_MAGIC;
    s->id = g_next_surface_id++;
    s->retain = 1;
    s->width = pr->width;
    s->height = pr->height;
    s->bpe = pr->bytes_per_element;
    s->pixel_format = pr->pixel_format;
    s->bytes_per_row = bpr;
    s->alloc_size = alloc;
    s->base = mem;
    s->state = VM_PURGABLE_NONVOLATILE;
    if (pr->name) {
        strncpy(s->name, pr->name, sizeof s->name - 1);
        s->name[sizeof s->name - 1] = 0;
    }
    pthread_mutex_unlock(&g_lock);
    return s;
}

#define SURF_GETTER(ret, fn, field) \
    EXPORT NOINLINE ret fn(void *surface) { struct surface *s = as_surface(surface); return s ? (ret)s->field : (ret)0; }

SURF_GETTER(size_t, IOSurfaceGetAllocSize, alloc_size)
SURF_GETTER(size_t, IOSurfaceGetWidth, width)
SURF_GETTER(size_t, IOSurfaceGetHeight, height)
SURF_GETTER(size_t, IOSurfaceGetBytesPerRow, bytes_per_row)
SURF_GETTER(size_t, IOSurfaceGetBytesPerElement, bpe)
SURF_GETTER(uint32_t, IOSurfaceGetPixelFormat, pixel_format)
SURF_GETTER(uint32_t, IOSurfaceGetID, id)
SURF_GETTER(int32_t, IOSurfaceGetUseCount, use_count)

EXPORT void *IOSurfaceGetBaseAddress(void *surface)
{
    struct surface *s = as_surface(surface);
    return s ? s->base : NULL;
}

EXPORT const char *mtdarwin_surface_name(void *surface)
{
    struct surface *s = as_surface(surface);
    return s ? s->name : NULL;
}

EXPORT NOINLINE void IOSurfaceIncrementUseCount(void *surface)
{
    pthread_mutex_lock(&g_lock);
    struct surface *s = as_surface(surface);
    if (s)
        s->use_count++;
    pthread_mutex_unlock(&g_lock);
}

EXPORT NOINLINE void IOSurfaceDecrementUseCount(void *surface)
{
    pthread_mutex_lock(&g_lock);
    struct surface *s = as_surface(surface);
    if (s && s->use_count > 0)
        s->use_count--;
    pthread_mutex_unlock(&g_lock);
}

EXPORT NOINLINE int IOSurfaceSetPurgeable(void *surface, uint32_t newState, uint32_t *oldState)
{
    if (newState > kIOSurfacePurgeableKeepCurrent)
        return KERN_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    struct surface *s = as_surface(surface);
    if (!s) {
        pthread_mutex_unlock(&g_lock);
        return KERN_INVALID_ARGUMENT;
    }
    int old;
    if (newState == kIOSurfacePurgeableKeepCurrent)
        old = s->state;
    else
        old = apply_set_locked(&s->state, (int)newState, (unsigned long)s->base, s->alloc_size);
    pthread_mutex_unlock(&g_lock);
    if (oldState)
        *oldState = (uint32_t)old;
    return KERN_SUCCESS;
}

EXPORT NOINLINE void mtdarwin_surface_destroy(void *surface)
{
    pthread_mutex_lock(&g_lock);
    struct surface *s = as_surface(surface);
    if (!s) {
        pthread_mutex_unlock(&g_lock);
        return;
    }
    void *base = s->base;
    size_t size = s->alloc_size;
    memset(s, 0, sizeof *s);
    pthread_mutex_unlock(&g_lock);
    munmap(base, size);
}

EXPORT NOINLINE const void *CFRetain(const void *cf)
{
    pthread_mutex_lock(&g_lock);
    struct surface *s = as_surface(cf);
    if (s)
        s->retain++;
    pthread_mutex_unlock(&g_lock);
    return cf;
}

EXPORT NOINLINE void CFRelease(const void *cf)
{
    pthread_mutex_lock(&g_lock);
    struct surface *s = as_surface(cf);
    int destroy = 0;
    if (s && --s->retain == 0)
        destroy = 1;
    pthread_mutex_unlock(&g_lock);
    if (destroy)
        mtdarwin_surface_destroy((void *)cf);
}
