/*
 * ca_shmem.cpp — Core Animation stand-in, compiled into libmtdarwin.so.
 *
 * Real C++ (Itanium-mangled) symbols, found by memtrace through a demangled-name match:
 *   CA::Render::Shmem::new_shmem(unsigned long)        _ZN2CA6Render5Shmem9new_shmemEm
 *   CA::Render::Shmem::new_shmem(unsigned int, unsigned long)   _ZN2CA6Render5Shmem9new_shmemEjm
 *   CA::Render::Shmem::set_volatile(bool, int*)        _ZN2CA6Render5Shmem12set_volatileEbPi
 *   CA::Render::Shmem::unref()                         _ZN2CA6Render5Shmem5unrefEv
 *
 * new_shmem(size): allocates the Shmem descriptor with malloc (one malloc of sizeof(Shmem) = 24
 *   bytes per call, direct caller new_shmem) and its backing store with
 *   mach_vm_allocate(mach_task_self(), &addr, size, VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE): one
 *   NONVOLATILE purgeable object of round_up(size, 4096) bytes.  Returns NULL on failure.
 * new_shmem(port, size): the overload that maps a memory entry (a Mach port) instead of allocating:
 *   mach_vm_map(mach_task_self(), &addr, size, 0, VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE, port, ...).
 *   The stand-in's mach_vm_map maps only MACH_PORT_NULL (0): another port fails (NULL).
 * set_volatile(v, old): mach_vm_purgable_control(mach_task_self(), base, VM_PURGABLE_SET_STATE,
 *   &st) with st = v ? VOLATILE(1) : NONVOLATILE(0).  The state-machine hook therefore sees this
 *   transition too, with direct caller CA::Render::Shmem::set_volatile.  *old (if non-NULL) gets
 *   the old state read back by the kernel call.  Returns true iff the contents survived
 *   (old state != EMPTY(2)).
 * unref(): mach_vm_deallocate + free of the descriptor.
 * CABackingStoreSetVolatile(store, v): store is a Shmem*; calls store->set_volatile(v != 0, &old)
 *   and returns 1 if contents survived, 0 if they were purged, -1 for a NULL store.
 * mtdarwin_shmem_*: plain C bridges (each calls the C++ method) so C programs can use the class.
 *
 * No libstdc++ dependency: no new/delete, no exceptions, no RTTI.
 */
#include "mtdarwin.h"

#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))
#define NOINLINE __attribute__((noinline))

namespace CA {
namespace Render {

class EXPORT Shmem {
public:
    static Shmem *new_shmem(unsigned long size);
    static Shmem *new_shmem(unsigned int port, unsigned long size);
    bool set_volatile(bool v, int *old);
    void unref();
    void *data() const { return reinterpret_cast<void *>(base_); }
    unsigned long size() const { return size_; }

private:
    unsigned long long base_;
    unsigned long size_;
    int refcount_;
};

NOINLINE Shmem *Shmem::new_shmem(unsigned long size)
{
    Shmem *s = static_cast<Shmem *>(malloc(sizeof(Shmem)));
    if (!s)
        return nullptr;
    unsigned long long addr = 0;
    if (mach_vm_allocate(mach_task_self(), &addr, size, VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE) != KERN_SUCCESS) {
        free(s);
        return nullptr;
    }
    s->base_ = addr;
    s->size_ = (size + 4095UL) & ~4095UL;
    s->refcount_ = 1;
    return s;
}

NOINLINE Shmem *Shmem::new_shmem(unsigned int port, unsigned long size)
{
    Shmem *s = static_cast<Shmem *>(malloc(sizeof(Shmem)));
    if (!s)
        return nullptr;
    unsigned long long addr = 0;
    if (mach_vm_map(mach_task_self(), &addr, size, 0, VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE, port, 0, 0, 3, 7, 1)
        != KERN_SUCCESS) {
        free(s);
        return nullptr;
    }
    s->base_ = addr;
    s->size_ = (size + 4095UL) & ~4095UL;
    s->refcount_ = 1;
    return s;
}

NOINLINE bool Shmem::set_volatile(bool v, int *old)
{
    int st = v ? VM_PURGABLE_VOLATILE : VM_PURGABLE_NONVOLATILE;
    int kr = mach_vm_purgable_control(mach_task_self(), base_, VM_PURGABLE_SET_STATE, &st);
    if (kr != KERN_SUCCESS)
        st = VM_PURGABLE_EMPTY;
    if (old)
        *old = st;
    return st != VM_PURGABLE_EMPTY;
}

NOINLINE void Shmem::unref()
{
    if (--refcount_ > 0)
        return;
    mach_vm_deallocate(mach_task_self(), base_, size_);
    free(this);
}

} // namespace Render
} // namespace CA

extern "C" {

EXPORT NOINLINE int CABackingStoreSetVolatile(void *store, int isVolatile)
{
    if (!store)
        return -1;
    int old = 0;
    bool survived = static_cast<CA::Render::Shmem *>(store)->set_volatile(isVolatile != 0, &old);
    return survived ? 1 : 0;
}

EXPORT void *mtdarwin_shmem_new(unsigned long size)
{
    return CA::Render::Shmem::new_shmem(size);
}

EXPORT void *mtdarwin_shmem_new_port(unsigned int port, unsigned long size)
{
    return CA::Render::Shmem::new_shmem(port, size);
}

EXPORT int mtdarwin_shmem_set_volatile(void *shmem, int isVolatile, int *old_state)
{
    if (!shmem)
        return -1;
    return static_cast<CA::Render::Shmem *>(shmem)->set_volatile(isVolatile != 0, old_state) ? 1 : 0;
}

EXPORT void *mtdarwin_shmem_data(void *shmem)
{
    return shmem ? static_cast<CA::Render::Shmem *>(shmem)->data() : nullptr;
}

EXPORT unsigned long mtdarwin_shmem_size(void *shmem)
{
    return shmem ? static_cast<CA::Render::Shmem *>(shmem)->size() : 0;
}

EXPORT void mtdarwin_shmem_release(void *shmem)
{
    if (shmem)
        static_cast<CA::Render::Shmem *>(shmem)->unref();
}

} // extern "C"
