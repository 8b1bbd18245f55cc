/* crash_first: faults on the very first instruction of crash_first (no prologue), which sits
 * right after before_crash in the text.  A faulting pc read as a return address (pc - 1) would
 * name before_crash; the crash is in crash_first, called from main. */
#include <stdio.h>
#include <stdlib.h>

void crash_first(void);
void before_crash(void);

__asm__(".text\n"
        ".globl before_crash\n.type before_crash, @function\n"
        "before_crash:\n  .cfi_startproc\n  ret\n  .cfi_endproc\n.size before_crash, .-before_crash\n"
        ".globl crash_first\n.type crash_first, @function\n"
        "crash_first:\n  .cfi_startproc\n  movl $1, 0x10\n  ret\n  .cfi_endproc\n.size crash_first, .-crash_first\n");

void *volatile sink;

int main(void) {
  sink = malloc(100);
  before_crash();
  crash_first();
  puts("not reached");
  return 0;
}
