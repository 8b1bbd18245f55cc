/*
 * mtmalloc.h — public interface of libmtmalloc.so, the stand-in for Darwin's libmalloc
 * (libsystem_malloc.dylib).  See mtmalloc.c for the exact semantics.
 */
#ifndef MTMALLOC_H
#define MTMALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libmalloc's stack_logging.h bits, as malloc_logger receives them. */
#define MALLOC_LOG_TYPE_ALLOCATE    2
#define MALLOC_LOG_TYPE_DEALLOCATE  4
#define MALLOC_LOG_TYPE_HAS_ZONE    8
#define MALLOC_LOG_TYPE_CLEARED     64

typedef struct _malloc_zone_t malloc_zone_t;
typedef void (malloc_logger_t)(uint32_t type, uintptr_t arg1, uintptr_t arg2, uintptr_t arg3, uintptr_t result,
                               uint32_t num_hot_frames_to_skip);
extern malloc_logger_t *malloc_logger;

malloc_zone_t *malloc_default_zone(void);
void *malloc_zone_malloc(malloc_zone_t *zone, size_t size);
void *malloc_zone_calloc(malloc_zone_t *zone, size_t count, size_t size);
void *malloc_zone_realloc(malloc_zone_t *zone, void *ptr, size_t size);
void malloc_zone_free(malloc_zone_t *zone, void *ptr);
size_t malloc_size(const void *ptr);
void malloc_memory_event_handler(unsigned long event);

/* ---- stand-in only ---- */
#define MTMALLOC_SMALL_MAX   16384   /* larger blocks are "large": a VM region each */
#define MTMALLOC_TINY_MAX    1008
#define MTMALLOC_REGION      (1u << 20)
#define MTMALLOC_LARGE_CACHE 4
/* Test hooks for the realloc race (issue: libmalloc logs realloc after the old block is freed):
 *   realloc_window(old) runs in malloc_zone_realloc after the old block went back to its free
 *     list and before malloc_logger is called;
 *   alloc_window(ptr) runs in malloc_zone_malloc/calloc after the block is taken and before
 *     malloc_logger is called.
 * NULL (the default) for none. */
void mtmalloc_set_hooks(void (*realloc_window)(void *old), void (*alloc_window)(void *ptr));
/* What malloc_memory_event_handler received so far (events, last event bits). */
void mtmalloc_memory_events(unsigned long *count, unsigned long *last);

#ifdef __cplusplus
}
#endif

#endif /* MTMALLOC_H */
