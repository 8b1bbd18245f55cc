// bench_real.py workload: preprocessed, then compiled by cc1plus -O2 (the compiler proper, no driver).
#include <map>
#include <string>
#include <vector>
#include <algorithm>
#include <unordered_map>
#include <sstream>
#include <iostream>
template <class T> T total(const std::vector<T> &v) { T s{}; for (auto &x : v) s += x; return s; }
int main() {
  std::map<std::string, int> m; std::unordered_map<int, std::string> u; std::ostringstream os;
  for (int i = 0; i < 100; i++) { m[std::to_string(i)] = i; u[i] = std::to_string(i); os << i; }
  std::vector<int> v(10, 1); std::sort(v.begin(), v.end());
  std::cout << total(v) << os.str() << m.size() << u.size() << std::endl;
}
