/* Names hostile to a terminal and to markup, for the escaping tests.
 *
 * Three allocating functions whose symbol names hold rich markup ("lone[/]", a "[link](...)"),
 * and terminal escape sequences (screen clear, window title).  With "print", the program also
 * writes such a line to stdout; with "wait", it renames itself (/proc/PID/comm) to a hostile
 * name and sleeps, for census and limit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

__attribute__((noinline)) void *alloc_lone(size_t n) __asm__("\"lone[/]\"");
__attribute__((noinline)) void *alloc_link(size_t n) __asm__("\"[link](http://x.example)[/link]\"");
__attribute__((noinline)) void *alloc_esc(size_t n) __asm__("\"esc\033[2J\033]0;pwned\007\"");

volatile void *sink;

void *alloc_lone(size_t n) { void *p = malloc(n); memset(p, 1, n); return p; }
void *alloc_link(size_t n) { void *p = malloc(n); memset(p, 2, n); return p; }
void *alloc_esc(size_t n) { void *p = malloc(n); memset(p, 3, n); return p; }

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        prctl(PR_SET_NAME, "[/]x[red]\033]0;t", 0, 0, 0);
        printf("ready\n");
        fflush(stdout);
        sleep(60);
        return 0;
    }
    usleep(300 * 1000);
    for (int i = 0; i < 4; i++) {
        sink = alloc_lone(65536);
        sink = alloc_link(65536);
        sink = alloc_esc(65536);
    }
    if (argc > 1 && strcmp(argv[1], "print") == 0) {
        printf("target says: \033[2J\033]0;title\007[bold]x[/bold]\n");
        fflush(stdout);
    }
    usleep(300 * 1000);
    return 0;
}
