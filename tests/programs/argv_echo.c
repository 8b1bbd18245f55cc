/* argv_echo ARGS...: prints each argument it was given, argv[0] first, one per line, as "argv[i]=...". */
#include <stdio.h>

int
main (int argc, char ** argv)
{
  for (int i = 0; i < argc; i++)
    printf ("argv[%d]=%s\n", i, argv[i]);
  return 0;
}
