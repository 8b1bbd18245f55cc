/* The Darwin stand-in's Mach thread and VM calls, with xnu's semantics, on Linux (see mtmach.h).
 *
 *   task_threads          a send right (a user reference) to every thread of the task, as an array
 *                         in fresh pages (xnu's out-of-line memory: the caller mach_vm_deallocates
 *                         it; nothing here calls malloc: it runs while other threads are suspended)
 *   thread_suspend/resume a suspend count per thread; the first suspend stops the thread (a signal
 *                         whose handler saves its registers and waits until the count is back to 0)
 *                         and returns once it is stopped; resume at count 0 is KERN_FAILURE
 *   thread_get_state      x86_THREAD_STATE64 (xnu's register order) of a suspended thread
 *   mach_port_deallocate  drops one user reference; libpthread holds one for each live thread, so a
 *                         thread's name is stable; unknown names are KERN_INVALID_NAME
 *   mach_vm_read_overwrite  a copy that fails (KERN_INVALID_ADDRESS) instead of faulting
 *   mach_vm_region_recurse  the region at or above *address, vm_region_submap_info_64 packed(4);
 *                         user_tag VM_MEMORY_STACK for thread stacks (the main stack, and regions
 *                         holding a thread's stack pointer), VM_MEMORY_MALLOC_TINY for the zone's
 *                         own region, pages_resident from mincore
 *   malloc_get_all_zones  one zone whose introspection enumerator lists the registered blocks
 *   mach_absolute_time    ticks of Apple silicon's 24 MHz clock, mach_timebase_info 125/3 (ns a tick)
 *
 * Port names are xnu-like (0x1103, 0x1203, ...), unlike thread ids, so that a caller mixing the two
 * is caught -- except once mtmach_name_threads_by_id () was called, after which a thread's name
 * is its Linux thread id: memtrace's agent calls it when it runs its Mach stop over this library
 * (agent config worldMach), so that Frida's thread ids (Cloak.hasThread, getCurrentThreadId) are
 * the names task_threads gives, as they are on Darwin.  A thread's entry is freed once the thread
 * has ended (xnu: its name dies with it).
 */
#define _GNU_SOURCE
#include "mtmach.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <time.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#define MAX_THREADS 1024
#define SUSPEND_SIGNAL (SIGRTMIN + 5)

typedef struct {
  pid_t tid;                   /* 0: free */
  mach_port_t name;
  _Atomic int refs;            /* user references: libpthread's one while the thread lives, plus the caller's */
  _Atomic int suspend_count;
  _Atomic uint64_t ask;        /* the last suspend's number: a signal carrying another is stale */
  _Atomic uint64_t stopped;    /* the suspend the handler holds the thread for (0: running) */
  uint64_t regs[21];
} Entry;

/* libsystem_kernel's once on a device; libmtdarwin.so (the IOSurface / purgeable half of the
 * stand-in) exports its own, with the same value, and its own mach_vm_deallocate: these two are
 * hidden (mtmach.h), so that preloaded beside it neither library answers the other's calls.  The
 * agent finds them in this library's symbol table. */
mach_port_t mach_task_self_ = 0x103;

static Entry g_threads[MAX_THREADS];
static uint64_t g_malloc_region_lo, g_malloc_region_hi;     /* the zone's own region (below) */
static _Atomic mach_port_t g_next_name = 0x1103;
static _Atomic int g_handler_installed;
static int g_names_are_tids;

static pid_t gettid_raw (void) { return (pid_t) syscall (SYS_gettid); }

/* Names are thread ids from now on (no names were handed out before: called first). */
void
mtmach_name_threads_by_id (void)
{
  g_names_are_tids = 1;
}

static uint64_t
now_ns (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec;
}

static Entry *
by_tid (pid_t tid, int create)
{
  for (int i = 0; i < MAX_THREADS; i++)
    if (g_threads[i].tid == tid)
      return &g_threads[i];
  if (!create)
    return NULL;
  for (int i = 0; i < MAX_THREADS; i++)
  {
    pid_t free_tid = 0;
    if (__atomic_compare_exchange_n (&g_threads[i].tid, &free_tid, tid, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
    {
      g_threads[i].name = g_names_are_tids ? (mach_port_t) tid : atomic_fetch_add (&g_next_name, 0x100);
      atomic_store (&g_threads[i].refs, 1);          /* libpthread's */
      atomic_store (&g_threads[i].suspend_count, 0);
      atomic_store (&g_threads[i].stopped, 0);
      return &g_threads[i];
    }
  }
  return NULL;
}

static Entry *
by_name (mach_port_t name)
{
  for (int i = 0; i < MAX_THREADS; i++)
    if (g_threads[i].tid != 0 && g_threads[i].name == name)
      return &g_threads[i];
  return NULL;
}

static void
on_suspend (int sig, siginfo_t * info, void * ctx)
{
  Entry * e = by_tid (gettid_raw (), 0);
  const greg_t * g = ((ucontext_t *) ctx)->uc_mcontext.gregs;
  uint64_t ask = (uint64_t) (uintptr_t) info->si_value.sival_ptr;
  (void) sig;
  /* A signal of a suspend given up on (thread_suspend's deadline, on a loaded machine) arrives
   * late and is queued (a real-time signal): it must neither stop the thread nor say "stopped" for
   * a later suspend that has not been delivered yet -- that one would return with the thread
   * running on (and its registers read from the stale stop). */
  if (e == NULL || ask == 0 || ask != atomic_load (&e->ask))
    return;
  const int order[21] = { REG_RAX, REG_RBX, REG_RCX, REG_RDX, REG_RDI, REG_RSI, REG_RBP, REG_RSP, REG_R8, REG_R9,
                          REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15, REG_RIP, REG_EFL, REG_CSGSFS,
                          REG_CSGSFS, REG_CSGSFS };
  for (int i = 0; i < 21; i++)
    e->regs[i] = (uint64_t) g[order[i]];
  e->regs[18] &= 0xffff;                             /* cs */
  e->regs[19] = 0;                                   /* fs, gs: selectors, 0 in user space */
  e->regs[20] = 0;
  atomic_store (&e->stopped, ask);
  for (;;)
  {
    int c = atomic_load (&e->suspend_count);
    if (c <= 0)
      break;
    syscall (SYS_futex, &e->suspend_count, FUTEX_WAIT, c, NULL, NULL, 0);
  }
  atomic_store (&e->stopped, 0);
}

static void
install_handler (void)
{
  if (atomic_exchange (&g_handler_installed, 1))
    return;
  struct sigaction sa;
  memset (&sa, 0, sizeof (sa));
  sa.sa_sigaction = on_suspend;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigfillset (&sa.sa_mask);
  sigaction (SUSPEND_SIGNAL, &sa, NULL);
}

kern_return_t
task_threads (mach_port_t task, mach_port_t ** list, uint32_t * count)
{
  char buf[4096];
  pid_t tids[MAX_THREADS];
  uint32_t n = 0;
  if (task != mach_task_self_)
    return KERN_INVALID_ARGUMENT;
  int fd = (int) syscall (SYS_open, "/proc/self/task", O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return KERN_FAILURE;
  for (;;)
  {
    long got = syscall (SYS_getdents64, fd, buf, sizeof (buf));
    if (got <= 0)
      break;
    for (long off = 0; off < got;)
    {
      unsigned short reclen = *(unsigned short *) (buf + off + 16);
      const char * name = buf + off + 19;
      if (name[0] >= '0' && name[0] <= '9' && n < MAX_THREADS)
      {
        pid_t tid = 0;
        for (const char * c = name; *c >= '0' && *c <= '9'; c++)
          tid = tid * 10 + (*c - '0');
        tids[n++] = tid;
      }
      off += reclen;
    }
  }
  syscall (SYS_close, fd);
  /* Threads that have ended: their names are dead, their entries free again (a program that keeps
   * starting threads would otherwise fill the table). */
  for (int i = 0; i < MAX_THREADS; i++)
  {
    pid_t t = g_threads[i].tid;
    if (t != 0 && syscall (SYS_tgkill, getpid (), t, 0) != 0 && atomic_load (&g_threads[i].suspend_count) == 0)
      __atomic_compare_exchange_n (&g_threads[i].tid, &t, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  }
  mach_port_t * out = mmap (NULL, (n ? n : 1) * sizeof (mach_port_t), PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (out == MAP_FAILED)
    return KERN_FAILURE;
  uint32_t listed = 0;
  for (uint32_t i = 0; i < n; i++)
  {
    Entry * e = by_tid (tids[i], 1);
    if (e == NULL)
      continue;                                      /* the table is full: the thread goes unlisted */
    atomic_fetch_add (&e->refs, 1);                  /* the right handed to the caller */
    out[listed++] = e->name;
  }
  *list = out;
  *count = listed;
  return KERN_SUCCESS;
}

kern_return_t
thread_suspend (mach_port_t thread)
{
  Entry * e = by_name (thread);
  if (e == NULL)
    return MACH_SEND_INVALID_DEST;
  install_handler ();
  if (atomic_fetch_add (&e->suspend_count, 1) > 0)
    return KERN_SUCCESS;                             /* already stopped: only the count rises */
  if (e->tid == gettid_raw ())
    return KERN_SUCCESS;                             /* xnu suspends the caller on return to user space */
  uint64_t ask = atomic_fetch_add (&e->ask, 1) + 1;
  siginfo_t si;
  memset (&si, 0, sizeof (si));
  si.si_signo = SUSPEND_SIGNAL;
  si.si_code = SI_QUEUE;
  si.si_pid = getpid ();
  si.si_uid = getuid ();
  si.si_value.sival_ptr = (void *) (uintptr_t) ask;
  if (syscall (SYS_rt_tgsigqueueinfo, getpid (), e->tid, SUSPEND_SIGNAL, &si) != 0)
  {
    atomic_fetch_add (&e->ask, 1);
    atomic_store (&e->suspend_count, 0);
    return MACH_SEND_INVALID_DEST;                   /* the thread is gone */
  }
  /* xnu returns once the thread is off the CPU; a thread that blocks the signal never gets here:
   * given up after 2 s, by the clock (a loaded machine stretches every sleep). */
  uint64_t deadline = now_ns () + 2000000000ULL;
  while (atomic_load (&e->stopped) != ask)
  {
    if (now_ns () > deadline)
    {
      atomic_fetch_add (&e->ask, 1);                 /* its signal, when it comes, is stale */
      atomic_store (&e->suspend_count, 0);
      syscall (SYS_futex, &e->suspend_count, FUTEX_WAKE, 1, NULL, NULL, 0);
      return KERN_FAILURE;
    }
    usleep (10);
  }
  return KERN_SUCCESS;
}

kern_return_t
thread_resume (mach_port_t thread)
{
  Entry * e = by_name (thread);
  if (e == NULL)
    return MACH_SEND_INVALID_DEST;
  if (atomic_load (&e->suspend_count) <= 0)
    return KERN_FAILURE;
  if (atomic_fetch_sub (&e->suspend_count, 1) == 1)
  {
    syscall (SYS_futex, &e->suspend_count, FUTEX_WAKE, 1, NULL, NULL, 0);
    while (atomic_load (&e->stopped))                /* back to running before we say so */
      usleep (10);
  }
  return KERN_SUCCESS;
}

kern_return_t
thread_get_state (mach_port_t thread, int flavor, uint32_t * state, uint32_t * count)
{
  Entry * e = by_name (thread);
  if (e == NULL)
    return MACH_SEND_INVALID_DEST;
  if (flavor != x86_THREAD_STATE64 || *count < x86_THREAD_STATE64_COUNT)
    return KERN_INVALID_ARGUMENT;
  if (!atomic_load (&e->stopped))
    return KERN_FAILURE;                             /* the stand-in reads registers of suspended threads only */
  memcpy (state, e->regs, sizeof (e->regs));
  *count = x86_THREAD_STATE64_COUNT;
  return KERN_SUCCESS;
}

kern_return_t
mach_port_deallocate (mach_port_t task, mach_port_t name)
{
  Entry * e;
  if (task != mach_task_self_)
    return KERN_INVALID_ARGUMENT;
  e = by_name (name);
  if (e == NULL || atomic_load (&e->refs) <= 0)
    return KERN_INVALID_NAME;
  if (atomic_fetch_sub (&e->refs, 1) == 1)
    e->tid = 0;                                      /* the last right: the name is gone */
  return KERN_SUCCESS;
}

kern_return_t
mach_vm_deallocate (mach_port_t task, uint64_t address, uint64_t size)
{
  long page = sysconf (_SC_PAGESIZE);
  if (task != mach_task_self_)
    return KERN_INVALID_ARGUMENT;
  if (size == 0)
    return KERN_SUCCESS;
  return munmap ((void *) (address & ~(uint64_t) (page - 1)), (size + (uint64_t) page - 1) & ~(uint64_t) (page - 1))
      == 0 ? KERN_SUCCESS : KERN_INVALID_ADDRESS;
}

kern_return_t
mach_vm_read_overwrite (mach_port_t task, uint64_t address, uint64_t size, uint64_t data, uint64_t * out_size)
{
  struct iovec local = { (void *) data, size }, remote = { (void *) address, size };
  if (task != mach_task_self_)
    return KERN_INVALID_ARGUMENT;
  if (process_vm_readv (getpid (), &local, 1, &remote, 1, 0) != (ssize_t) size)
    return KERN_INVALID_ADDRESS;
  *out_size = size;
  return KERN_SUCCESS;
}

/* Does some thread of ours have its stack pointer in [lo, hi)?  (/proc/self/task/N/syscall: the
 * sp of a thread blocked in a system call.) */
static int
holds_a_stack_pointer (uint64_t lo, uint64_t hi)
{
  char dents[4096], path[64], text[256];
  int found = 0;
  int fd = (int) syscall (SYS_open, "/proc/self/task", O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return 0;
  for (;;)
  {
    long got = syscall (SYS_getdents64, fd, dents, sizeof (dents));
    if (got <= 0 || found)
      break;
    for (long off = 0; off < got && !found;)
    {
      const char * name = dents + off + 19;
      off += *(unsigned short *) (dents + off + 16);
      if (name[0] < '0' || name[0] > '9')
        continue;
      int k = 0;
      for (const char * p = "/proc/self/task/"; *p; p++)
        path[k++] = *p;
      for (const char * p = name; *p; p++)
        path[k++] = *p;
      for (const char * p = "/syscall"; *p; p++)
        path[k++] = *p;
      path[k] = 0;
      int sfd = (int) syscall (SYS_open, path, O_RDONLY);
      if (sfd < 0)
        continue;
      long n = syscall (SYS_read, sfd, text, sizeof (text) - 1);
      syscall (SYS_close, sfd);
      if (n <= 0)
        continue;
      text[n] = 0;
      /* "nr a1 a2 a3 a4 a5 a6 sp pc": the eighth field */
      int field = 0;
      const char * p = text;
      while (*p && field < 7)
        if (*p++ == ' ')
          field++;
      if (field == 7 && p[0] == '0' && p[1] == 'x')
      {
        uint64_t sp = 0;
        for (p += 2; (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'); p++)
          sp = sp * 16 + (uint64_t) (*p <= '9' ? *p - '0' : *p - 'a' + 10);
        found = sp >= lo && sp < hi;
      }
    }
  }
  syscall (SYS_close, fd);
  return found;
}

static uint64_t
hex (const char ** s)
{
  uint64_t v = 0;
  for (; (**s >= '0' && **s <= '9') || (**s >= 'a' && **s <= 'f'); (*s)++)
    v = v * 16 + (uint64_t) (**s <= '9' ? **s - '0' : **s - 'a' + 10);
  return v;
}

kern_return_t
mach_vm_region_recurse (mach_port_t task, uint64_t * address, uint64_t * size, uint32_t * depth, int32_t * info,
    uint32_t * count)
{
  static char maps[1 << 20];
  vm_region_submap_info_data_64_t out;
  (void) depth;                                      /* Linux has no submaps: depth stays as given */
  if (task != mach_task_self_)
    return KERN_INVALID_ARGUMENT;
  if (*count < VM_REGION_SUBMAP_INFO_COUNT_64)
    return KERN_INVALID_ARGUMENT;
  int fd = (int) syscall (SYS_open, "/proc/self/maps", O_RDONLY);
  if (fd < 0)
    return KERN_FAILURE;
  long len = 0, got;
  while (len < (long) sizeof (maps) - 1 && (got = syscall (SYS_read, fd, maps + len, sizeof (maps) - 1 - len)) > 0)
    len += got;
  syscall (SYS_close, fd);
  maps[len] = 0;
  for (const char * line = maps; *line;)
  {
    const char * p = line;
    const char * eol = strchr (line, '\n');
    uint64_t lo = hex (&p), hi;
    p++;
    hi = hex (&p);
    p++;
    if (hi > *address)
    {
      long page = sysconf (_SC_PAGESIZE);
      unsigned char vec[256];
      unsigned int resident = 0;
      memset (&out, 0, sizeof (out));
      out.protection = (p[0] == 'r' ? 1 : 0) | (p[1] == 'w' ? 2 : 0) | (p[2] == 'x' ? 4 : 0);
      out.max_protection = 7;
      out.inheritance = 1;
      out.ref_count = 1;
      for (uint64_t at = lo; at < hi;)
      {
        uint64_t n = (hi - at) / (uint64_t) page;
        if (n > sizeof (vec))
          n = sizeof (vec);
        if (mincore ((void *) at, n * (uint64_t) page, vec) != 0)
          break;
        for (uint64_t i = 0; i < n; i++)
          resident += vec[i] & 1;
        at += n * (uint64_t) page;
      }
      out.pages_resident = resident;
      int is_main_stack = eol != NULL && eol - line > 7 && memcmp (eol - 7, "[stack]", 7) == 0;
      if (p[1] == 'w' && (is_main_stack || holds_a_stack_pointer (lo, hi)))
        out.user_tag = VM_MEMORY_STACK;
      else if (g_malloc_region_lo != 0 && g_malloc_region_lo < hi && g_malloc_region_hi > lo)
        out.user_tag = VM_MEMORY_MALLOC_TINY;
      memcpy (info, &out, VM_REGION_SUBMAP_INFO_COUNT_64 * 4);
      *count = VM_REGION_SUBMAP_INFO_COUNT_64;
      *address = lo;
      *size = hi - lo;
      return KERN_SUCCESS;
    }
    if (eol == NULL)
      break;
    line = eol + 1;
  }
  return KERN_INVALID_ADDRESS;
}

/* A second mapping of the same pages (copy FALSE), as xnu's mach_vm_remap makes for any pages; Linux
 * can alias only shared ones (mremap with old_size 0), so private pages -- a program's code -- are
 * KERN_INVALID_ARGUMENT here. */
kern_return_t
mach_vm_remap (mach_port_t target, uint64_t * address, uint64_t size, uint64_t mask, int flags, mach_port_t source_task,
    uint64_t source, int copy, int * cur_protection, int * max_protection, unsigned inheritance)
{
  (void) mask;
  (void) inheritance;
  if (target != mach_task_self_ || source_task != mach_task_self_ || copy || (flags & 1) == 0)
    return KERN_INVALID_ARGUMENT;
  void * alias = mremap ((void *) source, 0, size, MREMAP_MAYMOVE);
  if (alias == MAP_FAILED)
    return KERN_INVALID_ARGUMENT;
  *address = (uint64_t) alias;
  *cur_protection = 5;                               /* as the source: r-x */
  *max_protection = 7;
  return KERN_SUCCESS;
}

/* VM_PROT_READ/WRITE/EXECUTE are PROT_READ/WRITE/EXEC's bits; VM_PROT_COPY (0x10) is not modelled. */
kern_return_t
mach_vm_protect (mach_port_t task, uint64_t address, uint64_t size, int set_maximum, int protection)
{
  (void) set_maximum;
  if (task != mach_task_self_)
    return KERN_INVALID_ARGUMENT;
  return mprotect ((void *) address, size, protection & 7) == 0 ? KERN_SUCCESS : KERN_PROTECTION_FAILURE;
}

/* Apple silicon's timebase: 24 MHz ticks, 125/3 ns each (xnu's mach_timebase_info_data_t). */
uint64_t
mach_absolute_time (void)
{
  return now_ns () * 3 / 125;
}

kern_return_t
mach_timebase_info (mach_timebase_info_data_t * info)
{
  info->numer = 125;
  info->denom = 3;
  return KERN_SUCCESS;
}

mach_port_t
mtmach_thread_self (void)
{
  return by_tid (gettid_raw (), 1)->name;
}

int
mtmach_suspend_count (mach_port_t thread)
{
  Entry * e = by_name (thread);
  return e == NULL ? -1 : atomic_load (&e->suspend_count);
}

int
mtmach_user_refs (mach_port_t thread)
{
  Entry * e = by_name (thread);
  return e == NULL ? 0 : atomic_load (&e->refs);
}

/* ---- malloc zone introspection (<malloc/malloc.h>), for the leak scan's blocks from before
 * tracing: one zone whose enumerator lists the blocks registered with mtmach_zone_register, in
 * batches, as MALLOC_PTR_IN_USE_RANGE_TYPE ranges.  malloc_zone_t's layout up to introspect (its
 * word 12) and malloc_introspection_t's first member (enumerator) are libmalloc's. */

#define ZONE_MAX_BLOCKS 4096
#define ZONE_BATCH 16

typedef struct { uint64_t address, size; } zone_range_t;
typedef int (*zone_reader_t) (mach_port_t task, uint64_t address, uint64_t size, void ** local);
typedef void (*zone_recorder_t) (mach_port_t task, void * context, unsigned type, zone_range_t * ranges, unsigned n);

/* The zone's bookkeeping lives in a region of its own that mach_vm_region_recurse tags
 * VM_MEMORY_MALLOC_TINY, as libmalloc's regions are: the allocator's memory, not a root. */
static zone_range_t * g_zone_blocks;
static unsigned g_zone_n;

static int
zone_enumerator (mach_port_t task, void * context, unsigned type_mask, uint64_t zone_address, zone_reader_t reader,
    zone_recorder_t recorder)
{
  zone_range_t batch[ZONE_BATCH];
  unsigned n = 0;
  (void) zone_address;
  (void) reader;                                   /* NULL: our own task, read in place */
  if (task != mach_task_self_)
    return KERN_INVALID_ARGUMENT;
  if ((type_mask & 1) == 0)                        /* MALLOC_PTR_IN_USE_RANGE_TYPE */
    return KERN_SUCCESS;
  for (unsigned i = 0; i < g_zone_n; i++)
  {
    if (g_zone_blocks == NULL || g_zone_blocks[i].address == 0)
      continue;
    batch[n++] = g_zone_blocks[i];
    if (n == ZONE_BATCH)
    {
      recorder (task, context, 1, batch, n);
      n = 0;
    }
  }
  if (n != 0)
    recorder (task, context, 1, batch, n);
  return KERN_SUCCESS;
}

static struct { void * enumerator; void * rest[15]; } g_introspect = { (void *) zone_enumerator, { 0 } };
static struct { void * words[12]; void * introspect; unsigned version; } g_zone = { { 0 }, &g_introspect, 13 };
static uint64_t g_zone_addresses[1] = { 0 };

kern_return_t
malloc_get_all_zones (mach_port_t task, void * reader, uint64_t ** addresses, unsigned * count)
{
  (void) reader;
  if (task != mach_task_self_)
    return KERN_INVALID_ARGUMENT;
  g_zone_addresses[0] = (uint64_t) &g_zone;
  *addresses = g_zone_addresses;
  *count = 1;
  return KERN_SUCCESS;
}

void
mtmach_zone_register (void * p, uint64_t size)
{
  if (g_zone_blocks == NULL)
  {
    g_zone_blocks = mmap (NULL, ZONE_MAX_BLOCKS * sizeof (zone_range_t), PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    g_malloc_region_lo = (uint64_t) g_zone_blocks;
    g_malloc_region_hi = g_malloc_region_lo + ZONE_MAX_BLOCKS * sizeof (zone_range_t);
  }
  if (g_zone_n < ZONE_MAX_BLOCKS)
    g_zone_blocks[g_zone_n++] = (zone_range_t) { (uint64_t) p, size };
}
