/* jit_frame: an allocation made through code in no module (issue 20, item 2).
 *
 * main -> through_jit -> [generated code in an anonymous executable mapping] -> jit_callee ->
 * malloc(8123), 3 times.  The generated code keeps a frame record (push rbp; mov rbp, rsp), as a JIT's
 * code does, so a frame-pointer walk goes on past it to through_jit and main.  x86-64 only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void *volatile sink[4];

__attribute__((noinline)) void *jit_callee(size_t n) { return malloc(n); }

typedef void *(*jit_fn)(void *(*)(size_t), size_t);

__attribute__((noinline)) void *through_jit(jit_fn code, size_t n) {
  void *p = code(jit_callee, n);
  __asm__ volatile("" ::: "memory");      /* no tail call: through_jit keeps its frame */
  return p;
}

int main(void) {
#if defined(__x86_64__)
  static const unsigned char body[] = {
      0x55,                   /* push %rbp */
      0x48, 0x89, 0xe5,       /* mov %rsp, %rbp */
      0x48, 0x89, 0xf8,       /* mov %rdi, %rax */
      0x48, 0x89, 0xf7,       /* mov %rsi, %rdi */
      0xff, 0xd0,             /* call *%rax */
      0x5d,                   /* pop %rbp */
      0xc3,                   /* ret */
  };
  unsigned char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return 1;
  memcpy(page + 256, body, sizeof body);  /* not at the mapping's start: an offset into it */
  if (mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0) return 1;
  printf("jit %p\n", (void *)(page + 256));
  fflush(stdout);
  for (int i = 0; i < 3; i++) sink[i] = through_jit((jit_fn)(void *)(page + 256), 8123);
  return 0;
#else
  return 2;
#endif
}
