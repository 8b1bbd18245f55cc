// Allocations through libstdc++ (built without frame pointers): operator new from a template
// member function, and std::string's own allocation.  Lines the tests check are tagged @name.
#include <cstdio>
#include <string>

template <typename T> struct Pool {
  T *items = nullptr;
  __attribute__((noinline)) void fill(int n, T v) {
    items = new T[n];  // @new-call
    for (int i = 0; i < n; i++) items[i] = v;
  }
  ~Pool() { delete[] items; }
};

__attribute__((noinline)) std::size_t build_label(int i) {
  std::string s(30000 + i, 'x');  // @string-call
  return s.size();
}

int main() {
  std::size_t total = 0;
  for (int i = 0; i < 4; i++) {
    Pool<double> pool;
    pool.fill(2000, 1.5);
    total += build_label(i);
  }
  std::printf("done %zu\n", total);
  return 0;
}
