/* The executable of a test .app bundle: calls into symbols_macho.c. */
int mt_caller(int);

__attribute__((noinline)) int app_work(int x) {
  return mt_caller(x) + 7;  /* @app-call */
}

int main(int argc, char **argv) {
  (void)argv;
  return app_work(argc);
}
