/*
 * anti_debug — "anti-debug" death type (memtrace issue 6): detects instrumentation and hangs.
 *
 * Usage: anti_debug [SECONDS] [--interval-ms M]
 *   SECONDS         lifetime when not instrumented (default 5)
 *   --interval-ms M check period (default 10 ms, so detection normally lands while Frida is
 *                   still attaching / loading the script)
 *
 * Thread "integrity" runs integrity_check() every M ms (default 10) (first check immediately at start).
 * It reads /proc/self/maps and every /proc/self/task/<tid>/comm with raw open/read/getdents64
 * (no malloc) and declares instrumentation if
 *   - a line of /proc/self/maps contains "frida" (Frida's agent is mapped as
 *     "/memfd:frida-agent-64.so (deleted)"), or
 *   - a thread name starts with "gum-js-loop", "gmain", "gdbus", "frida" or "pool-frida"
 *     (threads Frida's injected agent creates; this program's own threads are "anti_debug"
 *     and "integrity" only).
 * On detection it writes
 *     "anti_debug: instrumentation detected (<evidence>), stopping"
 * to stderr and raises SIGSTOP on itself: the WHOLE process (all threads, including the
 * injected agent's) is stopped, so a Frida attach, script load or rpc call never answers.  The
 * process stays stopped until someone sends SIGCONT or SIGKILL (tests must SIGKILL it).
 * Measured with Frida 17 on Linux (spawn, resume, attach 0.5 s later): device.attach() returns
 * (~0.1 s), then create_script()/load() never returns; /proc/PID/status shows State T (stopped).  After
 * a SIGCONT it raises SIGSTOP again at the next check while the agent is still present.
 *
 * Without instrumentation: the main thread runs app_main_loop_tick() every 100 ms (10 x
 * malloc(256) + free each tick) for SECONDS, then prints
 * "done: anti_debug checks=<n> detected=0" and exits 0.
 */
#define _GNU_SOURCE
#include "mtdemo.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/syscall.h>

static atomic_int g_checks;
static double g_interval = 0.01;
static char g_buf[1 << 16];

static int read_all(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd, buf + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    close(fd);
    buf[n] = 0;
    return (int)n;
}

static int scan_maps(char *evidence, size_t cap)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int found = 0;
    char tail[64] = "";
    ssize_t r;
    while (!found && (r = read(fd, g_buf, sizeof g_buf - 1)) > 0) {
        g_buf[r] = 0;
        char *hit = strstr(g_buf, "frida");
        if (!hit && tail[0]) {
            /* match across the chunk boundary */
            char joint[128];
            snprintf(joint, sizeof joint, "%s%.*s", tail, 8, g_buf);
            if (strstr(joint, "frida"))
                hit = g_buf;
        }
        if (hit) {
            char *ls = hit;
            while (ls > g_buf && ls[-1] != '\n')
                ls--;
            char *le = strchr(hit, '\n');
            int len = le ? (int)(le - ls) : (int)strlen(ls);
            snprintf(evidence, cap, "maps: %.*s", len, ls);
            found = 1;
        }
        size_t keep = r < 8 ? (size_t)r : 8;
        memcpy(tail, g_buf + r - keep, keep);
        tail[keep] = 0;
    }
    close(fd);
    return found;
}

struct linux_dirent64 {
    unsigned long long d_ino;
    long long d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static int scan_threads(char *evidence, size_t cap)
{
    static const char *bad[] = { "gum-js-loop", "gmain", "gdbus", "frida", "pool-frida" };
    int dfd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return 0;
    char dbuf[8192];
    int found = 0;
    long n;
    while (!found && (n = syscall(SYS_getdents64, dfd, dbuf, sizeof dbuf)) > 0) {
        for (long off = 0; off < n && !found;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(dbuf + off);
            off += d->d_reclen;
            if (d->d_name[0] == '.')
                continue;
            char path[96], comm[64];
            snprintf(path, sizeof path, "/proc/self/task/%s/comm", d->d_name);
            if (read_all(path, comm, sizeof comm) <= 0)
                continue;
            comm[strcspn(comm, "\n")] = 0;
            for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++)
                if (strncmp(comm, bad[i], strlen(bad[i])) == 0) {
                    snprintf(evidence, cap, "thread %s named \"%s\"", d->d_name, comm);
                    found = 1;
                    break;
                }
        }
    }
    close(dfd);
    return found;
}

NOINLINE int integrity_check(char *evidence, size_t cap)
{
    atomic_fetch_add(&g_checks, 1);
    return scan_maps(evidence, cap) || scan_threads(evidence, cap);
}

static void *integrity_thread(void *arg)
{
    char evidence[256];
    for (;;) {
        if (integrity_check(evidence, sizeof evidence)) {
            char msg[400];
            int len = snprintf(msg, sizeof msg, "anti_debug: instrumentation detected (%s), stopping\n", evidence);
            if (write(2, msg, (size_t)(len < (int)sizeof msg ? len : (int)sizeof msg - 1)) < 0)
                _exit(3);
            raise(SIGSTOP);
        }
        mtdemo_sleep(g_interval);
    }
    return NULL;
}

NOINLINE void app_main_loop_tick(void)
{
    void *p[10];
    for (int i = 0; i < 10; i++) {
        p[i] = malloc(256);
        memset(p[i], i, 256);
    }
    for (int i = 0; i < 10; i++) {
        mtdemo_sink(p[i]);
        free(p[i]);
    }
}

int main(int argc, char **argv)
{
    double seconds = (argc > 1 && argv[1][0] != '-') ? strtod(argv[1], NULL) : 5;
    g_interval = mtdemo_opt_double(argc, argv, "--interval-ms", 10) / 1000.0;
    pthread_t th;
    pthread_create(&th, NULL, integrity_thread, NULL);
    pthread_setname_np(th, "integrity");
    double t0 = mtdemo_now();
    while (mtdemo_now() - t0 < seconds) {
        app_main_loop_tick();
        mtdemo_sleep(0.1);
    }
    printf("done: anti_debug checks=%d detected=0\n", atomic_load(&g_checks));
    return 0;
}
