// peer_cases CASE: a memory profiler's classic test programs, one per CASE; every allocation has
// an exact size and its own function.
//   throw      5 x operator new(1111) in alloc_then_throw, each followed by a C++ exception
//              unwinding two frames before the next allocation
//   longjmp    5 x malloc(2222) in alloc_then_jump, each followed by a longjmp out of two frames
//   exit       malloc(3333) in alloc_before_exit, then exit(0)
//   _exit      malloc(3334) in alloc_before_exit, then _exit(0)
//   _Exit      malloc(3335) in alloc_before_exit, then _Exit(0)
//   tls        4 threads, each with a thread_local object whose destructor allocates 4444 B
//              (tls_destructor_alloc) as the thread ends
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <unistd.h>
#include <vector>

static void *volatile sink[64];
static std::jmp_buf jump_back;

__attribute__((noinline)) void throw_deeper(int i) {
  if (i >= 0)
    throw std::runtime_error("unwind");
}
__attribute__((noinline)) void alloc_then_throw(int i) {
  sink[i] = operator new(1111);
  throw_deeper(i);
}
__attribute__((noinline)) void jump_deeper(int i) { std::longjmp(jump_back, i + 1); }
__attribute__((noinline)) void alloc_then_jump(int i) {
  sink[10 + i] = malloc(2222);
  jump_deeper(i);
}
__attribute__((noinline)) void alloc_before_exit(size_t size) {
  sink[20] = malloc(size);
  memset(sink[20], 1, 16);
}

struct Leaver {
  ~Leaver() { tls_destructor_alloc(); }
  __attribute__((noinline)) static void tls_destructor_alloc() { sink[30] = malloc(4444); free(sink[30]); }
  int touched = 0;
};
thread_local Leaver leaver;

__attribute__((noinline)) void tls_thread_body() { leaver.touched = 1; }

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "";
  if (!strcmp(c, "throw")) {
    int caught = 0;
    for (int i = 0; i < 5; i++) {
      try {
        alloc_then_throw(i);
      } catch (const std::exception &) {
        caught++;
      }
    }
    printf("caught %d\n", caught);
  } else if (!strcmp(c, "longjmp")) {
    volatile int i = 0;
    int r = setjmp(jump_back);
    if (r != 0)
      i = r;
    if (i < 5)
      alloc_then_jump(i);
    printf("jumped %d\n", (int) i);
  } else if (!strcmp(c, "exit")) {
    alloc_before_exit(3333);
    exit(0);
  } else if (!strcmp(c, "_exit")) {
    alloc_before_exit(3334);
    _exit(0);
  } else if (!strcmp(c, "_Exit")) {
    alloc_before_exit(3335);
    _Exit(0);
  } else if (!strcmp(c, "tls")) {
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; i++)
      ts.emplace_back(tls_thread_body);
    for (auto &t : ts)
      t.join();
    printf("threads done\n");
  } else {
    return 2;
  }
  return 0;
}
