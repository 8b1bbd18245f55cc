/*
 * Darwin's malloc_logger / __syscall_logger path, the parts around the C callback
 * (cmodule/malloc.c): where the two logger variables live, what the callback needs to know
 * (its own task, malloc_size, an in-flight count), draining in-flight calls before unload, and
 * keeping the agent's own thread out of the counts.
 *
 * On Linux the same path runs against the stand-in (tests): libmtmalloc.so plays
 * libsystem_malloc.dylib, libmtdarwin.so libsystem_kernel.dylib (demo/darwin/).
 * DEVICE-UNVERIFIED: the module names and that both variables are found by enumerateSymbols where
 * not exported are from libmalloc's and libsyscall's sources.
 */

import { LOGGER_INFLIGHT_SHARDS, LOGGER_INFLIGHT_STRIDE } from '../layout.js';
import { IS_DARWIN, moduleSymbol } from './platform.js';

export const LOGGER_MODULES = IS_DARWIN
  ? { malloc_logger: 'libsystem_malloc.dylib', __syscall_logger: 'libsystem_kernel.dylib', task: 'libsystem_kernel.dylib' }
  : { malloc_logger: 'libmtmalloc.so', __syscall_logger: 'libmtdarwin.so', task: 'libmtdarwin.so' };

// Absent from Darwin's libmalloc altogether: never asked for there (recon would list them MISSING).
const DARWIN_ABSENT = new Set(['memalign', 'pvalloc']);

/* The malloc family a platform has. */
export function familyFor(family, darwin) {
  return darwin ? family.filter(n => !DARWIN_ABSENT.has(n)) : family;
}

function loggerSymbol(name, moduleName) {
  const m = Process.findModuleByName(moduleName);
  return m === null ? null : moduleSymbol(m, name);
}

/* The address of malloc_logger or __syscall_logger (a variable), or null. */
export function loggerVariable(name) {
  return loggerSymbol(name, LOGGER_MODULES[name]);
}

const state = {
  inflight: null,
  selfTask: null,
  blockSize: null,
};

/* The CModule symbols the logger callback reads. */
export function loggerSymbols() {
  state.inflight = Memory.alloc(LOGGER_INFLIGHT_SHARDS * LOGGER_INFLIGHT_STRIDE * 4);
  // mach_task_self_ itself (the callback reads the variable); unknown (0) without it.
  state.selfTask = loggerSymbol('mach_task_self_', LOGGER_MODULES.task) || Module.findGlobalExportByName('mach_task_self_');
  if (state.selfTask === null)
    state.selfTask = Memory.alloc(8);
  state.blockSize = Memory.alloc(Process.pointerSize);
  const ms = loggerSymbol('malloc_size', LOGGER_MODULES.malloc_logger);
  state.blockSize.writePointer(ms === null ? NULL : ms);
  return { mt_inflight: state.inflight, mt_self_task: state.selfTask, mt_block_size: state.blockSize };
}

export function selfTask() {
  return state.selfTask === null ? 0 : state.selfTask.readU32();
}

/* After the logger variables are restored: a thread that read the old pointer may still be in
 * the callback, or about to enter it (loaded, then preempted before its first instruction, which
 * no count can see).  Wait, bounded, until none is in, and then until none has been for a grace
 * period longer than a preempted thread waits for its CPU under load; the script may be unloaded
 * after.  (A thread descheduled longer than that between libmalloc's load of malloc_logger and the
 * call is the residual risk; the host's own work after stop adds to the margin.) */
const DRAIN_GRACE_MS = 100;

export function drainLogger(cm, timeoutMs) {
  const total = new NativeFunction(cm.mt_inflight_total, 'uint64', []);
  const t0 = Date.now();
  let quietSince = null;
  let left = Number(total());
  while (Date.now() - t0 < timeoutMs) {
    if (left === 0) {
      quietSince = quietSince === null ? Date.now() : quietSince;
      if (Date.now() - quietSince >= DRAIN_GRACE_MS)
        break;
    } else {
      quietSince = null;
    }
    Thread.sleep(0.002);
    left = Number(total());
  }
  return { drained: left === 0, waited_ms: Date.now() - t0, inflight: left };
}

/* Process-directed signals the target may use (its timers, job control, SIGCHLD ...): the kernel
 * runs the target's handler on any thread that does not block the signal, the agent's included,
 * where the handler's allocations would pass for the agent's.  Blocked on the agent's thread, they go
 * to the target's own threads.  Faults and traps stay open: Frida catches its own memory errors
 * through them.  (Darwin's numbers: DEVICE-UNVERIFIED, from xnu's sys/signal.h.) */
const ASYNC_SIGNALS = IS_DARWIN
  ? [1, 2, 3, 13, 14, 15, 16, 18, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
  : [1, 2, 3, 10, 12, 13, 14, 15, 17, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30];
const SIG_BLOCK = IS_DARWIN ? 1 : 0;
const SIGSET_BYTES = IS_DARWIN ? 4 : 128;

function blockAsyncSignals() {
  const mask = Module.findGlobalExportByName('pthread_sigmask');
  if (mask === null)
    return false;
  const set = Memory.alloc(SIGSET_BYTES);
  for (const sig of ASYNC_SIGNALS) {
    const byte = set.add((sig - 1) >> 3);
    byte.writeU8(byte.readU8() | (1 << ((sig - 1) & 7)));
  }
  return new NativeFunction(mask, 'int', ['int', 'pointer', 'pointer'])(SIG_BLOCK, set, NULL) === 0;
}

/* The calling thread (the agent's JavaScript thread) counts as ours from now on, and runs none of
 * the target's handlers of process-directed signals. */
export function ignoreAgentThread(cm) {
  blockAsyncSignals();
  return new NativeFunction(cm.mt_ignore_this_thread, 'int', [])() !== 0;
}
