/*
 * mtdarwin.h — public interface of libmtdarwin.so, the Darwin stand-in library.
 *
 * libmtdarwin exports functions under their Darwin (xnu / IOSurface / QuartzCore) names with
 * xnu's semantics so that memtrace's real agents, which hook symbols by name, can be exercised
 * on Linux through Frida's local device.  Everything here is a simulation: no Mach kernel is
 * involved; "purgeable objects" are anonymous mmap()s tracked in a registry inside the library.
 *
 * See mtdarwin.c for the exact semantics of every entry (state machine, ledger, surfaces).
 */
#ifndef MTDARWIN_H
#define MTDARWIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* kern_return_t values */
#define KERN_SUCCESS            0
#define KERN_INVALID_ADDRESS    1
#define KERN_NO_SPACE           3
#define KERN_INVALID_ARGUMENT   4
#define KERN_RESOURCE_SHORTAGE  6

/* vm_purgable.h: controls */
#define VM_PURGABLE_SET_STATE              0
#define VM_PURGABLE_GET_STATE              1
#define VM_PURGABLE_PURGE_ALL              2
#define VM_PURGABLE_SET_STATE_FROM_KERNEL  3
/* vm_purgable.h: states (low two bits of *state; VM_PURGABLE_STATE_MASK) */
#define VM_PURGABLE_NONVOLATILE  0
#define VM_PURGABLE_VOLATILE     1
#define VM_PURGABLE_EMPTY        2
#define VM_PURGABLE_DENY         3
#define VM_PURGABLE_STATE_MASK   3

/* vm_statistics.h: allocation flags */
#define VM_FLAGS_FIXED     0x0
#define VM_FLAGS_ANYWHERE  0x1
#define VM_FLAGS_PURGABLE  0x2

/* Darwin madvise advice values (sys/mman.h on Darwin) accepted by mtdarwin_madvise */
#define MTD_MADV_DONTNEED       4
#define MTD_MADV_FREE           5
#define MTD_MADV_FREE_REUSABLE  7
#define MTD_MADV_FREE_REUSE     8

/* IOSurface purgeable states (IOSurfaceTypes.h) */
#define kIOSurfacePurgeableNonVolatile  0
#define kIOSurfacePurgeableVolatile     1
#define kIOSurfacePurgeableEmpty        2
#define kIOSurfacePurgeableKeepCurrent  3

/* FourCC pixel formats */
#define MTD_FOURCC(a, b, c, d) \
    (((uint32_t)(a) << 24) | ((uint32_t)(b) << 16) | ((uint32_t)(c) << 8) | (uint32_t)(d))
#define kCVPixelFormatType_32BGRA  0x42475241u /* 'BGRA' */
#define kCVPixelFormatType_420YpCbCr8BiPlanarVideoRange 0x34323076u /* '420v' */

/* task_info flavor */
#define TASK_VM_INFO        22
/* Number of natural_t (uint32) words of task_vm_info_data_t filled (rev6 = 89 words = 356 B). */
#define TASK_VM_INFO_COUNT  89

/* Stand-in for the CFDictionaryRef passed to IOSurfaceCreate. */
struct mtdarwin_surface_props {
    uint32_t width;
    uint32_t height;
    uint32_t bytes_per_element;
    uint32_t pixel_format;      /* FourCC, e.g. 'BGRA' 0x42475241, '420v' 0x34323076 */
    const char *name;           /* copied (up to 63 chars); may be NULL */
};

/* The ledger (what task_info(TASK_VM_INFO) reports, in bytes). */
struct mtdarwin_ledger {
    uint64_t footprint;              /* NONVOLATILE purgeable + non-purgeable allocated bytes */
    uint64_t purgeable_volatile;     /* bytes of VOLATILE purgeable objects (EMPTY counts 0) */
    uint64_t purgeable_nonvolatile;  /* bytes of NONVOLATILE purgeable objects */
    uint64_t reusable;               /* moved only by mtdarwin_madvise 5/7 (+len) and 8 (-len) */
};

/* ---- Mach VM ---- */
extern unsigned int mach_task_self_;
unsigned int mach_task_self(void);
int mach_vm_allocate(unsigned task, unsigned long long *addr, unsigned long long size, int flags);
int vm_allocate(unsigned task, unsigned long *addr, unsigned long size, int flags);
int mach_vm_map(unsigned task, unsigned long long *addr, unsigned long long size,
                unsigned long long mask, int flags, unsigned object, unsigned long long offset,
                int copy, int cur_prot, int max_prot, int inheritance);
int mach_vm_deallocate(unsigned task, unsigned long long addr, unsigned long long size);
int vm_deallocate(unsigned task, unsigned long addr, unsigned long size);
int vm_purgable_control(unsigned map, unsigned long addr, int control, int *state);
int mach_vm_purgable_control(unsigned map, unsigned long long addr, int control, int *state);
int task_info(unsigned task, int flavor, int *info, unsigned *count);

/* ---- libsyscall's VM logging (mach_vm_map, mmap) ---- */
void *mtdarwin_mmap(void *addr, size_t len, int prot, int flags, int fd, long off);
int mtdarwin_munmap(void *addr, size_t len);
#define VM_MAKE_TAG(tag) ((unsigned)(tag) << 24)
#define VM_MEMORY_MALLOC_SMALL  2
#define VM_MEMORY_MALLOC_LARGE  3
#define VM_MEMORY_MALLOC_TINY   7
#define VM_MEMORY_SQLITE        62
#define VM_MEMORY_IOSURFACE     88

/* ---- libdispatch memory-pressure sources (DISPATCH_SOURCE_TYPE_MEMORYPRESSURE) ---- */
#define DISPATCH_MEMORYPRESSURE_NORMAL               0x01
#define DISPATCH_MEMORYPRESSURE_WARN                 0x02
#define DISPATCH_MEMORYPRESSURE_CRITICAL             0x04
#define DISPATCH_MEMORYPRESSURE_PROC_LIMIT_WARN      0x10
#define DISPATCH_MEMORYPRESSURE_PROC_LIMIT_CRITICAL  0x20
#define DISPATCH_MEMORYPRESSURE_MSL_STATUS           0xf0000000ul
extern const struct mtd_source_type _dispatch_source_type_memorypressure;
void *dispatch_get_global_queue(long identifier, unsigned long flags);
void *dispatch_source_create(const void *type, uintptr_t handle, unsigned long mask, void *queue);
void dispatch_set_context(void *object, void *context);
void dispatch_source_set_event_handler_f(void *source, void (*handler)(void *));
unsigned long dispatch_source_get_data(void *source);
void dispatch_resume(void *object);
void dispatch_activate(void *object);
void dispatch_source_cancel(void *source);
size_t os_proc_available_memory(void);

/* ---- stand-in only (not Darwin API) ---- */
void mtdarwin_memorystatus_notify(unsigned long bits);
void mtdarwin_set_memlimit(uint64_t limit_bytes, int managed);
void mtdarwin_memory_pressure(void);
int mtdarwin_get_state(unsigned long addr);
void mtdarwin_ledger(struct mtdarwin_ledger *out);
int mtdarwin_madvise(void *addr, size_t len, int advice);
void mtdarwin_surface_destroy(void *surface);
const char *mtdarwin_surface_name(void *surface);

/* ---- IOSurface ---- */
void *IOSurfaceCreate(void *properties);
size_t IOSurfaceGetAllocSize(void *surface);
size_t IOSurfaceGetWidth(void *surface);
size_t IOSurfaceGetHeight(void *surface);
size_t IOSurfaceGetBytesPerRow(void *surface);
size_t IOSurfaceGetBytesPerElement(void *surface);
uint32_t IOSurfaceGetPixelFormat(void *surface);
uint32_t IOSurfaceGetID(void *surface);
void *IOSurfaceGetBaseAddress(void *surface);
void IOSurfaceIncrementUseCount(void *surface);
void IOSurfaceDecrementUseCount(void *surface);
int32_t IOSurfaceGetUseCount(void *surface);
int IOSurfaceSetPurgeable(void *surface, uint32_t newState, uint32_t *oldState);
void *IOSurfaceClientCreate(void *properties);
void *IOSurfaceClientCreateChild(void *parent_client, void *properties);
uint32_t IOSurfaceClientGetID(void *client);
size_t IOSurfaceClientGetAllocSize(void *client);
size_t IOSurfaceClientGetWidth(void *client);
size_t IOSurfaceClientGetHeight(void *client);
size_t IOSurfaceClientGetBytesPerRow(void *client);
uint32_t IOSurfaceClientGetPixelFormat(void *client);
void *IOSurfaceClientLookup(uint32_t id);
void *IOSurfaceClientRetain(void *client);
void IOSurfaceClientRelease(void *client);
void *mtdarwin_surface_create_child(void *parent_surface, void *properties);
const void *CFRetain(const void *cf);
void CFRelease(const void *cf);

/* ---- Core Animation (C entry; the C++ CA::Render::Shmem class is in ca_shmem.cpp) ---- */
int CABackingStoreSetVolatile(void *store, int isVolatile);
/* C bridges to CA::Render::Shmem for C programs (each calls the C++ method). */
void *mtdarwin_shmem_new(unsigned long size);
void *mtdarwin_shmem_new_port(unsigned int port, unsigned long size);
int mtdarwin_shmem_set_volatile(void *shmem, int isVolatile, int *old_state);
void *mtdarwin_shmem_data(void *shmem);
unsigned long mtdarwin_shmem_size(void *shmem);
void mtdarwin_shmem_release(void *shmem);

#ifdef __cplusplus
}
#endif

#endif /* MTDARWIN_H */
