/*
 * gpu_serializer — a GPU-command-buffer + serializer app (business fingerprint: Metal/GPU +
 * serialization).
 *
 * Usage: gpu_serializer [--scale N] [--delay S] [--linger S]   (see mtdemo.h; defaults 1, 0, 0)
 * Output: one line "done: gpu_serializer scale=N frames=300 messages=1000 gpu_buffers=8"
 *   (counts x N).  Exit 0.
 *
 * Thread "render":     mtl_buffer_create(b) for b = 0..7 (8 x N): posix_memalign(&p, 16384, 262144),
 *                      kept until exit (GPU buffers; live at end 8 x 262144 = 2097152 bytes x N);
 *                      then mtl_command_buffer_encode(f) for f = 0..299 (300 x N):
 *                      malloc(65536) command buffer + 64 x malloc(96) commands, all freed.
 * Thread "serializer": protobuf_serialize_message(m) for m = 0..999 (1000 x N):
 *                      malloc(128), realloc -> 512, realloc -> 2048, realloc -> 8192, freed;
 *                      and protobuf_arena_alloc() every 100th message (m % 100 == 0):
 *                      malloc(32768) arena, freed.
 * Totals at scale 1: mtl_buffer_create posix_memalign(262144) x 8 (live);
 *   mtl_command_buffer_encode malloc(65536) x 300, malloc(96) x 19200;
 *   protobuf_serialize_message malloc(128) x 1000, realloc(512) x 1000, realloc(2048) x 1000,
 *   realloc(8192) x 1000; protobuf_arena_alloc malloc(32768) x 10.
 * Plus glibc internals (thread creation TLS, stdout buffer) outside these functions.
 */
#include "mtdemo.h"

#include <pthread.h>

static int g_scale = 1;
void *g_gpu_buffers[4096];
static int g_ngpu;

NOINLINE void mtl_buffer_create(int b)
{
    void *p = NULL;
    if (posix_memalign(&p, 16384, 262144) != 0)
        abort();
    memset(p, b, 262144);
    g_gpu_buffers[g_ngpu++] = p;
    mtdemo_sink(p);
}

NOINLINE void mtl_command_buffer_encode(int f)
{
    unsigned char *cb = malloc(65536);
    void *cmd[64];
    for (int i = 0; i < 64; i++) {
        cmd[i] = malloc(96);
        memset(cmd[i], i, 96);
        memcpy(cb + i * 96, cmd[i], 96);
    }
    for (int i = 0; i < 64; i++) {
        mtdemo_sink(cmd[i]);
        free(cmd[i]);
    }
    mtdemo_sink(cb);
    free(cb);
}

NOINLINE void protobuf_arena_alloc(void)
{
    void *arena = malloc(32768);
    memset(arena, 'a', 32768);
    mtdemo_sink(arena);
    free(arena);
}

NOINLINE void protobuf_serialize_message(int m)
{
    char *b = malloc(128);
    memset(b, 'p', 128);
    b = realloc(b, 512);
    memset(b + 128, 'p', 384);
    b = realloc(b, 2048);
    memset(b + 512, 'p', 1536);
    b = realloc(b, 8192);
    memset(b + 2048, 'p', 6144);
    mtdemo_sink(b);
    free(b);
}

static void *render(void *arg)
{
    for (int b = 0; b < 8 * g_scale; b++)
        mtl_buffer_create(b);
    for (int f = 0; f < 300 * g_scale; f++)
        mtl_command_buffer_encode(f);
    return NULL;
}

static void *serializer(void *arg)
{
    for (int m = 0; m < 1000 * g_scale; m++) {
        protobuf_serialize_message(m);
        if (m % 100 == 0)
            protobuf_arena_alloc();
    }
    return NULL;
}

int main(int argc, char **argv)
{
    struct mtdemo_args a = mtdemo_workload_args(argc, argv);
    g_scale = a.scale > 300 ? 300 : a.scale;
    mtdemo_sleep(a.delay);
    pthread_t t1, t2;
    pthread_create(&t1, NULL, render, NULL);
    pthread_setname_np(t1, "render");
    pthread_create(&t2, NULL, serializer, NULL);
    pthread_setname_np(t2, "serializer");
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    mtdemo_sleep(a.linger);
    printf("done: gpu_serializer scale=%d frames=%d messages=%d gpu_buffers=%d\n", g_scale, 300 * g_scale,
           1000 * g_scale, g_ngpu);
    return 0;
}
