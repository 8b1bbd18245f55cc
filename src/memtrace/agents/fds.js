/*
 * File-descriptor tracer (docs/domain/oom-taxonomy.md, "Too many open files"): every entry that creates or
 * releases a descriptor, with the creating stack, plus fd censuses that map every open
 * descriptor to what it is.  Descriptor calls are rare next to malloc: plain JS listeners.
 *
 *   creators   open/openat/creat (path known), socket, accept, dup/dup2/dup3, pipe/pipe2,
 *              socketpair, eventfd, epoll_create, timerfd_create, signalfd, memfd_create,
 *              inotify_init, opendir (glibc opens it with an internal open), fopen family
 *              (seen through open: fopen reaches the exported open's code).
 *   releases   close, fclose and closedir (glibc closes their fds with an internal
 *              close_nocancel that never passes through close).
 *   census     /proc/self/fd read with raw syscalls (getdents64, readlinkat), so the census
 *              never re-enters our own hooks; on Darwin proc_pidinfo(PROC_PIDLISTFDS) +
 *              fcntl(F_GETPATH) -- DEVICE-UNVERIFIED, written from xnu's headers.
 *              Taken at start, at the end, and when the count of open descriptors passes
 *              --census-at and then every --census-step more (docs/domain/oom-taxonomy.md, "Monitoring").
 *
 * A descriptor opened by an entry not hooked here still shows up in the end census: the
 * analyzer reports it as "opened out of sight" instead of losing it.
 */

import { emitJson, warn } from './runtime/flush.js';
import { applyListeners, attachListener, detachListeners } from './runtime/listeners.js';
import { IS_DARWIN, findExport, libcExport, libcModule, readProcDir } from './runtime/platform.js';
import { entryFrames } from './runtime/stacks.js';

const FD_FRAMES = 16;

const fds = {
  listeners: [],
  hooked: new Set(),         // addresses: glibc aliases (open/open64) share one body
  open: new Set(),           // descriptors open as far as we know (census + hooks)
  censusAt: 1000,
  censusStep: 50,
  lastCensusCount: null,     // open count at the last threshold census
  fileno: null,
  dirfd: null,
  census: null,              // platform census function
};

/* ---- census ------------------------------------------------------------- */

/* /proc/self/fd read with raw system calls (runtime/platform.js readProcDir): [fd, link target]. */
function linuxCensus() {
  return readProcDir('/proc/self/fd', (names, dirFd, { nr, call }) => {
    const link = Memory.alloc(4096);
    const entries = [];
    for (const name of names) {
      const fd = parseInt(name, 10);
      if (fd === dirFd)
        continue;   // the census's own descriptor
      const len = call(nr.readlinkat, dirFd, Memory.allocUtf8String(name), link, 4095);
      entries.push([fd, len > 0 ? link.readUtf8String(len) : null]);
    }
    return entries;
  });
}

const PROC_PIDLISTFDS = 1;
const F_GETPATH = 50;
const DARWIN_FD_TYPES = { 1: 'vnode', 2: 'socket', 3: 'pshm', 4: 'psem', 5: 'kqueue', 6: 'pipe',
  7: 'fsevents', 9: 'netpolicy', 10: 'channel', 11: 'nexus' };

function darwinCensus() {
  // DEVICE-UNVERIFIED: struct proc_fdinfo { int32_t proc_fd; uint32_t proc_fdtype; }.
  const info = findExport('proc_pidinfo');
  const fcntlP = findExport('fcntl');
  if (info === null)
    return null;
  const pidinfo = new NativeFunction(info, 'int', ['int', 'int', 'uint64', 'pointer', 'int']);
  // fcntl is variadic: on Apple arm64 the variadic argument goes on the stack, so without the '...'
  // the kernel would read the path buffer's address from a stale stack slot and copy 1 KB there.
  const fcntl = fcntlP === null ? null : new NativeFunction(fcntlP, 'int', ['int', 'int', '...', 'pointer']);
  const size = 8 * 65536;
  const buf = Memory.alloc(size);
  const n = pidinfo(Process.id, PROC_PIDLISTFDS, 0, buf, size);
  if (n <= 0)
    return null;
  const path = Memory.alloc(1024);
  const entries = [];
  for (let off = 0; off + 8 <= n; off += 8) {
    const fd = buf.add(off).readS32();
    const type = buf.add(off + 4).readU32();
    let what = `${DARWIN_FD_TYPES[type] || 'type-' + type}:`;
    if (type === 1 && fcntl !== null && fcntl(fd, F_GETPATH, path) === 0)
      what = path.readUtf8String();
    entries.push([fd, what]);
  }
  return entries;
}

function takeCensus(trigger) {
  let entries = null;
  try {
    entries = fds.census === null ? null : fds.census();
  } catch (e) {
    warn(`fd census failed: ${e.message || e}`);
  }
  if (entries === null)
    return null;
  // Frida's own descriptors (its sockets, its eventfds) are cloaked, and its spawn helper's
  // memfd is named so: listed apart, never counted as the target's, never blamed.
  const frida = [];
  for (const [fd, what] of entries) {
    let cloaked = false;
    try {
      cloaked = Cloak.hasFileDescriptor(fd);
    } catch (e) {
      // an older Frida without the Cloak API
    }
    if (cloaked || (typeof what === 'string' && what.startsWith('/memfd:frida')))
      frida.push(fd);
  }
  const own = entries.filter(([fd]) => !frida.includes(fd));
  emitJson({ type: 'census', trigger, count: own.length, tracked: fds.open.size, fds: entries, frida,
    activity: false });
  return own;
}

function maybeCensus() {
  const n = fds.open.size;
  if (n <= fds.censusAt)
    return;
  if (fds.lastCensusCount !== null && n < fds.lastCensusCount + fds.censusStep)
    return;
  fds.lastCensusCount = n;
  takeCensus('threshold');
}

/* ---- hooks -------------------------------------------------------------- */

/* Stacks: entryFrames (our own frame-pointer walk).  A C library built without frame
 * pointers breaks the chain (fopen -> _IO_file_open -> open): when the walk finds no frame
 * outside the C library, the fuzzy backtracer (a stack scan, which can add a stale frame) is
 * the only way to the caller. */
function frames(ctx) {
  const walked = entryFrames(ctx, FD_FRAMES);
  const libc = libcModule();
  if (libc === null)
    return walked;
  const end = libc.base.add(libc.size);
  const inLibc = a => ptr(a).compare(libc.base) >= 0 && ptr(a).compare(end) < 0;
  if (!walked.every(inLibc))
    return walked;
  return Thread.backtrace(ctx, Backtracer.FUZZY).slice(0, FD_FRAMES).map(p => p.toString());
}

function readPath(p) {
  try {
    return p.isNull() ? null : p.readUtf8String();
  } catch (e) {
    return null;
  }
}

function opened(call, fdList, extra, stack) {
  const ev = Object.assign({ type: 'open', call, fds: fdList, tid: Process.getCurrentThreadId(),
    frames: stack }, extra);
  const replaced = fdList.filter(fd => fds.open.has(fd));
  if (replaced.length > 0)
    ev.replaced = replaced;       // dup2/dup3 onto an open descriptor closes it first
  for (const fd of fdList)
    fds.open.add(fd);
  emitJson(ev);
  maybeCensus();
}

function failed(call, errno, extra, stack) {
  emitJson(Object.assign({ type: 'open-failed', call, errno, tid: Process.getCurrentThreadId(),
    frames: stack }, extra));
}

function closed(call, fd) {
  const known = fds.open.delete(fd);
  emitJson({ type: 'close', call, fd, known, tid: Process.getCurrentThreadId() });
}

function attach(name, callbacks) {
  const p = libcExport(name);
  if (p === null || fds.hooked.has(p.toString()))
    return;   // missing, or an alias of a body already hooked (open64 = open on glibc)
  if (attachListener(name, p, callbacks, fds.listeners))
    fds.hooked.add(p.toString());
}

/* A call that returns one new descriptor (or -1).  pathArg: index of a path argument. */
function returnsFd(name, pathArg) {
  return {
    onEnter(args) {
      this.frames = frames(this.context);
      if (pathArg !== undefined)
        this.path = readPath(args[pathArg]);
    },
    onLeave(retval) {
      const fd = retval.toInt32();
      const extra = pathArg === undefined ? {} : { path: this.path };
      if (fd >= 0)
        opened(name, [fd], extra, this.frames);
      else
        failed(name, this.errno, extra, this.frames);
    },
  };
}

/* dup2/dup3: the new descriptor is the second argument. */
function dupsOnto(name) {
  return {
    onEnter(args) {
      this.frames = frames(this.context);
      this.from = args[0].toInt32();
    },
    onLeave(retval) {
      const fd = retval.toInt32();
      if (fd >= 0 && fd !== this.from)   // dup2(fd, fd) changes nothing
        opened(name, [fd], { from: this.from }, this.frames);
      else if (fd < 0)
        failed(name, this.errno, { from: this.from }, this.frames);
    },
  };
}

/* pipe/pipe2/socketpair: two descriptors written to an int[2]. */
function returnsPair(name, arrayArg) {
  return {
    onEnter(args) {
      this.frames = frames(this.context);
      this.pair = args[arrayArg];
    },
    onLeave(retval) {
      if (retval.toInt32() === 0)
        opened(name, [this.pair.readS32(), this.pair.add(4).readS32()], {}, this.frames);
      else
        failed(name, this.errno, {}, this.frames);
    },
  };
}

/* Releases are recorded on entry, before the kernel frees the number: recorded after, another
 * thread's open could reuse it first and its open would be logged before this close.  A close
 * of a descriptor that was not open is harmless (the analyzer ignores it); Linux releases the
 * descriptor even when close reports EINTR or EIO. */
function closesFd(name) {
  return function (args) {
    closed(name, args[0].toInt32());
  };
}

/* fclose/closedir: the descriptor is read from the stream before it goes. */
function closesStream(name, toFd) {
  return function (args) {
    const fd = args[0].isNull() || toFd === null ? -1 : toFd(args[0]);
    if (fd >= 0)
      closed(name, fd);
  };
}

/* The hooked entries, per platform. */
function entries() {
  if (IS_DARWIN) {
    return {
      pathOpeners: [['open', 0], ['open$NOCANCEL', 0], ['openat', 1], ['openat$NOCANCEL', 1], ['creat', 0],
        ['guarded_open_np', 0]],
      plain: ['socket', 'accept', 'accept$NOCANCEL', 'dup', 'kqueue'],
      dups: ['dup2'],
      pairs: [['pipe', 0], ['socketpair', 3]],
      closers: ['close', 'close$NOCANCEL', 'guarded_close_np'],
    };
  }
  return {
    pathOpeners: [['open', 0], ['open64', 0], ['openat', 1], ['openat64', 1], ['creat', 0], ['creat64', 0],
      ['memfd_create', 0]],
    plain: ['socket', 'accept', 'accept4', 'dup', 'eventfd', 'epoll_create', 'epoll_create1', 'timerfd_create',
      'signalfd', 'inotify_init', 'inotify_init1'],
    dups: ['dup2', 'dup3'],
    pairs: [['pipe', 0], ['pipe2', 0], ['socketpair', 3]],
    closers: ['close'],
  };
}

export const tracer = {
  name: 'fds',

  symbols(config) {
    const wanted = [];
    const add = (name, role) => wanted.push({ name, role,
      resolve: () => libcExport(name) });
    const e = entries();
    for (const [n] of e.pathOpeners) add(n, 'hook');
    for (const n of e.plain) add(n, 'hook');
    for (const n of e.dups) add(n, 'hook');
    for (const [n] of e.pairs) add(n, 'hook');
    for (const n of e.closers) add(n, 'hook');
    for (const n of ['fclose', 'opendir', 'closedir', 'fileno', 'dirfd']) add(n, 'hook');
    add(IS_DARWIN ? 'proc_pidinfo' : 'syscall', 'census');
    return wanted;
  },

  init(config, sources) {
    fds.censusAt = config.censusAt === undefined ? 1000 : config.censusAt;
    fds.censusStep = config.censusStep === undefined ? 50 : config.censusStep;
    fds.census = IS_DARWIN ? darwinCensus : linuxCensus;
    const filenoP = libcExport('fileno');
    const dirfdP = libcExport('dirfd');
    fds.fileno = filenoP === null ? null : new NativeFunction(filenoP, 'int', ['pointer']);
    fds.dirfd = dirfdP === null ? null : new NativeFunction(dirfdP, 'int', ['pointer']);
    return { census_at: fds.censusAt, census_step: fds.censusStep,
      census: IS_DARWIN ? 'proc_pidinfo (DEVICE-UNVERIFIED)' : '/proc/self/fd (raw syscalls)' };
  },

  install(config) {
    // The baseline census first: descriptors open before the window are not ours to blame
    // (and Frida's own are not the target's: takeCensus leaves them out).
    const base = takeCensus('start');
    if (base !== null)
      for (const [fd] of base)
        fds.open.add(fd);
    const e = entries();
    for (const [n, i] of e.pathOpeners) attach(n, returnsFd(n, i));
    for (const n of e.plain) attach(n, returnsFd(n));
    for (const n of e.dups) attach(n, dupsOnto(n));
    for (const [n, i] of e.pairs) attach(n, returnsPair(n, i));
    for (const n of e.closers) attach(n, closesFd(n));
    attach('opendir', {
      onEnter(args) {
        this.frames = frames(this.context);
        this.path = readPath(args[0]);
      },
      onLeave(retval) {
        if (retval.isNull())
          failed('opendir', this.errno, { path: this.path }, this.frames);
        else if (fds.dirfd !== null)
          opened('opendir', [fds.dirfd(retval)], { path: this.path }, this.frames);
      },
    });
    attach('fclose', closesStream('fclose', fds.fileno === null ? null : p => fds.fileno(p)));
    attach('closedir', closesStream('closedir', fds.dirfd === null ? null : p => fds.dirfd(p)));
    applyListeners('fds hooks in');
  },

  uninstall() {
    detachListeners(fds.listeners);
    takeCensus('end');
  },
};
