/* Issue 21 item 4: more distinct stacks than the old fixed table held, and one stack deeper than
 * the default depth.
 *   many_stacks paths DEPTH   every path of a binary call tree DEPTH levels deep (two functions,
 *                             left and right, at each level) allocates 24 bytes once at its leaf:
 *                             2^DEPTH distinct stacks, one allocation each, all freed at the end
 *   many_stacks deep N        one allocation of 4242 bytes N calls deep (recurse), freed
 * Built with frame pointers and no sibling calls (tests/conftest.py): every level keeps a frame. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ** blocks;
static long n_blocks;

static void left (int depth);
static void right (int depth);

static void __attribute__ ((noinline))
leaf (void)
{
  blocks[n_blocks++] = malloc (24);
}

static void __attribute__ ((noinline))
left (int depth)
{
  if (depth == 0)
  {
    leaf ();
    return;
  }
  left (depth - 1);
  right (depth - 1);
  __asm__ __volatile__ ("" ::: "memory");
}

static void __attribute__ ((noinline))
right (int depth)
{
  if (depth == 0)
  {
    leaf ();
    return;
  }
  left (depth - 1);
  right (depth - 1);
  __asm__ __volatile__ ("" ::: "memory");
}

static void * __attribute__ ((noinline))
recurse (int n)
{
  void * p = n == 0 ? malloc (4242) : recurse (n - 1);
  __asm__ __volatile__ ("" ::: "memory");
  return p;
}

int
main (int argc, char ** argv)
{
  long i;
  if (argc == 3 && strcmp (argv[1], "paths") == 0)
  {
    int depth = atoi (argv[2]);
    blocks = calloc ((size_t) 1 << depth, sizeof (void *));
    left (depth - 1);
    right (depth - 1);
    for (i = 0; i != n_blocks; i++)
      free (blocks[i]);
    free (blocks);
    printf ("paths %ld\n", n_blocks);
    return 0;
  }
  if (argc == 3 && strcmp (argv[1], "deep") == 0)
  {
    free (recurse (atoi (argv[2])));
    return 0;
  }
  fprintf (stderr, "usage: many_stacks paths DEPTH | deep N\n");
  return 2;
}
