// cxx_hello: any C++ program; libstdc++'s constructor allocates its 72,704 B exception pool.
#include <iostream>

int main() {
  std::cout << "hello" << std::endl;
  return 0;
}
