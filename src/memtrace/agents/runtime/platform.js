/*
 * Where the agent runs and how it finds the target's functions.
 */

export const NATIVE_PLATFORM = Process.platform;   // 'linux' | 'darwin' | ...
export const IS_DARWIN = NATIVE_PLATFORM === 'darwin';
const T0 = Date.now();

/* Milliseconds since the agent loaded: the `t` of every message. */
export function now() {
  return Date.now() - T0;
}

/* Which of these thread ids are Frida's own (cloaked): the host's injection boost keeps those
 * favoured until the agent is gone and gives any other its priority back (memtrace.priority; the
 * tracers' rpc and the one-shot agents' alike). */
export function fridaThreadsAmong(tids) {
  return tids.filter(tid => Cloak.hasThread(tid));
}

export function findExport(name, moduleName) {
  if (moduleName) {
    const m = Process.findModuleByName(moduleName);
    return m === null ? null : m.findExportByName(name);
  }
  return Module.findGlobalExportByName(name);
}

/* `name` as `module` exports it, else as its symbol table defines it (a hidden symbol, a variable
 * left out of the exports; never an import of another module's), or null. */
export function moduleSymbol(module, name) {
  const p = module.findExportByName(name);
  if (p !== null)
    return p;
  const s = module.enumerateSymbols().find(x => x.name === name && x.type !== 'undefined' && !x.address.isNull());
  return s === undefined ? null : s.address;
}

let libc;   // undefined until first asked for

/* The C library (Linux): its own exports, never a same-named one from another module
 * (the agent's allocator among them).  null on Darwin, where names are two-level anyway,
 * so libcExport there is the global export. */
export function libcModule() {
  if (IS_DARWIN)
    return null;
  if (libc === undefined)
    libc = Process.enumerateModules().find(m => /^libc[.-]/.test(m.name) || m.name === 'libc.so') || null;
  return libc;
}

export function libcExport(name) {
  const m = libcModule();
  const p = m === null ? null : m.findExportByName(name);
  return p !== null ? p : findExport(name);
}

export function libcFunction(name, ret, args) {
  const p = findExport(name);
  return p === null ? null : new NativeFunction(p, ret, args);
}

export function moduleOf(address) {
  const m = Process.findModuleByAddress(address);
  return m === null ? null : m.name;
}

/* ---- /proc, read with raw system calls (Linux) --------------------------------------------------
 *
 * Read with syscall(2), never libc's opendir/readdir, whose buffers come from the very allocator
 * memtrace traces (and whose open the fd tracer hooks): a listing taken from inside a tracer must
 * not show up in what it traces.  Numbers per architecture; ia32, arm and arm64 ARCH-UNVERIFIED
 * (the tests run on x86-64). */
const LINUX_SYSCALLS = {
  x64: { openat: 257, getdents64: 217, readlinkat: 267, close: 3 },
  arm64: { openat: 56, getdents64: 61, readlinkat: 78, close: 57 },
  ia32: { openat: 295, getdents64: 220, readlinkat: 305, close: 6 },
  arm: { openat: 322, getdents64: 217, readlinkat: 332, close: 6 },
};
const AT_FDCWD = -100;
const O_RDONLY_DIRECTORY_CLOEXEC = 0o200000 | 0o2000000;
const DIRENTS_BYTES = 16384;        // getdents64's buffer: a call returns as many entries as fit
let rawSyscall;                     // undefined until first asked for; null: none here

/* {nr, call}: this architecture's numbers (LINUX_SYSCALLS) and call(n, a, b, c, d) -> the raw
 * result (a negative errno on failure); null on Darwin or where either is unknown. */
export function linuxSyscalls() {
  if (rawSyscall === undefined) {
    const nr = IS_DARWIN ? undefined : LINUX_SYSCALLS[Process.arch];
    const sys = libcExport('syscall');
    if (nr === undefined || sys === null) {
      rawSyscall = null;
    } else {
      // syscall(2) is variadic: declared so ('...'), every argument a register-sized word.
      const raw = new NativeFunction(sys, 'long', ['long', '...', 'pointer', 'pointer', 'pointer', 'pointer']);
      const word = v => (v instanceof NativePointer ? v : ptr(v));
      rawSyscall = { nr, call: (n, a = 0, b = 0, c = 0, d = 0) => Number(raw(n, word(a), word(b), word(c), word(d))) };
    }
  }
  return rawSyscall;
}

/* The entry names of a /proc directory (Linux: /proc/self/task, /proc/self/fd), '.' and '..' left
 * out, handed to use(names, dirFd, syscalls) while the directory is still open (a caller reads
 * links relative to it) and use's result returned; null when it could not be read. */
export function readProcDir(path, use = names => names) {
  const sys = linuxSyscalls();
  if (sys === null)
    return null;
  const { nr, call } = sys;
  const dirFd = call(nr.openat, AT_FDCWD, Memory.allocUtf8String(path), O_RDONLY_DIRECTORY_CLOEXEC, 0);
  if (dirFd < 0)
    return null;
  try {
    const buf = Memory.alloc(DIRENTS_BYTES);
    const names = [];
    for (;;) {
      const n = call(nr.getdents64, dirFd, buf, DIRENTS_BYTES);
      if (n <= 0)
        break;
      // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name
      for (let off = 0; off < n;) {
        const name = buf.add(off + 19).readUtf8String();
        if (name !== '.' && name !== '..')
          names.push(name);
        off += buf.add(off + 16).readU16();
      }
    }
    return use(names, dirFd, sys);
  } finally {
    call(nr.close, dirFd);
  }
}
