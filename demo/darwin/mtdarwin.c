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
 *   - Nesting as in xnu's libsyscall/mach/mach_vm.c: vm_allocate calls mach_vm_allocate,
 *     vm_deallocate calls mach_vm_deallocate, vm_purgable_control calls mach_vm_purgable_control
 *     (a hook on both entries sees the inner call too).
 *   - __syscall_logger (exported, NULL until a tracer sets it), called as libsyscall does:
 *       mach_vm_allocate (on success, not for the stack tag 30): 16 | tag<<24, task, size, 0, *addr
 *       mach_vm_map (on success): 16 | 128 | tag<<24, task, size, 0, *addr   (128 = "may be a mapped
 *           file or shared memory": mach_vm_map always sets it, which is how libmalloc's regions
 *           arrive tagged VM_MEMORY_MALLOC_* with 128)
 *       mach_vm_deallocate (before the call): 32, task, addr, size, 0
 *       mtdarwin_mmap (libsyscall's mmap wrapper, after the call, MAP_FAILED included):
 *           16 | (anonymous ? fd & 0xff000000 : 128), mach_task_self(), len, 0, result
 *       mtdarwin_munmap: 32, mach_task_self(), addr, len, 0
 *     arg1 is the target task as passed (mach_task_self_ = 0x103; any other value is another task).
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
 *     Returns KERN_SUCCESS (0).  vm_purgable_control calls mach_vm_purgable_control (xnu).
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
 *   mtdarwin_surface_destroy(s) (exported, noinline), which calls IOSurfaceClientRelease(client):
 *   munmap and the slot freed.
 *   Client layer (IOSurface.framework's private IOSurfaceClient*), nested as on a device:
 *   IOSurfaceCreate(props) = IOSurfaceClientCreateChild(NULL, props) wrapped (IOSurfaceClientCreate
 *   is the same); IOSurfaceClientCreateChild(parent_client, props) with a parent makes a child
 *   surface (its own memory, parent_id set) and is reached by mtdarwin_surface_create_child (a
 *   framework path that never calls IOSurfaceCreate).  Clients are reference counted: created with
 *   one reference (the surface object's); IOSurfaceClientLookup(id) and IOSurfaceClientRetain(c)
 *   add one; IOSurfaceClientRelease(c) drops one and destroys the surface only on the last.
 *   IOSurfaceClientGetID/AllocSize/Width/Height/BytesPerRow/PixelFormat read a client.
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
    uint32_t parent_id;     /* a child surface's parent (IOSurfaceClientCreateChild), else 0 */
    char name[64];
};

EXPORT unsigned int mach_task_self_ = 0x103;

/* libsyscall's VM logger (stack_logging_internal.h); a tracer sets it. */
typedef void (mtd_logger_t)(uint32_t type, uintptr_t arg1, uintptr_t arg2, uintptr_t arg3, uintptr_t result,
                            uint32_t skip);
EXPORT mtd_logger_t *__syscall_logger;

#define LOG_VM_ALLOCATE 16u
#define LOG_VM_DEALLOCATE 32u
#define LOG_MAPPED_FILE 128u
#define VM_FLAGS_ALIAS_MASK 0xff000000u
#define VM_MEMORY_STACK 30u

static void log_vm(uint32_t type, uintptr_t task, uintptr_t a2, uintptr_t a3, uintptr_t result)
{
    mtd_logger_t *logger = __atomic_load_n(&__syscall_logger, __ATOMIC_ACQUIRE);
    if (logger)
        logger(type, task, a2, a3, result, 0);
}

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

EXPORT NOINLINE int mach_vm_allocate(unsigned task, unsigned long long *addr, unsigned long long size, int flags)
{
    int kr = vm_alloc_common(addr, size, flags);
    uint32_t tag = (uint32_t)flags & VM_FLAGS_ALIAS_MASK;
    if (kr == KERN_SUCCESS && tag != (VM_MEMORY_STACK << 24))
        log_vm(LOG_VM_ALLOCATE | tag, task, (uintptr_t)size, 0, (uintptr_t)*addr);
    return kr;
}

/* xnu: vm_allocate is mach_vm_allocate with a vm_address_t. */
EXPORT NOINLINE int vm_allocate(unsigned task, unsigned long *addr, unsigned long size, int flags)
{
    if (!addr)
        return KERN_INVALID_ARGUMENT;
    unsigned long long a = *addr;
    int kr = mach_vm_allocate(task, &a, size, flags);
    *addr = (unsigned long)a;
    return kr;
}

EXPORT NOINLINE int mach_vm_map(unsigned task, unsigned long long *addr, unsigned long long size,
                                unsigned long long mask, int flags, unsigned object, unsigned long long offset,
                                int copy, int cur_prot, int max_prot, int inheritance)
{
    (void)mask; (void)offset; (void)copy; (void)cur_prot; (void)max_prot; (void)inheritance;
    if (object != 0)
        return KERN_INVALID_ARGUMENT;
    int kr = vm_alloc_common(addr, size, flags);
    uint32_t tag = (uint32_t)flags & VM_FLAGS_ALIAS_MASK;
    if (kr == KERN_SUCCESS && tag != (VM_MEMORY_STACK << 24))
        log_vm(LOG_VM_ALLOCATE | LOG_MAPPED_FILE | tag, task, (uintptr_t)size, 0, (uintptr_t)*addr);
    return kr;
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

EXPORT NOINLINE int mach_vm_deallocate(unsigned task, unsigned long long addr, unsigned long long size)
{
    log_vm(LOG_VM_DEALLOCATE, task, (uintptr_t)addr, (uintptr_t)size, 0);
    return vm_dealloc_common((unsigned long)addr);
}

EXPORT NOINLINE int vm_deallocate(unsigned task, unsigned long addr, unsigned long size)
{
    return mach_vm_deallocate(task, addr, size);
}

/* libsyscall's mmap wrapper: logged after the call, MAP_FAILED included.  An anonymous mapping
 * carries its VM tag in the fd argument (VM_MAKE_TAG), as on Darwin; Linux ignores fd there. */
EXPORT NOINLINE void *mtdarwin_mmap(void *addr, size_t len, int prot, int flags, int fd, long off)
{
    void *p = mmap(addr, len, prot, flags, (flags & MAP_ANONYMOUS) ? -1 : fd, off);
    uint32_t type = LOG_VM_ALLOCATE;
    if (flags & MAP_ANONYMOUS)
        type |= (uint32_t)fd & VM_FLAGS_ALIAS_MASK;
    else
        type |= LOG_MAPPED_FILE;
    log_vm(type, mach_task_self_, (uintptr_t)len, 0, (uintptr_t)p);
    return p;
}

EXPORT NOINLINE int mtdarwin_munmap(void *addr, size_t len)
{
    log_vm(LOG_VM_DEALLOCATE, mach_task_self_, (uintptr_t)addr, (uintptr_t)len, 0);
    return munmap(addr, len);
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

EXPORT NOINLINE int mach_vm_purgable_control(unsigned map, unsigned long long addr, int control, int *state)
{
    (void)map;
    return purgable_control_common((unsigned long)addr, control, state);
}

/* xnu: vm_purgable_control is mach_vm_purgable_control with a vm_offset_t. */
EXPORT NOINLINE int vm_purgable_control(unsigned map, unsigned long addr, int control, int *state)
{
    return mach_vm_purgable_control(map, (unsigned long long)addr, control, state);
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

/* The client object (IOSurfaceClientRef): what IOSurface.framework's private IOSurfaceClient*
 * functions take; one per surface, at the surface's index. */
struct surface_client {
    uint32_t magic;
    uint32_t index;
    int32_t refs;           /* IOSurfaceClientLookup/Retain add one; Release destroys at zero */
};
#define CLIENT_MAGIC 0x494f5343u /* 'IOSC' */
static struct surface_client g_clients[MAX_SURFACES];

static struct surface_client *as_client(const void *p)
{
    const struct surface_client *c = (const struct surface_client *)p;
    if (!c || c < &g_clients[0] || c >= &g_clients[MAX_SURFACES])
        return NULL;
    if (((const char *)c - (const char *)&g_clients[0]) % sizeof(struct surface_client) != 0)
        return NULL;
    return c->magic == CLIENT_MAGIC ? (struct surface_client *)c : NULL;
}

static struct surface *surface_of(struct surface_client *c)
{
    return c ? &g_surfaces[c->index] : NULL;
}

static struct surface_client *client_of(struct surface *s)
{
    return s ? &g_clients[s - g_surfaces] : NULL;
}

static struct surface_client *client_create(const struct mtdarwin_surface_props *pr, uint32_t parent_id)
{
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
    s->parent_id = parent_id;
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
    struct surface_client *c = client_of(s);
    c->magic = CLIENT_MAGIC;
    c->index = (uint32_t)(s - g_surfaces);
    c->refs = 1;
    pthread_mutex_unlock(&g_lock);
    return c;
}

/* IOSurface.framework's private client layer, as on a device: IOSurfaceCreate builds its client
 * with IOSurfaceClientCreateChild(NULL, props) (a top-level surface), so that hook fires nested
 * inside IOSurfaceCreate; child surfaces (planes, sub-allocations) come from
 * IOSurfaceClientCreateChild(parent, props), reached by framework paths that never call
 * IOSurfaceCreate (here: mtdarwin_surface_create_child). */
EXPORT NOINLINE void *IOSurfaceClientCreateChild(void *parent_client, void *properties)
{
    if (!parent_client)
        return client_create((const struct mtdarwin_surface_props *)properties, 0);
    pthread_mutex_lock(&g_lock);
    struct surface_client *parent = as_client(parent_client);
    uint32_t parent_id = parent ? surface_of(parent)->id : 0;
    pthread_mutex_unlock(&g_lock);
    if (!parent)
        return NULL;
    return client_create((const struct mtdarwin_surface_props *)properties, parent_id);
}

EXPORT NOINLINE void *IOSurfaceClientCreate(void *properties)
{
    return IOSurfaceClientCreateChild(NULL, properties);
}

/* Another reference to the client of a live surface, found by IOSurface ID (what IOSurfaceLookup
 * and XPC-received surfaces go through); NULL when no live surface has that ID. */
EXPORT NOINLINE void *IOSurfaceClientLookup(uint32_t id)
{
    pthread_mutex_lock(&g_lock);
    struct surface_client *found = NULL;
    for (int i = 0; i < MAX_SURFACES && id; i++)
        if (g_surfaces[i].magic == SURFACE_MAGIC && g_surfaces[i].id == id) {
            found = client_of(&g_surfaces[i]);
            found->refs++;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return found;
}

EXPORT NOINLINE void *IOSurfaceClientRetain(void *client)
{
    pthread_mutex_lock(&g_lock);
    struct surface_client *c = as_client(client);
    if (c)
        c->refs++;
    pthread_mutex_unlock(&g_lock);
    return client;
}

EXPORT NOINLINE uint32_t IOSurfaceClientGetID(void *client)
{
    struct surface_client *c = as_client(client);
    return c ? surface_of(c)->id : 0;
}

#define CLIENT_GETTER(ret, fn, field) \
    EXPORT NOINLINE ret fn(void *client) { struct surface_client *c = as_client(client); \
                                           return c ? (ret)surface_of(c)->field : (ret)0; }

CLIENT_GETTER(size_t, IOSurfaceClientGetAllocSize, alloc_size)
CLIENT_GETTER(size_t, IOSurfaceClientGetWidth, width)
CLIENT_GETTER(size_t, IOSurfaceClientGetHeight, height)
CLIENT_GETTER(size_t, IOSurfaceClientGetBytesPerRow, bytes_per_row)
CLIENT_GETTER(uint32_t, IOSurfaceClientGetPixelFormat, pixel_format)

EXPORT NOINLINE void *IOSurfaceCreate(void *properties)
{
    const struct mtdarwin_surface_props *pr = (const struct mtdarwin_surface_props *)properties;
    if (!pr || !pr->width || !pr->height || !pr->bytes_per_element)
        return NULL;
    return surface_of(IOSurfaceClientCreateChild(NULL, properties));
}

EXPORT NOINLINE void *mtdarwin_surface_create_child(void *parent_surface, void *properties)
{
    struct surface *parent = as_surface(parent_surface);
    if (!parent)
        return NULL;
    return surface_of(IOSurfaceClientCreateChild(client_of(parent), properties));
}

/* One reference to a client goes; on the last one the surface is destroyed and its memory unmapped. */
EXPORT NOINLINE void IOSurfaceClientRelease(void *client)
{
    pthread_mutex_lock(&g_lock);
    struct surface_client *c = as_client(client);
    if (!c || --c->refs > 0) {
        pthread_mutex_unlock(&g_lock);
        return;
    }
    struct surface *s = surface_of(c);
    void *base = s->base;
    size_t size = s->alloc_size;
    memset(s, 0, sizeof *s);
    memset(c, 0, sizeof *c);
    pthread_mutex_unlock(&g_lock);
    munmap(base, size);
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
    struct surface *s = as_surface(surface);
    if (s)
        IOSurfaceClientRelease(client_of(s));
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

/* ---------------- libdispatch: memory-pressure sources ----------------
 *
 * DISPATCH_SOURCE_TYPE_MEMORYPRESSURE (&_dispatch_source_type_memorypressure): a source created
 * with a mask of DISPATCH_MEMORYPRESSURE_* bits gets, for each kernel note, data = note & mask,
 * and its handler runs (here on a thread of its own, joined before mtdarwin_memorystatus_notify
 * returns so tests see the event before they go on).  Sources are delivered only once resumed
 * (dispatch_resume / dispatch_activate) and never after dispatch_source_cancel.
 * mtdarwin_memorystatus_notify(bits) is the kernel's NOTE_MEMORYSTATUS_* note.
 */
struct mtd_source_type { int kind; };
EXPORT const struct mtd_source_type _dispatch_source_type_memorypressure = { 1 };

#define MAX_SOURCES 64
struct mtd_source {
    int used;
    int active;
    int cancelled;
    unsigned long mask;
    unsigned long data;
    void *context;
    void (*handler)(void *);
};
static struct mtd_source g_sources[MAX_SOURCES];
static pthread_mutex_t g_dispatch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_delivery_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_global_queue;

static struct mtd_source *as_source(void *p)
{
    struct mtd_source *s = (struct mtd_source *)p;
    if (s < &g_sources[0] || s >= &g_sources[MAX_SOURCES] || !s->used)
        return NULL;
    return s;
}

EXPORT void *dispatch_get_global_queue(long identifier, unsigned long flags)
{
    (void)identifier; (void)flags;
    return &g_global_queue;
}

EXPORT void *dispatch_source_create(const void *type, uintptr_t handle, unsigned long mask, void *queue)
{
    (void)handle; (void)queue;
    if (type != &_dispatch_source_type_memorypressure)
        return NULL;
    pthread_mutex_lock(&g_dispatch_lock);
    struct mtd_source *s = NULL;
    for (int i = 0; i < MAX_SOURCES; i++)
        if (!g_sources[i].used) { s = &g_sources[i]; break; }
    if (s) {
        memset(s, 0, sizeof *s);
        s->used = 1;
        s->mask = mask;
    }
    pthread_mutex_unlock(&g_dispatch_lock);
    return s;
}

EXPORT void dispatch_set_context(void *object, void *context)
{
    struct mtd_source *s = as_source(object);
    if (s)
        s->context = context;
}

EXPORT void dispatch_source_set_event_handler_f(void *source, void (*handler)(void *))
{
    struct mtd_source *s = as_source(source);
    if (s)
        s->handler = handler;
}

EXPORT unsigned long dispatch_source_get_data(void *source)
{
    struct mtd_source *s = as_source(source);
    return s ? s->data : 0;
}

EXPORT void dispatch_resume(void *object)
{
    struct mtd_source *s = as_source(object);
    if (s)
        s->active = 1;
}

EXPORT void dispatch_activate(void *object)
{
    dispatch_resume(object);
}

EXPORT void dispatch_source_cancel(void *source)
{
    struct mtd_source *s = as_source(source);
    if (s)
        s->cancelled = 1;
}

static void *deliver(void *arg)
{
    struct mtd_source *s = (struct mtd_source *)arg;
    s->handler(s->context);
    return NULL;
}

EXPORT NOINLINE void mtdarwin_memorystatus_notify(unsigned long bits)
{
    pthread_mutex_lock(&g_delivery_lock);
    for (int i = 0; i < MAX_SOURCES; i++) {
        struct mtd_source *s = &g_sources[i];
        if (!s->used || !s->active || s->cancelled || !s->handler || !(s->mask & bits))
            continue;
        s->data = bits & s->mask;
        pthread_t t;
        if (pthread_create(&t, NULL, deliver, s) == 0)
            pthread_join(t, NULL);
    }
    pthread_mutex_unlock(&g_delivery_lock);
}

/* ---------------- os_proc_available_memory ----------------
 *
 * xnu's memorystatus_available_memory_internal: the bytes left before the process's limit, but
 * 0 for a process not managed by RunningBoard (a daemon) and 0 once the footprint is at or over
 * the limit.  The footprint is the stand-in ledger's (mtdarwin_ledger); the limit and the
 * managed flag are set with mtdarwin_set_memlimit (default: no limit, unmanaged -> 0).
 */
static uint64_t g_memlimit;
static int g_managed;

EXPORT void mtdarwin_set_memlimit(uint64_t limit_bytes, int managed)
{
    pthread_mutex_lock(&g_lock);
    g_memlimit = limit_bytes;
    g_managed = managed;
    pthread_mutex_unlock(&g_lock);
}

EXPORT size_t os_proc_available_memory(void)
{
    struct mtdarwin_ledger l;
    pthread_mutex_lock(&g_lock);
    ledger_locked(&l, NULL, NULL);
    uint64_t limit = g_memlimit;
    int managed = g_managed;
    pthread_mutex_unlock(&g_lock);
    if (!managed || limit == 0 || l.footprint >= limit)
        return 0;
    return (size_t)(limit - l.footprint);
}
