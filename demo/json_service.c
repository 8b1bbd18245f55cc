/*
 * json_service — a JSON-parsing HTTP service (business fingerprint: JSON + gzip).
 *
 * Usage: json_service [--scale N] [--delay S] [--linger S]   (see mtdemo.h; defaults 1, 0, 0)
 * Output: one line "done: json_service scale=N requests=600 cached=12" (counts x N).  Exit 0.
 *
 * Two worker threads ("http-0", "http-1"); each calls handle_request(r) for r = 0..299
 * (300 x N per worker; 600 x N requests total).  handle_request calls, in order, and each of
 * these allocates DIRECTLY:
 *   http_read_request        calloc(1, 16384)                         freed at end of request
 *   json_tokenize            32 x malloc(64)                          freed
 *   json_build_object        8 x malloc(256)                          freed
 *   json_serialize_response  malloc(1024), realloc -> 4096, realloc -> 16384   freed
 *   deflate_response         malloc(65536) (deflate window)           freed
 *   response_cache_store     when r % 50 == 49: malloc(8192) kept in a global cache until exit
 * Totals at scale 1 (600 requests):
 *   http_read_request calloc(16384) x 600; json_tokenize malloc(64) x 19200;
 *   json_build_object malloc(256) x 4800; json_serialize_response malloc(1024) x 600,
 *   realloc(4096) x 600, realloc(16384) x 600; deflate_response malloc(65536) x 600;
 *   response_cache_store malloc(8192) x 12 (live at end: 98304 bytes, reachable).
 * Plus glibc internals (thread creation TLS, stdout buffer) outside these functions.
 */
#include "mtdemo.h"

#include <pthread.h>

static int g_scale = 1;
static pthread_mutex_t g_cache_lock = PTHREAD_MUTEX_INITIALIZER;
void *g_cache[4096];
static int g_ncache;

NOINLINE char *http_read_request(int r)
{
    char *req = calloc(1, 16384);
    snprintf(req, 64, "GET /api/v1/items/%d HTTP/1.1", r);
    return req;
}

NOINLINE void json_tokenize(const char *req)
{
    void *t[32];
    for (int i = 0; i < 32; i++) {
        t[i] = malloc(64);
        memset(t[i], req[i % 16], 64);
    }
    for (int i = 0; i < 32; i++) {
        mtdemo_sink(t[i]);
        free(t[i]);
    }
}

NOINLINE void json_build_object(void)
{
    void *o[8];
    for (int i = 0; i < 8; i++) {
        o[i] = malloc(256);
        memset(o[i], 'j', 256);
    }
    for (int i = 0; i < 8; i++) {
        mtdemo_sink(o[i]);
        free(o[i]);
    }
}

NOINLINE char *json_serialize_response(void)
{
    char *s = malloc(1024);
    memset(s, '{', 1024);
    s = realloc(s, 4096);
    memset(s + 1024, '"', 3072);
    s = realloc(s, 16384);
    memset(s + 4096, '}', 12288);
    return s;
}

NOINLINE void deflate_response(const char *body)
{
    unsigned char *window = malloc(65536);
    memcpy(window, body, 16384);
    mtdemo_sink(window);
    free(window);
}

NOINLINE void response_cache_store(int r)
{
    char *e = malloc(8192);
    memset(e, 'r', 8192);
    pthread_mutex_lock(&g_cache_lock);
    g_cache[g_ncache++] = e;
    mtdemo_sink(e);
    pthread_mutex_unlock(&g_cache_lock);
}

NOINLINE void handle_request(int r)
{
    char *req = http_read_request(r);
    json_tokenize(req);
    json_build_object();
    char *body = json_serialize_response();
    deflate_response(body);
    if (r % 50 == 49)
        response_cache_store(r);
    free(body);
    free(req);
}

static void *worker(void *arg)
{
    for (int r = 0; r < 300 * g_scale; r++)
        handle_request(r);
    return NULL;
}

int main(int argc, char **argv)
{
    struct mtdemo_args a = mtdemo_workload_args(argc, argv);
    g_scale = a.scale > 300 ? 300 : a.scale;
    mtdemo_sleep(a.delay);
    mtdemo_run_threads(2, worker, "http");
    mtdemo_sleep(a.linger);
    printf("done: json_service scale=%d requests=%d cached=%d\n", g_scale, 600 * g_scale, g_ncache);
    return 0;
}
