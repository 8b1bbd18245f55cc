/*
 * image_decoder — a custom image decoder (business fingerprint: image decode).
 *
 * Usage: image_decoder [--scale N] [--delay S] [--linger S]   (see mtdemo.h; defaults 1, 0, 0)
 * Output: one line "done: image_decoder scale=N images=40 thumbnails=10" (counts x N).  Exit 0.
 *
 * Two decoder threads ("decode-0", "decode-1"); each calls decode_image(i) for i = 0..19
 * (20 x N per thread, 40 x N images total).  decode_image calls, in order (each allocates DIRECTLY):
 *   image_decoder_alloc_frame  malloc(4194304) (4 MiB RGBA frame; first 64 KiB written)   freed
 *   jpeg_decode_scanlines      16 x malloc(5760) (1920*3 row buffers)                      freed
 *   png_inflate_idat           malloc(8192), realloc -> 32768, realloc -> 131072           freed
 *   image_cache_store          when i % 4 == 3: malloc(262144) thumbnail kept until exit
 * Totals at scale 1 (40 images):
 *   image_decoder_alloc_frame malloc(4194304) x 40; jpeg_decode_scanlines malloc(5760) x 640;
 *   png_inflate_idat malloc(8192) x 40, realloc(32768) x 40, realloc(131072) x 40;
 *   image_cache_store malloc(262144) x 10 (live at end: 2621440 bytes, reachable).
 * Plus glibc internals (thread creation TLS, stdout buffer) outside these functions.
 */
#include "mtdemo.h"

#include <pthread.h>

static int g_scale = 1;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
void *g_thumbs[4096];
static int g_nthumbs;

NOINLINE unsigned char *image_decoder_alloc_frame(void)
{
    unsigned char *f = malloc(4194304);
    memset(f, 0xff, 65536);
    return f;
}

NOINLINE void jpeg_decode_scanlines(unsigned char *frame)
{
    void *rows[16];
    for (int i = 0; i < 16; i++) {
        rows[i] = malloc(5760);
        memset(rows[i], i, 5760);
        memcpy(frame + i * 4096, rows[i], 4096);
    }
    for (int i = 0; i < 16; i++) {
        mtdemo_sink(rows[i]);
        free(rows[i]);
    }
}

NOINLINE void png_inflate_idat(void)
{
    unsigned char *z = malloc(8192);
    memset(z, 1, 8192);
    z = realloc(z, 32768);
    memset(z + 8192, 2, 24576);
    z = realloc(z, 131072);
    memset(z + 32768, 3, 98304);
    mtdemo_sink(z);
    free(z);
}

NOINLINE void image_cache_store(const unsigned char *frame)
{
    unsigned char *t = malloc(262144);
    memcpy(t, frame, 65536);
    memset(t + 65536, 0, 262144 - 65536);
    pthread_mutex_lock(&g_lock);
    g_thumbs[g_nthumbs++] = t;
    mtdemo_sink(t);
    pthread_mutex_unlock(&g_lock);
}

NOINLINE void decode_image(int i)
{
    unsigned char *frame = image_decoder_alloc_frame();
    jpeg_decode_scanlines(frame);
    png_inflate_idat();
    if (i % 4 == 3)
        image_cache_store(frame);
    mtdemo_sink(frame);
    free(frame);
}

static void *decoder(void *arg)
{
    for (int i = 0; i < 20 * g_scale; i++)
        decode_image(i);
    return NULL;
}

int main(int argc, char **argv)
{
    struct mtdemo_args a = mtdemo_workload_args(argc, argv);
    g_scale = a.scale > 300 ? 300 : a.scale;
    mtdemo_sleep(a.delay);
    mtdemo_run_threads(2, decoder, "decode");
    mtdemo_sleep(a.linger);
    printf("done: image_decoder scale=%d images=%d thumbnails=%d\n", g_scale, 40 * g_scale, g_nthumbs);
    return 0;
}
