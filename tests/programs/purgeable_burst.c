/*
 * The purgeable tracer's event ring under a burst: THREADS threads each make CALLS purgeable
 * vm_allocate + vm_purgable_control(SET VOLATILE) + vm_deallocate back to back, on the Darwin
 * stand-in (libmtdarwin) -- far faster than the agent's flush takes events, so the ring fills.
 * Every streamed call must end as an event or as a counted drop, and no thread may wait for the
 * agent (tests/integration/test_purgeable.py).  Prints "done" and exits.
 */
#include <pthread.h>
#include <stdio.h>

#include "mtdarwin.h"

#define THREADS 4
#define CALLS 3000

static void *burst(void *arg)
{
    (void)arg;
    for (int i = 0; i < CALLS; i++) {
        unsigned long addr = 0;
        if (vm_allocate(mach_task_self(), &addr, 16384, VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE) != 0)
            continue;
        int state = VM_PURGABLE_VOLATILE;
        vm_purgable_control(mach_task_self(), addr, VM_PURGABLE_SET_STATE, &state);
        vm_deallocate(mach_task_self(), addr, 16384);
    }
    return NULL;
}

int main(void)
{
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, burst, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    puts("done");
    return 0;
}
