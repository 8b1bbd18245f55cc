/* libc_state ARG: prints a float, whether HOME is set, its own name, argc and ARG -- libc state
 * a program held before its constructors must find intact. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  printf("%f %s %s argc=%d %s\n", 3.25, getenv("HOME") ? "HOME-set" : "HOME-missing",
         program_invocation_short_name ? program_invocation_short_name : "(null)", argc, argc > 1 ? argv[1] : "");
  return 0;
}
