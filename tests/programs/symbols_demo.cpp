// Symbolization oracle: prints the return addresses of known call sites and where main was
// loaded, so a test can check each address's function, file:line (the lines tagged @name below)
// and inlined frames without asking any symbolizer.  Built with g++ -g -O2 by the tests.
#include <cstdio>
#include <cstdlib>
#include <vector>

extern "C" __attribute__((noinline)) void sink(const char *tag, void *p) {
  std::printf("%s %p\n", tag, __builtin_return_address(0));
  std::free(p);
}

template <typename T> struct Pool {
  std::vector<T> items;
  __attribute__((noinline)) void fill(int n, T v) {
    for (int i = 0; i < n; i++) items.push_back(v);
    sink("fill", std::malloc(16));  // @fill-call
  }
};

static inline __attribute__((always_inline)) int twice(int x) {
  int *p = static_cast<int *>(std::malloc(sizeof(int) * (x + 1)));
  sink("twice", p);  // @twice-call
  return x * 2;
}

__attribute__((noinline)) int outer(int x) {
  return twice(x) + 1;  // @outer-call
}

int main(int argc, char **) {
  std::printf("main %p\n", reinterpret_cast<void *>(&main));
  Pool<double> pool;
  pool.fill(argc + 2, 1.5);
  return outer(argc) == 3 ? 0 : 1;
}
