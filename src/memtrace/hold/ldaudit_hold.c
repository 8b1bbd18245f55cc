/*
 * memtrace's hold: an LD_AUDIT library that stops a program memtrace starts after the dynamic
 * loader has loaded and relocated every library (and run libc's early initialisation), before
 * any constructor -- so the allocator is hooked before the first DT_INIT / DT_INIT_ARRAY runs.
 *
 * Frida's own spawn on Linux injects at the program's first initializer or entry point, after
 * every library constructor: libstdc++'s 72,704 B emergency pool and every allocation made in a
 * constructor went unseen.  glibc calls an audit library's la_activity(LA_ACT_CONSISTENT) once
 * the initial link map is complete and relocated, just before _dl_init (elf/rtld.c, dl_main):
 * that is where the program waits here.
 *
 * Protocol (memtrace.hold): MEMTRACE_HOLD names a file F the host created.  The first process
 * to get here renames F to F.held (atomic: only one process is ever held, never a child or an
 * image the target execs later) and sleeps until F.held is gone -- the host removes it once the
 * agent's hooks are in -- or HOLD_MAX_MS have passed (a host that died must not leave it hung).
 * Everything else returns at once.
 *
 * No libc: this library is loaded in the audit namespace, where a libc of its own would be a
 * second copy.  Only raw system calls.
 */
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>

#define HOLD_MAX_MS 60000
#define CHILD_HOLD_MAX_MS 10000    /* a followed child's image waits this long at most */
#define CHILD_ENV_NAME "MEMTRACE_HOLD_CHILDREN="
#define AT_FDCWD_ (-100)
#define ENV_NAME "MEMTRACE_HOLD="
#define ENV_CHUNK 4096
#define PATH_MAX_ 1024

#if defined(__x86_64__)
# define NR_READ 0
# define NR_CLOSE 3
# define NR_NANOSLEEP 35
# define NR_OPENAT 257
# define NR_RENAMEAT 264
# define NR_FACCESSAT 269
# define NR_GETPID 39
static long
sys4 (long n, long a, long b, long c, long d)
{
  long r;
  register long r10 __asm__ ("r10") = d;
  __asm__ volatile ("syscall" : "=a" (r) : "0" (n), "D" (a), "S" (b), "d" (c), "r" (r10) : "rcx", "r11", "memory");
  return r;
}
#elif defined(__aarch64__)
/* ARCH-UNVERIFIED: never run (memtrace.hold uses it only when asked: MEMTRACE_HOLD_ARCH_UNVERIFIED). */
# define NR_READ 63
# define NR_CLOSE 57
# define NR_NANOSLEEP 101
# define NR_OPENAT 56
# define NR_RENAMEAT 276                /* renameat2 (flags 0): arm64 has no renameat */
# define NR_FACCESSAT 48
# define NR_GETPID 172
static long
sys4 (long n, long a, long b, long c, long d)
{
  register long x8 __asm__ ("x8") = n;
  register long x0 __asm__ ("x0") = a;
  register long x1 __asm__ ("x1") = b;
  register long x2 __asm__ ("x2") = c;
  register long x3 __asm__ ("x3") = d;
  register long x4 __asm__ ("x4") = 0;   /* renameat2's flags */
  __asm__ volatile ("svc #0" : "+r" (x0) : "r" (x8), "r" (x1), "r" (x2), "r" (x3), "r" (x4) : "memory");
  return x0;
}
#else
# error "memtrace hold: x86_64 and aarch64 only"
#endif

static int seen;                    /* la_activity runs again at every dlopen: hold once at most */
static struct link_map * libc_map;  /* the program's libc (la_objopen) */
static char held[PATH_MAX_ + 8];
static char chunk[ENV_CHUNK];

unsigned int
la_version (unsigned int version)
{
  return version;
}

unsigned int
la_objopen (struct link_map * map, Lmid_t lmid, uintptr_t * cookie)
{
  const char * name = map->l_name;
  int n = 0;
  (void) cookie;
  if (lmid == LM_ID_BASE && name != 0)
  {
    while (name[n] != '\0')
      n++;
    if (n >= 10 && name[n - 10] == '/' && name[n - 9] == 'l' && name[n - 8] == 'i' && name[n - 7] == 'b'
        && name[n - 6] == 'c' && name[n - 5] == '.' && name[n - 4] == 's' && name[n - 3] == 'o'
        && name[n - 2] == '.' && name[n - 1] == '6')
      libc_map = map;
  }
  return 0;                         /* no symbol binding callbacks: PLT calls stay as they are */
}

/* The field after the last ')' of /proc/self/stat numbered `field` (1-based, as proc(5) counts). */
static unsigned long
stat_field (int field)
{
  int fd = (int) sys4 (NR_OPENAT, AT_FDCWD_, (long) "/proc/self/stat", 0, 0);
  long n, i, last = -1;
  int f = 2;
  unsigned long v = 0;
  if (fd < 0)
    return 0;
  n = sys4 (NR_READ, fd, (long) chunk, ENV_CHUNK - 1, 0);
  sys4 (NR_CLOSE, fd, 0, 0, 0);
  for (i = 0; i < n; i++)
    if (chunk[i] == ')')
      last = i;
  if (last < 0)
    return 0;
  for (i = last + 1; i < n && f < field; i++)
    if (chunk[i] == ' ')
      f++;
  for (; i < n && chunk[i] >= '0' && chunk[i] <= '9'; i++)
    v = v * 10 + (unsigned long) (chunk[i] - '0');
  return v;
}

static int
str_eq (const char * a, const char * b)
{
  while (*a != '\0' && *a == *b)
    a++, b++;
  return *a == *b;
}

/* A symbol of `map` by name, through its DT_GNU_HASH table (what glibc's libc has); NULL if absent. */
static void *
find_symbol (struct link_map * map, const char * name)
{
  const ElfW(Dyn) * d;
  const ElfW(Sym) * symtab = 0;
  const char * strtab = 0;
  const uint32_t * gnu = 0;
  unsigned long base = (unsigned long) map->l_addr;
  uint32_t h = 5381, nbuckets, symoffset, bloom_size, i;
  const uint32_t * buckets, * chain;
  const unsigned char * c;
  for (d = map->l_ld; d->d_tag != DT_NULL; d++)
  {
    /* ld.so has made these absolute in place (they were offsets in the file). */
    unsigned long v = d->d_un.d_ptr < base ? base + d->d_un.d_ptr : d->d_un.d_ptr;
    if (d->d_tag == DT_SYMTAB)
      symtab = (const ElfW(Sym) *) v;
    else if (d->d_tag == DT_STRTAB)
      strtab = (const char *) v;
    else if (d->d_tag == DT_GNU_HASH)
      gnu = (const uint32_t *) v;
  }
  if (symtab == 0 || strtab == 0 || gnu == 0)
    return 0;
  for (c = (const unsigned char *) name; *c != '\0'; c++)
    h = h * 33 + *c;
  nbuckets = gnu[0];
  symoffset = gnu[1];
  bloom_size = gnu[2];
  buckets = gnu + 4 + bloom_size * (sizeof (ElfW(Addr)) / 4);
  chain = buckets + nbuckets;
  i = buckets[h % nbuckets];
  if (i < symoffset)
    return 0;
  for (;; i++)
  {
    uint32_t ch = chain[i - symoffset];
    if ((ch | 1) == (h | 1) && str_eq (strtab + symtab[i].st_name, name) && symtab[i].st_shndx != SHN_UNDEF)
      return (void *) (base + symtab[i].st_value);
    if (ch & 1)
      return 0;
  }
}

/* While the program waited, Frida's injector dlopen'ed its agent on a thread of its own, and
 * the dynamic loader ran libc's initializer there with what that dlopen passes (argc 0, no argv,
 * no environment, and per-thread state set up on the wrong thread): a later printf("%f") crashed,
 * environ was NULL.  Run libc's initializers again, here on the main thread, with the program's
 * own argc, argv and envp (from the initial stack: proc(5)'s startstack points at argc), as
 * ld.so's call_init would: DT_INIT, then each DT_INIT_ARRAY entry.  They only set globals
 * and this thread's state, so a second run is harmless. */
static void
reinit_libc (void)
{
  typedef void (* InitFn) (int, char **, char **);
  void (* ctype_init) (void);
  const ElfW(Dyn) * d;
  unsigned long init = 0, array = 0, arraysz = 0, base, i;
  long * sp = (long *) stat_field (28);
  int argc;
  char ** argv;
  if (libc_map == 0 || sp == 0)
    return;
  argc = (int) sp[0];
  argv = (char **) (sp + 1);
  base = (unsigned long) libc_map->l_addr;
  for (d = libc_map->l_ld; d->d_tag != DT_NULL; d++)
  {
    if (d->d_tag == DT_INIT)
      init = d->d_un.d_ptr;
    else if (d->d_tag == DT_INIT_ARRAY)
      array = d->d_un.d_ptr;
    else if (d->d_tag == DT_INIT_ARRAYSZ)
      arraysz = d->d_un.d_val;
  }
  /* (These entries are offsets: ld.so adds l_addr when it calls them.) */
  if (init != 0)
    ((InitFn) (base + init)) (argc, argv, argv + argc + 1);
  if (array != 0)
    for (i = 0; i < arraysz / sizeof (void *); i++)
    {
      InitFn fn = ((InitFn *) (base + array))[i];
      if (fn != 0 && fn != (InitFn) -1)
        fn (argc, argv, argv + argc + 1);
    }
  /* This thread's ctype tables (thread-local pointers that printf("%f") and isdigit read) came out
   * NULL after the injection: set them again, as every new thread does. */
  ctype_init = (void (*) (void)) find_symbol (libc_map, "__ctype_init");
  if (ctype_init != 0)
    ctype_init ();
}

/* Whether `entry` ("NAME=value") starts with `prefix`. */
static int
starts_with (const char * entry, const char * prefix)
{
  while (*prefix != '\0')
    if (*entry++ != *prefix++)
      return 0;
  return 1;
}

/* Whether LD_AUDIT's value is this library alone (memtrace.hold names it memtrace-hold-*.so; a
 * list -- the user's own auditors after it -- is left as it is). */
static int
own_audit (const char * value)
{
  const char * mark = "/memtrace-hold-";
  int found = 0;
  for (; *value != '\0'; value++)
  {
    if (*value == ':')
      return 0;
    if (!found && starts_with (value, mark))
      found = 1;
  }
  return found;
}

/* The program's environment without what memtrace added to it (the hold's variables, and
 * LD_AUDIT when it names only this library): a program that prints or passes on its environment
 * sees its own.  Not when following children: they need both to be held in turn. */
static void
scrub_environment (void)
{
  long * sp = (long *) stat_field (28);
  char ** envp, ** out;
  if (sp == 0)
    return;
  envp = (char **) (sp + 1) + sp[0] + 1;
  for (out = envp; *envp != 0; envp++)
  {
    const char * e = *envp;
    if (starts_with (e, ENV_NAME))
      continue;
    if (starts_with (e, "LD_AUDIT=") && own_audit (e + 9))
      continue;
    *out++ = *envp;
  }
  *out = 0;
}

/* An environment variable's value (want: "NAME=") into held[] (NUL-terminated); 0 when it is not
 * set.  /proc/self/environ, read in chunks: a variable may straddle two. */
static int
env_value (const char * want)
{
  int fd = (int) sys4 (NR_OPENAT, AT_FDCWD_, (long) "/proc/self/environ", 0, 0);
  int matched = 0, in_value = 0, at_start = 1, len = 0, found = 0;
  long n, i;
  if (fd < 0)
    return 0;
  while (!found && (n = sys4 (NR_READ, fd, (long) chunk, ENV_CHUNK, 0)) > 0)
  {
    for (i = 0; i < n && !found; i++)
    {
      char c = chunk[i];
      if (in_value)
      {
        if (c == '\0')
          found = 1;
        else if (len < PATH_MAX_)
          held[len++] = c;
        continue;
      }
      if (c == '\0')
      {
        matched = 0;
        at_start = 1;
        continue;
      }
      if (at_start && c == want[matched])
      {
        if (want[++matched] == '\0')
          in_value = 1;
        continue;
      }
      at_start = 0;
      matched = 0;
    }
  }
  if (in_value)
    found = 1;
  sys4 (NR_CLOSE, fd, 0, 0, 0);
  held[len] = '\0';
  return found && len > 0 && len < PATH_MAX_;
}

/* held[] (a folder) becomes held[]/<pid>, created exclusively; 1 when it was. */
static int
child_file (void)
{
  char digits[24];
  long pid = sys4 (NR_GETPID, 0, 0, 0, 0);
  int n = 0, k = 0, fd;
  while (held[n] != '\0')
    n++;
  if (pid <= 0 || n + 24 > PATH_MAX_)
    return 0;
  do
  {
    digits[k++] = (char) ('0' + pid % 10);
    pid /= 10;
  } while (pid > 0);
  held[n++] = '/';
  while (k > 0)
    held[n++] = digits[--k];
  held[n] = '\0';
  fd = (int) sys4 (NR_OPENAT, AT_FDCWD_, (long) held, 0x41 | 0x80, 0600);   /* O_WRONLY | O_CREAT | O_EXCL */
  if (fd < 0)
    return 0;
  sys4 (NR_CLOSE, fd, 0, 0, 0);
  return 1;
}

void
la_activity (uintptr_t * cookie, unsigned int flag)
{
  char file[PATH_MAX_ + 8];
  struct { long s, ns; } tick = { 0, 1000000 };
  int i, n;
  (void) cookie;
  if (flag != LA_ACT_CONSISTENT || seen)
    return;
  seen = 1;
  if (env_value (ENV_NAME))
  {
    for (n = 0; held[n] != '\0'; n++)
      file[n] = held[n];
    file[n] = '\0';
    held[n] = '.'; held[n + 1] = 'h'; held[n + 2] = 'e'; held[n + 3] = 'l'; held[n + 4] = 'd'; held[n + 5] = '\0';
    if (sys4 (NR_RENAMEAT, AT_FDCWD_, (long) file, AT_FDCWD_, (long) held) == 0)
    {
      for (i = 0; i < HOLD_MAX_MS && sys4 (NR_FACCESSAT, AT_FDCWD_, (long) held, 0, 0) == 0; i++)
        sys4 (NR_NANOSLEEP, (long) &tick, 0, 0, 0);
      if (!env_value (CHILD_ENV_NAME))
        scrub_environment ();
      reinit_libc ();
      return;
    }
  }
  /* Not the target itself: a process it started or an image it exec'd.  With --follow-children
   * the host watches MEMTRACE_HOLD_CHILDREN: this image posts DIR/<pid> and waits until the host
   * (attached, hooks in) removes it.  No folder (the run is over): no wait. */
  if (!env_value (CHILD_ENV_NAME) || !child_file ())
    return;
  for (i = 0; i < CHILD_HOLD_MAX_MS && sys4 (NR_FACCESSAT, AT_FDCWD_, (long) held, 0, 0) == 0; i++)
    sys4 (NR_NANOSLEEP, (long) &tick, 0, 0, 0);
  reinit_libc ();
}
