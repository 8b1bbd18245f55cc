/* The Darwin stand-in's Mach thread and VM calls (demo/darwin/mtmach.c): what memtrace stops the
 * world with on a device -- around every patch and for the leak scan (cmodule/world.c built with
 * MT_DARWIN) -- and reads memory with (cmodule/leaks.c), with xnu's semantics and struct layouts,
 * implemented on Linux so the Darwin path runs in tests.  Kept apart from mtdarwin.c (the
 * IOSurface / purgeable stand-in). */
#ifndef MTMACH_H
#define MTMACH_H

#include <stdint.h>

typedef uint32_t mach_port_t;
typedef int kern_return_t;

#define KERN_SUCCESS 0
#define KERN_INVALID_ADDRESS 1
#define KERN_INVALID_ARGUMENT 4
#define KERN_PROTECTION_FAILURE 2
#define KERN_FAILURE 5
#define KERN_INVALID_NAME 15
#define MACH_SEND_INVALID_DEST 0x10000003

#define x86_THREAD_STATE64 4
#define x86_THREAD_STATE64_COUNT 42      /* 21 u64: rax rbx rcx rdx rdi rsi rbp rsp r8-r15 rip rflags cs fs gs */
#define VM_MEMORY_STACK 30
#define VM_MEMORY_MALLOC_TINY 7
#define VM_REGION_SUBMAP_INFO_COUNT_64 19

/* vm_region_submap_info_64, #pragma pack(4) as in <mach/vm_region.h>: the 8-byte offset sits at
 * byte 12 with no padding, so user_tag is the sixth 32-bit word (word 5), not the fifth. */
#pragma pack(push, 4)
typedef struct {
  int protection;
  int max_protection;
  unsigned int inheritance;
  unsigned long long offset;
  unsigned int user_tag;
  unsigned int pages_resident;
  unsigned int pages_shared_now_private;
  unsigned int pages_swapped_out;
  unsigned int pages_dirtied;
  unsigned int ref_count;
  unsigned short shadow_depth;
  unsigned char external_pager;
  unsigned char share_mode;
  int is_submap;
  int behavior;
  unsigned int object_id;
  unsigned short user_wired_count;
  unsigned int pages_reusable;
  unsigned long long object_id_full;
} vm_region_submap_info_data_64_t;
#pragma pack(pop)
_Static_assert (sizeof (vm_region_submap_info_data_64_t) == VM_REGION_SUBMAP_INFO_COUNT_64 * 4, "xnu's size");
_Static_assert (__builtin_offsetof (vm_region_submap_info_data_64_t, user_tag) == 5 * 4, "user_tag is word 5");

/* Hidden: libmtdarwin.so defines both as well (mtmach.c says why). */
#define MTMACH_HIDDEN __attribute__ ((visibility ("hidden")))
extern mach_port_t mach_task_self_ MTMACH_HIDDEN;

kern_return_t task_threads (mach_port_t task, mach_port_t ** list, uint32_t * count);
kern_return_t thread_suspend (mach_port_t thread);
kern_return_t thread_resume (mach_port_t thread);
kern_return_t thread_get_state (mach_port_t thread, int flavor, uint32_t * state, uint32_t * count);
kern_return_t mach_port_deallocate (mach_port_t task, mach_port_t name);
kern_return_t mach_vm_deallocate (mach_port_t task, uint64_t address, uint64_t size) MTMACH_HIDDEN;
kern_return_t mach_vm_remap (mach_port_t target, uint64_t * address, uint64_t size, uint64_t mask, int flags,
    mach_port_t source_task, uint64_t source, int copy, int * cur_protection, int * max_protection, unsigned inheritance);
kern_return_t mach_vm_protect (mach_port_t task, uint64_t address, uint64_t size, int set_maximum, int protection);
kern_return_t mach_vm_read_overwrite (mach_port_t task, uint64_t address, uint64_t size, uint64_t data,
    uint64_t * out_size);
kern_return_t mach_vm_region_recurse (mach_port_t task, uint64_t * address, uint64_t * size, uint32_t * depth,
    int32_t * info, uint32_t * count);

typedef struct { uint32_t numer, denom; } mach_timebase_info_data_t;
uint64_t mach_absolute_time (void);
kern_return_t mach_timebase_info (mach_timebase_info_data_t * info);

/* libmalloc's zone list (in-process: reader NULL); each zone's introspect->enumerator lists its
 * blocks in use. */
kern_return_t malloc_get_all_zones (mach_port_t task, void * reader, uint64_t ** addresses, unsigned * count);
/* The stand-in's zone holds the blocks registered here. */
void mtmach_zone_register (void * p, uint64_t size);

/* The stand-in's own: the port name of the calling thread (mach_thread_self without a new right),
 * and a thread's suspend count (for tests). */
mach_port_t mtmach_thread_self (void);
/* From now on a thread's port name is its thread id (memtrace's agent, running its Mach stop over
 * this library, calls it first: Frida's thread ids on Darwin are the port names). */
void mtmach_name_threads_by_id (void);
int mtmach_suspend_count (mach_port_t thread);
int mtmach_user_refs (mach_port_t thread);

#endif
