/* A small Mach-O library for the dSYM tests (built with clang -target arm64-apple-macos11). */
static inline __attribute__((always_inline)) int helper(int x) {
  return x * 3 + 1;  /* @helper-body */
}

__attribute__((noinline)) int mt_leaf(int x) {
  return helper(x) ^ 5;  /* @leaf-inline */
}

__attribute__((noinline)) int mt_caller(int x) {
  int r = mt_leaf(x);  /* @caller-call */
  return r + 2;
}
