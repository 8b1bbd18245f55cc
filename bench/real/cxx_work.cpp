// bench_real.py workload: std::map, std::string and std::vector churn, built with g++ -O2 (no frame pointers).
#include <cstdio>
#include <map>
#include <string>
#include <vector>
int main() {
  std::map<std::string, std::vector<int>> m;
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < 150000; i++) {
      std::string key = "key-" + std::to_string(i % 50000) + "-" + std::to_string(round);
      m[key].push_back(i);
    }
    std::vector<std::string> keys;
    for (auto &kv : m) keys.push_back(kv.first + "/" + std::to_string(kv.second.size()));
    if (round % 2) m.clear();
    std::printf("%zu\n", keys.size());
  }
  return 0;
}
