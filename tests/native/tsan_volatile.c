/*
 * ThreadSanitizer's view of `volatile` in cmodule/: a relaxed atomic.  The core is written for
 * TinyCC, whose only atomics are glib's g_atomic_int_add / g_atomic_pointer_add, so a word that
 * several threads share is `volatile` and read and written whole; ordering comes from those adds
 * (sequentially consistent) and from mt_store_release / mt_load_acquire.  Built with
 * --param=tsan-distinguish-volatile=1, every volatile access of the core calls one of these first;
 * recording it as a relaxed atomic access keeps TSan honest about what volatile does NOT give:
 * no ordering.  A plain access that races with anything, and data handed over through a
 * volatile word without a release/acquire pair, are still reported.
 *
 * This file is compiled without -fsanitize=thread: it only tells TSan's runtime about the access
 * (a load, or a fetch-add of 0 for a store: the value is the program's to write, right after).
 */
#include <stdint.h>

typedef unsigned char a8;
typedef unsigned short a16;
typedef unsigned int a32;
typedef unsigned long long a64;

#define RELAXED 0

a8 __tsan_atomic8_load (const volatile a8 * a, int mo);
a16 __tsan_atomic16_load (const volatile a16 * a, int mo);
a32 __tsan_atomic32_load (const volatile a32 * a, int mo);
a64 __tsan_atomic64_load (const volatile a64 * a, int mo);
a8 __tsan_atomic8_fetch_add (volatile a8 * a, a8 v, int mo);
a16 __tsan_atomic16_fetch_add (volatile a16 * a, a16 v, int mo);
a32 __tsan_atomic32_fetch_add (volatile a32 * a, a32 v, int mo);
a64 __tsan_atomic64_fetch_add (volatile a64 * a, a64 v, int mo);

#define VOLATILE_ACCESS(n, bytes)                                               \
  void __tsan_volatile_read##bytes (void * addr)                                \
  { (void) __tsan_atomic##n##_load ((const volatile a##n *) addr, RELAXED); }   \
  void __tsan_volatile_write##bytes (void * addr)                               \
  { (void) __tsan_atomic##n##_fetch_add ((volatile a##n *) addr, 0, RELAXED); } \
  void __tsan_unaligned_volatile_read##bytes (void * addr)                      \
  { __tsan_volatile_read##bytes (addr); }                                       \
  void __tsan_unaligned_volatile_write##bytes (void * addr)                     \
  { __tsan_volatile_write##bytes (addr); }

VOLATILE_ACCESS (8, 1)
VOLATILE_ACCESS (16, 2)
VOLATILE_ACCESS (32, 4)
VOLATILE_ACCESS (64, 8)

void
__tsan_volatile_read16 (void * addr)
{
  __tsan_volatile_read8 (addr);
  __tsan_volatile_read8 ((char *) addr + 8);
}

void
__tsan_volatile_write16 (void * addr)
{
  __tsan_volatile_write8 (addr);
  __tsan_volatile_write8 ((char *) addr + 8);
}

void __tsan_unaligned_volatile_read16 (void * addr) { __tsan_volatile_read16 (addr); }
void __tsan_unaligned_volatile_write16 (void * addr) { __tsan_volatile_write16 (addr); }
