/*
 * Thread tracer (docs/domain/oom-taxonomy.md, "Too many threads"): every pthread_create with its creating
 * stack and what the thread was given (joinable or detached, stack size), every detach and
 * join, and every thread's start and exit.  A joinable thread that exits and is never joined
 * or detached keeps its stack and descriptor: the analyzer reports it with its creating stack.
 * pthread_create failing (EAGAIN) is the "too many threads" death itself.
 *
 * Starts and exits, Linux (glibc): from our own listeners, put in and taken out with the world
 * stopped like every other hook -- a start when pthread_create returns (the new thread's kernel
 * id read from its descriptor, where clone wrote it before the call returned: the offset is found
 * at init in the calling thread's own descriptor), an exit at __call_tls_dtors (start_thread calls
 * it on the exiting thread, pthread_exit's unwinding included), a rename at pthread_setname_np;
 * the threads there at attach from /proc/self/task (listThreads).  Not Process.attachThreadObserver
 * there: gum's thread registry hooks libc's thread start and __call_tls_dtors with the world
 * running and takes the hooks out only when Frida's agent unloads, after memtrace has let go --
 * the threads storm's target died twice so (round 8, docs/hook-storm.md: a thread exiting through
 * that hook while the unload freed its trampoline).  Darwin keeps the observer (its callbacks run
 * on the thread itself: pthread_self() there is the handle pthread_create handed out); the same
 * unload applies there -- DEVICE-UNVERIFIED.  Frida's own threads are cloaked and never reported.
 * Thread calls are rare: JS listeners.
 */

import { emitJson, warn } from './runtime/flush.js';
import { applyListeners, attachListener, detachListeners } from './runtime/listeners.js';
import { IS_DARWIN, libcExport, readProcDir } from './runtime/platform.js';
import { entryFrames } from './runtime/stacks.js';

const THREAD_FRAMES = 16;
const thr = {
  listeners: [],
  observer: null,
  fns: {},
  detachedValue: 1,     // PTHREAD_CREATE_DETACHED: glibc 1, Darwin 2 (set at init)
  defaultStack: null,
  tidOffset: null,      // glibc: where a descriptor (pthread_t) keeps its kernel thread id
  existing: [],         // the threads there at init (Linux): {id, name}
};

/* glibc's struct pthread keeps the thread's kernel id (pid_t tid) at a fixed offset that changes
 * between versions: found in the calling thread's own descriptor, the one word that equals its id,
 * checked against a second thread's (a lone match: anything else, null -- no start events then). */
function findTidOffset() {
  if (IS_DARWIN || thr.fns.self === null)
    return null;
  const self = thr.fns.self();
  const tid = Process.getCurrentThreadId();
  const hits = [];
  try {
    for (let off = 0; off < 4096; off += 4) {
      if (self.add(off).readS32() === tid)
        hits.push(off);
    }
  } catch (e) {
    // the descriptor ends before 4 KiB: what was read is enough
  }
  return hits.length === 1 ? hits[0] : null;
}

function tidOf(handle) {
  if (thr.tidOffset === null)
    return null;
  try {
    const tid = handle.add(thr.tidOffset).readS32();
    return tid > 0 ? tid : null;
  } catch (e) {
    return null;
  }
}

const OWN_LISTENERS = !IS_DARWIN;   // starts, exits and renames from our own hooks (Linux)

/* The threads there now (Linux), {id, name} without Frida's (cloaked): /proc/self/task read with
 * raw system calls (runtime/platform.js readProcDir).  Not Process.enumerateThreads: it reads every
 * thread's registers, and against a target whose threads come and go by the thousand a second it
 * held the init rpc past the host's 20 s (the threads storm's target, loaded machine). */
function listThreads() {
  const ids = (readProcDir('/proc/self/task') || []).map(name => parseInt(name, 10))
    .filter(id => !isNaN(id) && !Cloak.hasThread(id));
  return ids.map(id => {
    let name = null;
    try {
      name = File.readAllText(`/proc/self/task/${id}/comm`).trim();
    } catch (e) {
      // gone since
    }
    return { id, name };
  });
}

function threadFn(name, ret, args) {
  const p = libcExport(name);
  return p === null ? null : new NativeFunction(p, ret, args);
}

function currentHandle() {
  return thr.fns.self === null ? null : thr.fns.self().toString();
}

/* What an attribute object asks for: detach state and stack size (null: the default). */
function readAttr(attr) {
  const out = { detached: false, stack_size: null };
  if (attr.isNull())
    return out;
  const buf = Memory.alloc(16);
  if (thr.fns.getdetachstate !== null && thr.fns.getdetachstate(attr, buf) === 0)
    out.detached = buf.readS32() === thr.detachedValue;
  if (thr.fns.getstacksize !== null && thr.fns.getstacksize(attr, buf) === 0)
    out.stack_size = Number(buf.readU64());
  return out;
}

function defaultStackSize() {
  if (thr.fns.attrInit === null || thr.fns.getstacksize === null)
    return null;
  const attr = Memory.alloc(128);
  const buf = Memory.alloc(8);
  if (thr.fns.attrInit(attr) !== 0)
    return null;
  const size = thr.fns.getstacksize(attr, buf) === 0 ? Number(buf.readU64()) : null;
  if (thr.fns.attrDestroy !== null)
    thr.fns.attrDestroy(attr);
  return size;
}

function attach(name, callbacks) {
  attachListener(name, libcExport(name), callbacks, thr.listeners);
}

function handleResult(type, waits) {
  // pthread_detach / pthread_join & co.: the handle is the first argument; 0 is success.
  return {
    onEnter(args) {
      this.handle = args[0].toString();
      // A join that waits: said as it begins, so a thread that exits while its joiner waits is
      // not taken for leaked when the window ends before the join returns.
      if (waits)
        emitJson({ type: 'joining', handle: this.handle });
    },
    onLeave(retval) {
      const r = retval.toInt32();
      emitJson(r === 0 ? { type, handle: this.handle, tid: Process.getCurrentThreadId() }
        : { type: type + '-failed', handle: this.handle, errno: r });
    },
  };
}

const JOINS = ['pthread_join', 'pthread_tryjoin_np', 'pthread_timedjoin_np', 'pthread_clockjoin_np'];
const WAITING_JOINS = new Set(['pthread_join', 'pthread_timedjoin_np', 'pthread_clockjoin_np']);

export const tracer = {
  name: 'threads',

  symbols(config) {
    const wanted = ['pthread_create', 'pthread_detach', 'pthread_join', 'pthread_exit', 'pthread_self',
      'pthread_attr_getdetachstate', 'pthread_attr_getstacksize'];
    if (!IS_DARWIN)
      wanted.push('pthread_tryjoin_np', 'pthread_timedjoin_np', '__call_tls_dtors', 'pthread_setname_np');
    return wanted.map(name => ({ name, role: 'hook',
      resolve: () => libcExport(name) }));
  },

  init(config, sources) {
    thr.detachedValue = IS_DARWIN ? 2 : 1;
    thr.fns.self = threadFn('pthread_self', 'pointer', []);
    thr.fns.getdetachstate = threadFn('pthread_attr_getdetachstate', 'int', ['pointer', 'pointer']);
    thr.fns.getstacksize = threadFn('pthread_attr_getstacksize', 'int', ['pointer', 'pointer']);
    thr.fns.attrInit = threadFn('pthread_attr_init', 'int', ['pointer']);
    thr.fns.attrDestroy = threadFn('pthread_attr_destroy', 'int', ['pointer']);
    thr.defaultStack = defaultStackSize();
    thr.tidOffset = findTidOffset();
    thr.existing = OWN_LISTENERS ? listThreads() : [];
    return { default_stack_size: thr.defaultStack, tid_offset: thr.tidOffset,
      observer: !OWN_LISTENERS && typeof Process.attachThreadObserver === 'function' };
  },

  install(config) {
    attach('pthread_create', {
      onEnter(args) {
        this.out = args[0];
        this.attr = readAttr(args[1]);
        this.routine = args[2].toString();
        this.frames = entryFrames(this.context, THREAD_FRAMES);
      },
      onLeave(retval) {
        const r = retval.toInt32();
        if (r !== 0) {
          emitJson({ type: 'create-failed', errno: r, routine: this.routine, frames: this.frames,
            tid: Process.getCurrentThreadId(), stack_size: this.attr.stack_size });
          return;
        }
        const handle = this.out.readPointer();
        emitJson({ type: 'create', handle: handle.toString(), routine: this.routine,
          detached: this.attr.detached, stack_size: this.attr.stack_size === null ? thr.defaultStack
            : this.attr.stack_size, frames: this.frames, tid: Process.getCurrentThreadId() });
        if (OWN_LISTENERS) {
          // The new thread exists (clone wrote its id into the descriptor before returning).  It
          // may have exited already (its exit seen first, the id cleared to 0 by the kernel): the
          // start is counted all the same, without an id, so the count alive stays balanced.
          if (thr.tidOffset !== null)
            emitJson({ type: 'start', tid: tidOf(handle), handle: handle.toString(), name: null,
              routine: this.routine });
        }
      },
    });
    attach('pthread_detach', handleResult('detach'));
    for (const name of JOINS) {
      if (!IS_DARWIN || name === 'pthread_join')
        attach(name, handleResult('join', WAITING_JOINS.has(name)));
    }
    attach('pthread_exit', function (args) {
      emitJson({ type: 'pthread-exit', handle: currentHandle(), tid: Process.getCurrentThreadId() });
    });
    if (OWN_LISTENERS) {
      attach('__call_tls_dtors', function (args) {
        emitJson({ type: 'exit', tid: Process.getCurrentThreadId(), handle: currentHandle() });
      });
      attach('pthread_setname_np', {
        onEnter(args) {
          this.tid = tidOf(args[0]);
          try {
            this.name = args[1].readUtf8String();
          } catch (e) {
            this.name = null;
          }
        },
        onLeave(retval) {
          if (retval.toInt32() === 0 && this.tid !== null)
            emitJson({ type: 'rename', tid: this.tid, name: this.name, previous: null });
        },
      });
      // The threads there at init: a snapshot, not activity.  Frida's own are cloaked, but one
      // just started cloaks itself a moment after it runs: looked at again now (a thread listed at
      // init and cloaked since counted as the program's once at load ~20, test_threads.py).
      for (const t of thr.existing) {
        if (!Cloak.hasThread(t.id))
          emitJson({ type: 'existing', tid: t.id, name: t.name || null, activity: false });
      }
    }
    // The listeners in first, with no JavaScript callback live (the observer's run on every
    // thread started: one waiting for the script's lock would hold the flush back, world.js).
    applyListeners('threads hooks in');
    if (OWN_LISTENERS)
      return;
    // Frida hooks libc's thread start, exit and rename for the observer (gum's thread registry,
    // created here on first use) with its own Interceptor transaction, ended by this call, with
    // the world running; they stay until Frida's agent unloads.  Not ours to stop: the registry
    // takes glibc's thread-list lock while it hooks, which a stopped thread may hold.
    if (typeof Process.attachThreadObserver === 'function') {
      thr.observer = Process.attachThreadObserver({
        onAdded(t) {
          const onItself = t.id === Process.getCurrentThreadId();
          const ev = { type: onItself ? 'start' : 'existing', tid: t.id, name: t.name || null };
          if (onItself)
            ev.handle = currentHandle();
          else
            ev.activity = false;   // already there at attach: a snapshot, not activity
          if (t.entrypoint) {
            ev.routine = t.entrypoint.routine.toString();
            ev.parameter = t.entrypoint.parameter.toString();
          }
          emitJson(ev);
        },
        onRemoved(t) {
          const ev = { type: 'exit', tid: t.id };
          if (t.id === Process.getCurrentThreadId())
            ev.handle = currentHandle();
          emitJson(ev);
        },
        onRenamed(t, previous) {
          emitJson({ type: 'rename', tid: t.id, name: t.name || null, previous: previous || null });
        },
      });
    } else {
      warn('this Frida has no Process.attachThreadObserver (16.7+): ' +
        'thread starts and exits are not seen, only creations, joins and detaches');
    }
  },

  uninstall() {
    // The observer first: no thread enters our JavaScript through it any more (its callbacks
    // under way are drained with the listeners', world.js).
    if (thr.observer !== null) {
      thr.observer.detach();
      thr.observer = null;
    }
    detachListeners(thr.listeners);
  },
};
