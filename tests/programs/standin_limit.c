/*
 * A process the limit agent watches on the stand-in: 8 MiB of footprint (mach_vm_allocate), and on
 * each stdin line a kernel memory-status note or a limit change, answered "ok":
 *   warn | critical | proc-limit-warn | msl     the note (DISPATCH_MEMORYPRESSURE_* bits)
 *   limit BYTES MANAGED                         mtdarwin_set_memlimit
 *   events                                      prints what malloc_memory_event_handler received
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtdarwin.h"
#include "mtmalloc.h"

int main(void)
{
    unsigned long long addr = 0;
    mach_vm_allocate(mach_task_self(), &addr, 8ul << 20, VM_FLAGS_ANYWHERE);
    puts("ready");
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long limit;
        int managed;
        if (strncmp(line, "warn", 4) == 0)
            mtdarwin_memorystatus_notify(DISPATCH_MEMORYPRESSURE_WARN);
        else if (strncmp(line, "critical", 8) == 0)
            mtdarwin_memorystatus_notify(DISPATCH_MEMORYPRESSURE_CRITICAL);
        else if (strncmp(line, "proc-limit-warn", 15) == 0)
            mtdarwin_memorystatus_notify(DISPATCH_MEMORYPRESSURE_PROC_LIMIT_WARN);
        else if (strncmp(line, "msl", 3) == 0)
            mtdarwin_memorystatus_notify(0x10000000ul);
        else if (sscanf(line, "limit %llu %d", &limit, &managed) == 2)
            mtdarwin_set_memlimit(limit, managed);
        else if (strncmp(line, "events", 6) == 0) {
            unsigned long n, last;
            mtmalloc_memory_events(&n, &last);
            printf("events %lu 0x%lx\n", n, last);
        }
        puts("ok");
        fflush(stdout);
    }
    return 0;
}
