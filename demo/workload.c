/*
 * workload — the bundled multi-business demo (memtrace issue 2 / `make demo`).
 *
 * Usage: workload [--scale N] [--delay S] [--linger S]
 *   --scale N   integer multiplier of every iteration count below (default 1)
 *   --delay S   sleep S seconds before any work (tracer attach window); default 0
 *   --linger S  sleep S seconds after the work, before printing and exiting; default 0
 * Output: exactly one line on stdout at the end:
 *   "done: workload scale=N json_docs=... image_frames=... gzip_chunks=... net_buffers=... leaked=..."
 * Runtime natively well under 1 s at scale 1.  Exit status 0.
 *
 * Five threads run concurrently (business threads + main).  Every allocation below is made
 * DIRECTLY by the named function (noinline, exported with -rdynamic).  Counts are for scale 1;
 * multiply every count by N for --scale N (sizes never change).
 *
 *  thread "json"  json_parse_document(doc) called for doc = 0..1999 (2000 docs):
 *      per doc: 16 x malloc(48), 4 x malloc(200), and when doc % 10 == 0 one malloc(16384);
 *      everything freed before the doc returns.
 *      => malloc(48) x 32000, malloc(200) x 8000, malloc(16384) x 200; 0 bytes live at end.
 *  thread "image" image_decode_frame(i) for i = 0..23 (24 frames):
 *      malloc(1048576 << (i % 4))  (1, 2, 4, 8 MiB cycling; whole buffer written);
 *      frames with i % 8 == 7 (i = 7, 15, 23: 3 x 8388608) are kept in a global array until exit
 *      (reachable, never freed); the other 21 are freed.
 *      => 24 mallocs, 94371840 bytes gross (6 x 15 MiB); 3 live blocks, 25165824 bytes at end.
 *  thread "gzip"  gzip_inflate_chunk(c) for c = 0..199 (200 chunks):
 *      malloc(4096), then realloc to 8192, 16384, 32768 (a 32 KB window grown by realloc), free.
 *      => malloc(4096) x 200, realloc(.., 8192) x 200, realloc(.., 16384) x 200,
 *         realloc(.., 32768) x 200, free x 200; 0 live.
 *  thread "net"   net_receive_buffer(p) for p = 0..399 (400 packets):
 *      calloc(1, 65536), filled, freed.  => calloc(1, 65536) x 400; 0 live.
 *  thread "cache" cache_insert_entry(e) for e = 0..15 (16 entries):
 *      malloc(4096) filled and then dropped: a deliberate LEAK (pointer overwritten, never freed).
 *      => malloc(4096) x 16, 65536 bytes leaked (unreachable) at end.
 *  main thread    simd_buffer_alloc(k) for k = 0..9 (10 rounds):
 *      posix_memalign(&p, 64, 8192), aligned_alloc(4096, 16384), valloc(12288), memalign(256, 4096),
 *      each freed in the same round.
 *      => posix_memalign x 10, aligned_alloc x 10, valloc x 10, memalign x 10; 0 live.
 *
 * Not from the named functions (glibc internals, unattributed): pthread_create's TLS/DTV
 * allocations (a few calloc/malloc per thread) and the stdout buffer allocated by the final
 * printf (one malloc of the stdio buffer size, never freed).
 * Totals from the named functions, scale 1: json 40200 calls, image 24, gzip 200 malloc + 600
 * realloc, net 400 calloc, cache 16, simd 40; live at end: 25165824 (image) + 65536 (leak).
 */
#include "mtdemo.h"

#include <malloc.h>
#include <pthread.h>

static int g_scale = 1;
void *g_kept_frames[1024];
static int g_nkept;

NOINLINE void json_parse_document(int doc)
{
    void *tok[16], *obj[4];
    for (int i = 0; i < 16; i++) {
        tok[i] = malloc(48);
        memset(tok[i], 't', 48);
    }
    for (int i = 0; i < 4; i++) {
        obj[i] = malloc(200);
        memset(obj[i], 'o', 200);
    }
    if (doc % 10 == 0) {
        char *big = malloc(16384);
        memset(big, 'b', 16384);
        mtdemo_sink(big);
        free(big);
    }
    for (int i = 0; i < 16; i++) {
        mtdemo_sink(tok[i]);
        free(tok[i]);
    }
    for (int i = 0; i < 4; i++) {
        mtdemo_sink(obj[i]);
        free(obj[i]);
    }
}

NOINLINE void image_decode_frame(int i)
{
    size_t size = (size_t)1048576 << (i % 4);
    unsigned char *f = malloc(size);
    memset(f, i & 0xff, size);
    mtdemo_sink(f);
    if (i % 8 == 7)
        g_kept_frames[g_nkept++] = f;
    else
        free(f);
}

NOINLINE void gzip_inflate_chunk(int c)
{
    char *w = malloc(4096);
    memset(w, 'z', 4096);
    w = realloc(w, 8192);
    memset(w + 4096, 'z', 4096);
    w = realloc(w, 16384);
    memset(w + 8192, 'z', 8192);
    w = realloc(w, 32768);
    memset(w + 16384, 'z', 16384);
    mtdemo_sink(w);
    free(w);
}

NOINLINE void net_receive_buffer(int p)
{
    unsigned char *b = calloc(1, 65536);
    memset(b, p & 0xff, 1500);
    mtdemo_sink(b);
    free(b);
}

NOINLINE void cache_insert_entry(int e)
{
    char *volatile entry = malloc(4096);
    memset(entry, 'c', 4096);
    mtdemo_sink(entry);
    entry = NULL; /* leaked on purpose */
}

NOINLINE void simd_buffer_alloc(int k)
{
    void *a = NULL;
    if (posix_memalign(&a, 64, 8192) != 0)
        abort();
    void *b = aligned_alloc(4096, 16384);
    void *c = valloc(12288);
    void *d = memalign(256, 4096);
    memset(a, 1, 8192);
    memset(b, 2, 16384);
    memset(c, 3, 12288);
    memset(d, 4, 4096);
    mtdemo_sink(a); mtdemo_sink(b); mtdemo_sink(c); mtdemo_sink(d);
    free(a);
    free(b);
    free(c);
    free(d);
}

static void *json_thread(void *arg)
{
    for (int d = 0; d < 2000 * g_scale; d++)
        json_parse_document(d);
    return NULL;
}

static void *image_thread(void *arg)
{
    for (int i = 0; i < 24 * g_scale; i++)
        image_decode_frame(i);
    return NULL;
}

static void *gzip_thread(void *arg)
{
    for (int c = 0; c < 200 * g_scale; c++)
        gzip_inflate_chunk(c);
    return NULL;
}

static void *net_thread(void *arg)
{
    for (int p = 0; p < 400 * g_scale; p++)
        net_receive_buffer(p);
    return NULL;
}

static void *cache_thread(void *arg)
{
    for (int e = 0; e < 16 * g_scale; e++)
        cache_insert_entry(e);
    return NULL;
}

int main(int argc, char **argv)
{
    struct mtdemo_args a = mtdemo_workload_args(argc, argv);
    g_scale = a.scale;
    if (g_scale > 300)
        g_scale = 300; /* bounded by g_kept_frames */
    mtdemo_sleep(a.delay);

    static const char *names[] = { "json", "image", "gzip", "net", "cache" };
    void *(*fns[])(void *) = { json_thread, image_thread, gzip_thread, net_thread, cache_thread };
    pthread_t th[5];
    for (int i = 0; i < 5; i++) {
        pthread_create(&th[i], NULL, fns[i], NULL);
        pthread_setname_np(th[i], names[i]);
    }
    for (int k = 0; k < 10 * g_scale; k++)
        simd_buffer_alloc(k);
    for (int i = 0; i < 5; i++)
        pthread_join(th[i], NULL);

    mtdemo_sleep(a.linger);
    printf("done: workload scale=%d json_docs=%d image_frames=%d gzip_chunks=%d net_buffers=%d leaked=%d\n",
           g_scale, 2000 * g_scale, 24 * g_scale, 200 * g_scale, 400 * g_scale, 16 * g_scale);
    return 0;
}
