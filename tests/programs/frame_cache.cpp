// Stacks the unwind walk's frame cache (cmodule/unwind.c) must give exactly as a full walk does, built
// with g++ -O2 and no frame pointers, so every frame is walked through unwind tables.  Deterministic:
// the same allocations on the same stacks every run.
//  - depths that change from one allocation to the next below shared outer frames, a recursion deeper
//    than --frames (truncated stacks: walks that end inside the cached levels and past them);
//  - one function called from two call sites of one frame (the same return addresses and stack
//    pointers inside it, another caller outside: the cache's words differ there);
//  - qsort comparators (glibc frames between ours), std::map / std::string churn;
//  - two threads doing the same, each with its own cache.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>

__attribute__((noinline)) static void *leaf(size_t n) {
  void *p = malloc(n);
  __asm__ volatile("" : : "r"(p) : "memory");
  return p;
}

__attribute__((noinline)) static void down(int depth, int i) {
  if (depth == 0) {
    free(leaf(16 + i % 7));
    return;
  }
  down(depth - 1, i);
  __asm__ volatile("" ::: "memory");   // no tail call: one frame per level
}

__attribute__((noinline)) static void via(int i) {
  down(i % 3, i);
  __asm__ volatile("" ::: "memory");
}

static int by_value(const void *a, const void *b) {
  free(strdup("comparator"));
  return *(const int *)a - *(const int *)b;
}

__attribute__((noinline)) static long work(int seed) {
  long total = 0;
  for (int i = 0; i < 3000; i++)
    down((i * 7 + seed) % 90, i);        // 0 .. 89 levels: past --frames 64 too
  for (int i = 0; i < 2000; i++) {
    if (i & 1) {                          // two call sites, one frame
      via(i);
      __asm__ volatile("" ::: "memory");
      total += 1;
    } else {
      via(i);
      __asm__ volatile("" ::: "memory");
      total += 3;
    }
  }
  int v[64];
  for (int r = 0; r < 20; r++) {
    for (int k = 0; k < 64; k++)
      v[k] = (k * 37 + r + seed) % 64;
    qsort(v, 64, sizeof v[0], by_value);
    total += v[0];
  }
  std::map<std::string, int> m;
  for (int i = 0; i < 5000; i++)
    m["key-" + std::to_string(i % 700)] += i;
  return total + (long)m.size();
}

int main() {
  long a = 0, b = 0;
  std::thread t([&] { a = work(1); });
  b = work(2);
  t.join();
  std::printf("%ld %ld\n", a, b);
  return 0;
}
