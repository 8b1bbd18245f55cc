/* Allocations the frame-pointer chain cannot reach the caller of: glibc is built without frame
 * pointers.  strdup from copy_config_strings, malloc from a qsort callback (through glibc's
 * msort), and an unrolled loop of five mallocs on one source line (one row, five call sites).
 * Lines the tests check are tagged @name. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))
#define CONFIG_BYTES 20000
#define FIVE(x) x; x; x; x; x

static void *volatile g_sink;
static char g_config[CONFIG_BYTES];

NOINLINE void copy_config_strings(void)
{
    for (int i = 0; i < 10; i++) {
        char *s = strdup(g_config); /* @strdup-call */
        g_sink = s;
        free(s);
    }
}

static int by_value(const void *a, const void *b)
{
    void *p = malloc(12345); /* @qsort-callback */
    g_sink = p;
    free(p);
    return *(const int *)a - *(const int *)b;
}

NOINLINE void sort_values(void)
{
    int v[4] = {3, 1, 2, 0};
    qsort(v, 4, sizeof v[0], by_value); /* @sort-call */
}

NOINLINE void unrolled_buffers(void)
{
    FIVE(g_sink = malloc(30000)); /* @unrolled */
}

int main(void)
{
    memset(g_config, 'x', CONFIG_BYTES - 1);
    copy_config_strings();
    sort_values();
    unrolled_buffers();
    puts("done");
    return 0;
}
