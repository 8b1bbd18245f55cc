/*
 * Hooks go in and out with the world stopped (cmodule/world.c does the stopping).
 *
 * Frida's Interceptor rewrites a hooked function's first bytes in place; on Linux it suspends
 * nobody while it does.  A thread executing those bytes at that instant resumes in the middle of
 * new instructions (SIGILL, SIGSEGV), and a thread still inside memtrace's code when the agent
 * unloads returns into unmapped memory.  So, on Linux:
 *
 *   1. Every Interceptor change (attach, replaceFast, replace, detach, revert) is only queued:
 *      a script runs inside an Interceptor transaction, which Frida applies when the script's
 *      turn ends, on Interceptor.flush(), on send(), on every cooperative NativeFunction call and
 *      on most other APIs that may block (a symbol lookup).  So the Interceptor calls are made
 *      back to back, with nothing else between them (deferPatch, or addresses resolved first),
 *      the callers note the address they patch (notePatched) and apply with applyPatches(), and
 *      the agent counts the sites whose bytes changed while the world was stopped.
 *   2. applyPatches stops every thread of the target but this one and Frida's own (Frida cloaks
 *      them), until no stopped thread's pc lies inside the bytes about to be rewritten, nor
 *      inside Frida's own code -- by pc, and (a *strict* stop) by any register or stack word: a
 *      thread there may hold a lock of Frida's that the patching takes (its heap's, the
 *      interceptor's, a spinlock of its thread registry): such a thread is let go and the world
 *      stopped again -- as it is when a thread started between the listing of Frida's threads
 *      and the stop (it may be Frida's, and none of Frida's may be held while Frida's locks are
 *      wanted).  Then Interceptor.flush() writes every queued patch, and the world resumes.
 *   2b. JavaScript listeners (listeners.js): a thread that entered one holds a level of
 *      Interceptor's process-wide transaction while it waits for the script's lock, and the flush
 *      then writes nothing.  So none of ours is live while anything else goes in, a detached
 *      listener's site gets its pristine bytes back from memtrace itself under a stop that runs
 *      nothing of Frida's (restoreStopped, mt_world_write), and such threads are drained (drain)
 *      before the next flush.  docs/domain/frida.md has the frida-gum source behind this.
 *   3. Before the malloc tracer's C module can be freed, quiesce() stops the world until no
 *      thread runs in it or will return into it (its pc, a register or a word of its stack
 *      pointing into the module or into Interceptor's trampolines -- but for a word at a
 *      trampoline's very first byte, below any signal frame: cmodule/world.c mt_world_open_start).
 *
 * Deadlock-freedom, from the JavaScript side: every call into world.c is a NativeFunction with
 * `exclusive` scheduling, so this thread keeps the script's lock (no stopped thread can be holding
 * it, and no queued patch is applied early by a cooperative call), and between the stop and the
 * resume nothing runs but Interceptor.flush() and reads of the patched bytes (under a strict stop
 * only), or world.c's own code writer (restoreStopped) -- no send(), no Thread.sleep(), no allocation by
 * the target's allocator, no Process.enumerateThreads() (on Linux it reads each thread's registers
 * through a ptrace helper of Frida's own, which cannot attach to a thread we hold).
 *
 * Darwin: the same, with the threads held by Mach thread suspension (cmodule/world.c MT_DARWIN,
 * built by process.js buildMachWorld; DEVICE-UNVERIFIED, run on Linux over the Darwin stand-in):
 * Frida's Darwin writers suspend nobody either (docs/domain/frida.md).  There world.c writes its own
 * restores through a writable alias of the code pages (no RWX pages on iOS).
 *
 * Where the world cannot be stopped (a seccomp filter with no signal stop; ptrace refused; the Mach
 * calls not found) the patches are applied with the world running, and the agent says so once
 * (`world` in the stop result and a warning).
 */

import {
  WORLD, WORLD_ERROR_CODES, WORLD_ERRORS, WORLD_REGS, WORLD_STATES, WORLD_THREAD, WORLD_WHERE_ABOVE_SIGNAL,
} from '../layout.js';
import { IS_DARWIN } from './platform.js';
import { writeStruct } from './structs.js';

const MAX_THREADS = 8192;           // threads held at once (beyond: counted as not stopped)
const HELPER_STACK = 64 * 1024;
const PROLOGUE_BYTES = 32;          // rewritten at most: 5..16 bytes on x86-64, 4..16 on arm64
const CLEAR_TRIES = 400;            // stops tried until no thread sits in a prologue
const CLEAR_PAUSE_US = 500;
const NEW_THREAD_TRIES = 100;       // stops retried because a thread started between listing and stop (the
                                    // threads storm starts them without pause: 20 ran out under load)
// Strict stops (stopClear): a stopped thread in Frida's code may hold one of Frida's locks.  The
// world is let go, this thread waits (FRIDA_PAUSE_US, doubling up to FRIDA_PAUSE_MAX_US: the thread
// gets the CPU to leave; in C, so the script's lock and Interceptor's transaction are kept and
// nothing queued is written meanwhile) and stops it again, for at most FRIDA_MS.  Past that the
// patch is refused (applyPatches), never made with such a thread held.
const FRIDA_MS = 2000;
const FRIDA_PAUSE_US = 100;
const FRIDA_PAUSE_MAX_US = 10000;
// A refused patch whose queued work is all memtrace's own (reverts, its code writes: nothing in
// Frida's transaction yet) is tried again after a Thread.sleep() -- which lets threads waiting for
// the script's lock run their callback and leave Frida's code -- for at most this long.
const FRIDA_SLEEP_MS = 2000;
const FRIDA_SLEEP_S = 0.005;
const PATCH_TRIES = 3;              // applyPatchesRetrying: a refused patch tried again, in all,
const PATCH_RETRY_S = 0.25;         // ... this long apart
const FRIDA_DEPTH = 8 * 1024;       // stack bytes looked at from sp for Frida's frames (they are near)
const PARKED_LOOKS = 10;            // skipParkedAtExit's looks at most,
const PARKED_PAUSE_MS = 2;          // ... this far apart,
const PARKED_IDLE_LOOKS = 3;        // ... and only this many while no thread is in Frida's code
const TIMEOUT_TRIES = 3;            // stops tried when the helper timed out (cmodule/world.c)
const WORLD_TIMEOUT = WORLD_ERROR_CODES.timeout;
const TRAMPOLINE_BYTES = 256;       // one Interceptor code slice
const REFS_DEPTH = 256 * 1024;      // stack bytes looked at from sp up for a return into our code
const QUIESCE_MS = 3000;
// ... and this long when the last look's reference looked live -- a register, or a stack word that
// follows a call: a thread still running our code, or about to return into it (a stale word, one
// after no call, is given up on at QUIESCE_MS).  Freeing the code under such a thread kills it.
const QUIESCE_LIVE_MS = 15000;
// ... a stack word counting as live only this near sp: a thread inside our code has our return
// address at the top of its stack, below it only what our code called (the real allocator) and a
// signal handler at most.  Stale return addresses far up a stack held the quiesce 15 s for nothing
// (the sample-bytes storm: 92 KB and 196 KB above sp, in CI).
const QUIESCE_LIVE_NEAR_SP = 32 * 1024;
const DRAIN_MS = 1000;           // threads inside Frida's code waited for (drain) at least this long,
const DRAIN_LOOKS = 10;          // ... and for at least this many looks,
const DRAIN_CAP_MS = 2500;       // ... but never longer than this (givesUp)
const SCRATCH = 64 * 1024;

export const world = {
  fns: null,
  mem: null,
  stopBy: 'ptrace',     // how the world is stopped: a ptrace helper, a signal (seccomp), Mach suspension
  mach: false,          // cmodule/world.c built with MT_DARWIN (buildWorld)
  why: 'no process CModule (cmodule/world.c) was built',   // why patches run unstopped (null: they do not)
  fridaCode: [],        // [start, end) of Frida's own code
  signalReturns: 0,     // signal-return ranges the strict stop knows (0: every word into Frida's code counts)
  sites: new Set(),     // every address patched this session (string)
  warned: false,
  later: [],
  deferred: [],         // Interceptor calls to make right before the stop (deferPatch)
  afterFlush: [],       // ... and right after it (deferUntilFlushed)
  reverts: [],          // Interceptor.revert targets, reverted once the world is stopped (revertWhenStopped)
  writes: [],           // memtrace's own code writes (applyPatches' `write`), made once the world is stopped
  log: [],              // [what, sites rewritten while stopped] per applyPatches
  listenerHolds: new Map(),   // site -> memtrace's JavaScript listeners on it now
  otherSites: new Set(),      // sites memtrace also redirects (replaceFast/replace: malloc, execve, guard)
  pristine: new Map(),        // site -> its first PROLOGUE_BYTES before memtrace's first patch (read stopped)
  entryCode: new Map(),       // 'lo-hi' -> [lo, hi): Interceptor's trampoline slices and enter thunk (entryRanges)
  stats: { applied: 0, stopped: 0, running: 0, retries: 0, timeouts: 0, failed: 0, quiesced: 0, quiesced_late: 0, not_quiesced: 0,
    rewritten_stopped: 0,     // sites whose bytes the flush changed while the world was stopped
    // JavaScript listeners (releaseListenerSites): sites put back to their pristine bytes by memtrace
    // with the world stopped; sites left for Frida's own restore (shared with a redirect);
    // drains (the world seen with no thread in Frida's code) and how many did not end so in time.
    restored_stopped: 0, restored_by_frida: 0, drained: 0, drain_tries: 0, not_drained: 0,
    restore_refused: 0,         // listener sites memtrace's writer could not put back (left to Frida's)
    // threads neither held nor Frida's seen right after a flush under the stop: on Darwin the kernel
    // may start a workqueue thread during a stop (cmodule/world.c mt_world_unheld); 0 on Linux
    started_during: 0,
    // strict stops: retried for a thread in Frida's code; given up and patched anyway (never now:
    // kept at 0, the account's proof); patches refused for it (applyPatches: `refused` says which)
    frida_retries: 0, frida_busy: 0, frida_refused: 0, frida_sleeps: 0,
    frida_refused_retried: 0,   // refusals tried again (applyPatchesRetrying), not said
    lead_skipped: 0,            // quiesced modules whose range starts past their lead (moduleCode)
    parked_at_exit: 0,          // threads Frida's exit monitor holds, left out of the exit's stops
    alone: 0 },                 // the exit's patches of a program with one thread: no stop (skipParkedAtExit)
  parked: new Set(),          // their ids (skipParkedAtExit)
  alone: false,               // at exit, the program's one thread is the one held there (skipParkedAtExit)
  hold: null,                 // a held program's main thread and the hold library's code (configureWorld)
  fridaKeys: { done: false, retired: null, why: null },   // retireFridaKeyDestructors
  busy: null,                 // why the last strict stop gave up: { ms, tries, threads } (stopClear)
  lastQuiesce: null,          // the last quiesce that did not end: { tries, threads, first, why }
  queuedDirect: 0,            // redirects queued by callers (notePatched) since the last applyPatches
  pendingRedirects: new Set(),   // sites of deferred redirects not made yet (a refusal forgets them)
  refused: [],                // [what, why] per patch refused (applyPatches)
  retrying: false,            // applyPatchesRetrying: a refusal now is not the last try
  fridaMs: FRIDA_MS,          // the budgets in use (configureWorld)
  fridaSleepMs: FRIDA_SLEEP_MS,
  patchTries: PATCH_TRIES,
};

/* The agent's config: `worldFridaMs`, `worldFridaSleepMs` and `worldPatchTries` replace FRIDA_MS,
 * FRIDA_SLEEP_MS and PATCH_TRIES
 * (tests make a refusal quick to reach; nothing else sets them). */
export function configureWorld(config) {
  world.hold = (config && config.programHeld && typeof config.holdLibrary === 'string')
    ? holdCode(config.holdLibrary) : null;
  if (config && Number.isFinite(config.worldFridaMs))
    world.fridaMs = config.worldFridaMs;
  if (config && Number.isFinite(config.worldFridaSleepMs))
    world.fridaSleepMs = config.worldFridaSleepMs;
  if (config && Number.isFinite(config.worldPatchTries))
    world.patchTries = config.worldPatchTries;
}

function exclusive(cm, name, ret, args) {
  return new NativeFunction(cm[name], ret, args, { scheduling: 'exclusive' });
}

/* The executable mappings whose file name passes `wanted`, as [lo, hi) pointer pairs; [] when the
 * maps cannot be read. */
function codeMappings(wanted) {
  const out = [];
  try {
    for (const line of File.readAllText('/proc/self/maps').split('\n')) {
      const f = line.split(/\s+/);
      if (f.length < 6 || f[1][2] !== 'x' || !wanted(f.slice(5).join(' ')))
        continue;
      const [lo, hi] = f[0].split('-');
      out.push([ptr('0x' + lo), ptr('0x' + hi)]);
    }
  } catch (e) {
    // unreadable maps: none known
  }
  return out;
}

/* The hold library's code (memtrace.hold; the host names its file), [lo, hi) as u64 numbers, where
 * a held program's main thread waits: null when it is not mapped here. */
function holdCode(path) {
  const ranges = codeMappings(name => name === path);
  if (ranges.length === 0)
    return null;
  const lo = ranges.reduce((m, r) => (r[0].compare(m) < 0 ? r[0] : m), ranges[0][0]);
  const hi = ranges.reduce((m, r) => (r[1].compare(m) > 0 ? r[1] : m), ranges[0][1]);
  return { tid: Process.id, lo: uint64(lo.toString()), hi: uint64(hi.toString()) };
}

/* Frida's own code: its agent library's executable mappings (cloaked from Process's ranges).
 * Unreadable maps: Frida's threads are still never stopped; only the pc check is lost. */
function fridaCodeRanges() {
  return codeMappings(name => /frida-agent|frida-gadget/.test(name));
}

/* The thread ids Frida cloaks (its own threads), from a listing the C made (no allocation);
 * `listed`, when given, receives every thread id seen. */
export function fridaThreads(listTasks, buffer, listed) {
  const buf = buffer || Memory.alloc(MAX_THREADS * 8);
  const n = Math.min(MAX_THREADS, Number(listTasks(Process.id, buf, MAX_THREADS)));
  const out = [];
  for (let i = 0; i < n; i++) {
    const tid = Number(buf.add(i * 8).readU64());
    if (listed !== undefined)
      listed.add(tid);
    if (Cloak.hasThread(tid))
      out.push(tid);
  }
  return out;
}

/* The signal-return code a handler returns into, as [lo, hi) pointer pairs (cmodule/world.c
 * MtWorld.signal_returns: a stack word into it means a signal frame, whose saved pc follows no
 * call).  Linux, by its bytes -- x86-64: glibc's and musl's __restore_rt (mov $15, %rax; syscall;
 * and the mov $15, %eax form) in the C library; arm64: mov x8, #139; svc #0 (the vDSO's
 * __kernel_rt_sigreturn, or the C library's own) -- and, on x86-64, where the kernel says
 * every installed handler returns (its sa_restorer, required there: a Go runtime's or a
 * sanitizer's own restorer is found so).  Darwin: _sigtramp, which calls the handler
 * (DEVICE-UNVERIFIED: its extent taken as 256 bytes).  [] when none is found: the strict stop then
 * counts every word into Frida's code, and the quiesce every word into a trampoline, as before.
 * Read again at the start of each stop sequence (applyPatches, drain, quiesce, the key
 * destructors' retirement: refreshSignalReturns), not at each of its stops: a handler installed
 * since may return elsewhere. */
const SIGRETURN_PATTERNS = {
  x64: ['48 c7 c0 0f 00 00 00 0f 05', 'b8 0f 00 00 00 0f 05'],
  arm64: ['68 11 80 d2 01 00 00 d4'],
};
const SIGTRAMP_BYTES = 256;
const SIGRETURN_BYTES = 16;
const SIGRETURN_MAX = 64;           // ranges kept (mem.signalReturns' room)
const NSIG_LINUX = 64;
const SA_RESTORER = 0x04000000;
const SYS_RT_SIGACTION_X64 = 13;

let libcSigreturns = null;          // the byte-pattern hits, found once

function patternSignalReturns() {
  if (libcSigreturns !== null)
    return libcSigreturns;
  const out = [];
  const patterns = SIGRETURN_PATTERNS[Process.arch] || [];
  const where = Process.enumerateModules().filter(m => /^libc[.-]|^libc\.so|^linux-vdso|^linux-gate|^ld-musl/.test(m.name));
  for (const m of where) {
    for (const r of m.enumerateRanges('r-x')) {
      for (const pattern of patterns) {
        for (const hit of Memory.scanSync(r.base, r.size, pattern))
          out.push([hit.address, hit.address.add(hit.size)]);
      }
    }
  }
  libcSigreturns = out;
  return out;
}

/* x86-64 Linux: the restorer of every signal with a handler, as the kernel keeps it (a raw
 * rt_sigaction: the C library's wrapper reports its own restorer whatever was installed).
 * null when a handler's cannot be read (the list is then not to be trusted). */
function handlerSignalReturns() {
  if (Process.arch !== 'x64' || world.fns === null || world.fns.syscall === null)
    return [];
  const act = world.mem.sigaction;     // struct kernel_sigaction: handler, flags, restorer, mask
  const out = [];
  for (let sig = 1; sig <= NSIG_LINUX; sig++) {
    if (sig === 9 || sig === 19)
      continue;                        // SIGKILL, SIGSTOP: no handler
    if (Number(world.fns.syscall(SYS_RT_SIGACTION_X64, sig, NULL, act, 8)) !== 0)
      continue;                        // (32, 33: glibc's own, still readable; an unknown one)
    const handler = act.readPointer();
    if (handler.compare(ptr(1)) <= 0)
      continue;                        // SIG_DFL, SIG_IGN
    const flags = act.add(8).readU64().toNumber();
    const restorer = act.add(16).readPointer();
    if ((flags & SA_RESTORER) === 0 || restorer.isNull())
      return null;                     // returns where we cannot see (the kernel would refuse it on x86-64)
    if (!out.some(([lo]) => lo.equals(restorer)))
      out.push([restorer, restorer.add(SIGRETURN_BYTES)]);
  }
  return out;
}

function signalReturnRanges() {
  try {
    if (IS_DARWIN) {
      const m = Process.findModuleByName('libsystem_platform.dylib');
      const a = m === null ? null : m.findExportByName('_sigtramp');
      return a === null ? [] : [[a, a.add(SIGTRAMP_BYTES)]];
    }
    const handlers = handlerSignalReturns();
    if (handlers === null)
      return [];
    const out = patternSignalReturns().slice();
    for (const r of handlers) {
      if (!out.some(([lo, hi]) => r[0].compare(lo) >= 0 && r[0].compare(hi) < 0))
        out.push(r);
    }
    return out.length > SIGRETURN_MAX ? [] : out;
  } catch (e) {
    return [];     // none known: every word counts
  }
}

/* The signal-return ranges into mem.signalReturns, for the stops that follow (prepare writes them
 * into each MtWorld). */
function refreshSignalReturns() {
  if (world.mem === null || world.mem.signalReturns === undefined)
    return;
  world.signalReturns = writePairs(world.mem.signalReturns, signalReturnRanges());
}

/* The C library calls cmodule/world.c's Mach stop makes (MT_DARWIN): a CModule that compiles it
 * there is given these. */
export const WORLD_MACH_SYMBOLS = ['mach_task_self_', 'task_threads', 'thread_suspend', 'thread_resume',
  'thread_get_state', 'mach_port_deallocate', 'mach_vm_deallocate', 'mach_vm_read_overwrite',
  'mach_vm_region_recurse', 'mach_vm_remap', 'mach_vm_protect', 'mach_absolute_time', 'mach_timebase_info', 'usleep'];

/* Frida's own code as the Mach stop finds it (cmodule/world.c mt_world_frida_code: the VM region
 * of one of gum's functions), [[lo, hi)] or [] -- Darwin has no /proc/self/maps. */
function machFridaCode(cm) {
  const out = Memory.alloc(16);
  if (new NativeFunction(cm.mt_world_frida_code, 'int', ['pointer'], { scheduling: 'exclusive' })(out) !== 1)
    return [];
  return [[out.readPointer(), out.add(8).readPointer()]];
}

/* cm: a CModule with cmodule/world.c compiled in (null: none, world.why says so).  `mach`: compiled
 * with MT_DARWIN -- the threads held by Mach thread suspension: on Darwin, or on Linux over the
 * Darwin stand-in (process.js buildMachWorld). */
export function buildWorld(cm, mach = false) {
  if (cm === null) {
    world.why = IS_DARWIN ? 'Darwin: cmodule/world.c could not be built (the Mach calls were not found)'
      : 'no process CModule (cmodule/world.c) was built';
    return;
  }
  const fns = {
    resume: exclusive(cm, 'mt_world_resume', 'void', ['pointer']),
    refs: exclusive(cm, 'mt_world_refs_open', 'uint64',
      ['pointer', 'pointer', 'uint64', 'uint64', 'uint64', 'uint64', 'pointer', 'uint64']),
    firstRef: exclusive(cm, 'mt_world_first_ref_of', 'void',
      ['pointer', 'pointer', 'uint64', 'uint64', 'uint64', 'uint64', 'pointer', 'uint64', 'pointer']),
    listTasks: exclusive(cm, 'mt_world_list_tasks', 'uint64', ['uint64', 'pointer', 'uint64']),
    seccomp: exclusive(cm, 'mt_world_seccomp', 'int', ['uint64']),
    pc: exclusive(cm, 'mt_world_pc', 'uint64', ['pointer', 'uint64']),
    followsCall: exclusive(cm, 'mt_world_follows_call', 'int64', ['pointer', 'pointer']),
    unheld: exclusive(cm, 'mt_world_unheld', 'uint64', ['pointer']),
    // Stop, then check in C before any JavaScript runs (cmodule/world.c says why).
    stopChecked: exclusive(cm, 'mt_world_stop_checked', 'int', ['pointer', 'pointer', 'uint64', 'uint64', 'uint64',
      'pointer', 'uint64', 'pointer', 'uint64', 'uint64', 'pointer', 'uint64', 'int', 'pointer']),
    writeStopped: exclusive(cm, 'mt_world_write_stopped', 'int64', ['pointer', 'pointer', 'uint64', 'uint64',
      'uint64', 'pointer', 'uint64', 'pointer', 'uint64', 'pointer', 'uint64']),
  };
  // The strict stop's back-off: libc's usleep, exclusive (the script's lock is kept: see FRIDA_MS).
  const usleep = Module.findGlobalExportByName('usleep');
  fns.pause = usleep === null ? null : new NativeFunction(usleep, 'int', ['uint'], { scheduling: 'exclusive' });
  // The handlers' restorers (handlerSignalReturns): rt_sigaction, raw.
  const syscall = IS_DARWIN ? null : Module.findGlobalExportByName('syscall');
  fns.syscall = syscall === null ? null
    : new NativeFunction(syscall, 'long', ['long', '...', 'long', 'pointer', 'pointer', 'long'], { scheduling: 'exclusive' });
  if (!mach && fns.seccomp(Process.id) === 1) {
    // No clone(CLONE_VM) helper under a filter that may trap it: the signal stop instead, where
    // this module has one (cmodule/world.c MT_WORLD_SIGSTOP), else the world runs.
    const sig = cm.mt_sigstop_install === undefined ? 0
      : new NativeFunction(cm.mt_sigstop_install, 'int', [], { scheduling: 'exclusive' })();
    if (sig <= 0) {
      world.why = WORLD_ERRORS[4];
      return;
    }
    world.stopBy = `signal ${sig} (a seccomp filter is installed: no ptrace helper)`;
    fns.sigstopUninstall = new NativeFunction(cm.mt_sigstop_uninstall, 'int', [], { scheduling: 'exclusive' });
  }
  world.mem = {
    world: Memory.alloc(WORLD.size),
    threads: Memory.alloc(MAX_THREADS * WORLD_THREAD.size),
    regs: Memory.alloc(MAX_THREADS * WORLD_REGS * 8),
    stack: Memory.alloc(HELPER_STACK),
    skip: Memory.alloc(MAX_THREADS * 8),      // the threads never stopped (Frida's)
    listed: Memory.alloc(MAX_THREADS * 8),    // every thread listed before the stop
    busy: Memory.alloc(4 * 8),                // how many held threads were in Frida's code; the first's
                                              // tid, how it pointed in (register or stack) and the value
    ranges: Memory.alloc(4096 * 16),
    scratch: Memory.alloc(SCRATCH),
  };
  world.mem.world.writeByteArray(new Array(WORLD.size).fill(0));    // no helper yet (tracer_pid 0)
  world.fns = fns;
  world.mach = mach;
  if (mach)
    world.stopBy = 'mach (task_threads, thread_suspend)';
  world.fridaCode = mach ? machFridaCode(cm) : fridaCodeRanges();
  world.mem.fridaRanges = Memory.alloc(Math.max(1, world.fridaCode.length) * 16);
  writePairs(world.mem.fridaRanges, world.fridaCode);
  // The strict stop's words into Frida's code: only return addresses, below any signal frame.
  world.mem.signalReturns = Memory.alloc(SIGRETURN_MAX * 16);
  world.mem.sigaction = Memory.alloc(64);
  refreshSignalReturns();
  // How world.c writes code under a stop (restoreStopped): mprotect where the pages can go RWX
  // (Linux, the Mach stop over the stand-in included); on Darwin none is given and it writes
  // through a writable alias (cmodule/world.c mt_world_write_alias).
  world.mprotect = IS_DARWIN ? NULL : Module.findGlobalExportByName('mprotect');
  world.why = null;
}

/* cmodule/world.c's MtSigStop (the signal stop under seccomp): one block shared by the process
 * CModule, which installs the handler, and the malloc CModule, whose leak scan stops the world
 * through it -- compiled first (core.js), so the block exists before either.  Zeroed: not
 * installed. */
export const SIGSTOP_BYTES = 256;
let sigstopBlock = null;
export function signalStopBlock() {
  if (sigstopBlock === null) {
    sigstopBlock = Memory.alloc(SIGSTOP_BYTES);
    sigstopBlock.writeByteArray(new Array(SIGSTOP_BYTES).fill(0));
  }
  return sigstopBlock;
}

/* Whether a CModule compiled now gets the signal stop (cmodule/world.c MT_WORLD_SIGSTOP): x86-64
 * Linux with libc's sigaction (ARCH-UNVERIFIED elsewhere: the world runs under seccomp there). */
export function signalStopSymbols() {
  if (IS_DARWIN || Process.arch !== 'x64')
    return null;
  const sigaction = Module.findGlobalExportByName('sigaction');
  return sigaction === null ? null : { sigaction, mt_sigstop: signalStopBlock() };
}

/* The signal stop's handler out (teardown, before the process CModule is freed): the signal is
 * ignored, every thread out of the handler, the old disposition back.  False when one stayed. */
export function uninstallSignalStop() {
  if (world.fns === null || !world.fns.sigstopUninstall)
    return true;
  const left = world.fns.sigstopUninstall() === 1;
  world.fns.sigstopUninstall = null;
  return left;
}

/* Prepares the MtWorld for one stop: Frida's threads (listed now: threads come and go), every
 * thread id listed in mem.listed.  Returns how many were listed. */
function prepare() {
  const mem = world.mem;
  const listed = new Set();
  const skip = fridaThreads(world.fns.listTasks, mem.listed, listed);
  for (const tid of world.parked) {
    if (listed.has(tid))
      skip.push(tid);
  }
  skip.forEach((tid, i) => mem.skip.add(i * 8).writeU64(tid));
  writeStruct(mem.world, WORLD, {
    state: WORLD_STATES.idle, tgid: Process.id, self_tid: Process.getCurrentThreadId(),
    skip: uint64(mem.skip.toString()), n_skip: skip.length,
    threads: uint64(mem.threads.toString()), threads_cap: MAX_THREADS, regs: uint64(mem.regs.toString()),
    n_threads: 0, n_failed: 0,
    tracer_stack: uint64(mem.stack.toString()), tracer_stack_size: HELPER_STACK,
    // tracer_pid kept: a helper that timed out is reaped by the next stop before another starts
    tracer_pid: mem.world.add(WORLD.fields.tracer_pid[0]).readU64(), error: 0,
    stop_timeout_us: 0,    // world.c's own bound
    abandoned: 0,
    hold_tid: world.hold ? world.hold.tid : 0,
    hold_code_lo: world.hold ? world.hold.lo : 0,
    hold_code_hi: world.hold ? world.hold.hi : 0,
    signal_returns: uint64(mem.signalReturns.toString()), n_signal_returns: world.signalReturns,
  });
  return Math.min(MAX_THREADS, listed.size);
}

const STOP_FAILED = 0;      // cmodule/world.c mt_world_stop_checked
const STOP_CLEAR = 1;
const STOP_NEW = 2;
const STOP_BUSY = 3;

/* One stop of mt_world_stop_checked: clear of `n` ranges in mem.ranges, only listed threads held
 * (a thread not listed may be one Frida started meanwhile, not known as cloaked then: it must not
 * stay held while Frida's locks are wanted) and, `strict`, none in Frida's code; `resumeNow`: let
 * go at once (a look).  The checks run in C before any JavaScript: a held thread may own one of
 * Frida's locks, which making a JavaScript value may want. */
function stopOnce(n, strict, resumeNow = false) {
  const mem = world.mem;
  const nListed = prepare();
  return world.fns.stopChecked(mem.world, mem.ranges, n, CLEAR_TRIES, CLEAR_PAUSE_US, mem.listed, nListed,
    strict ? mem.fridaRanges : NULL, strict ? world.fridaCode.length : 0, FRIDA_DEPTH, mem.scratch, SCRATCH,
    resumeNow ? 1 : 0, mem.busy);
}

/* Stops the world clear of `ranges` ([start, end) pairs) holding only threads listed beforehand;
 * true when stopped (then resume() is owed).  `strict`: and with no stopped thread inside Frida's
 * code (pc, register or stack word: world.fridaCode) -- such a thread may hold one of Frida's locks
 * (its heap's, the interceptor's, a spinlock), which whatever runs under the stop (Interceptor.flush,
 * any memory access from JavaScript) may want: the world is let go, this thread backs off (FRIDA_MS)
 * and stops it again.  The threads tracer's storm found it: a thread stopped inside Frida's thread
 * registry, the agent spinning.  A strict stop that stays busy for `budgetMs` is NOT kept: false,
 * with world.busy saying so (the world is running again). */
function stopClear(ranges, strict = false, budgetMs = world.fridaMs) {
  let timeouts = 0;
  let newThreads = 0;
  let inFrida = 0;
  let pause = FRIDA_PAUSE_US;
  const started = Date.now();
  world.busy = null;
  const n = writeRanges(ranges);
  for (;;) {
    const got = stopOnce(n, strict);
    if (got === STOP_CLEAR)
      return true;
    if (got === STOP_FAILED) {
      // A loaded machine can starve the helper past its timeout: try again before giving up.
      if (readErrorCode() === WORLD_TIMEOUT && ++timeouts < TIMEOUT_TRIES) {
        world.stats.timeouts++;
        continue;
      }
      return false;
    }
    if (got === STOP_NEW) {     // (let go already)
      world.stats.retries++;
      if (++newThreads >= NEW_THREAD_TRIES)
        return false;
      continue;
    }
    // STOP_BUSY, let go already: never kept with such a thread held.  Give it the CPU to leave and
    // stop again -- bounded by time, since a loaded machine makes every stop slow and the host
    // waits for the rpc.
    const busy = Number(world.mem.busy.readU64());
    inFrida++;
    if (Date.now() > started + budgetMs) {
      world.busy = { ms: Date.now() - started, tries: inFrida, threads: busy, first: busyThread() };
      return false;
    }
    world.stats.frida_retries++;
    if (world.fns.pause !== null)
      world.fns.pause(pause);
    pause = Math.min(pause * 2, FRIDA_PAUSE_MAX_US);
  }
}

// x86-64's registers as cmodule/world.c keeps a stopped thread's: Linux's struct user_regs_struct
// (ptrace), or Darwin's x86_THREAD_STATE64 (the Mach stop).
const X64_REGS = ['r15', 'r14', 'r13', 'r12', 'rbp', 'rbx', 'r11', 'r10', 'r9', 'r8', 'rax', 'rcx', 'rdx', 'rsi',
  'rdi', 'orig_rax', 'rip', 'cs', 'eflags', 'rsp', 'ss', 'fs_base', 'gs_base', 'ds', 'es', 'fs', 'gs'];
/* Whether the last look's first reference (world.mem.busy, as busyThread reads it) looks live: a
 * register (a pc inside, a pointer about to be called: the open ranges' starts are not counted),
 * or a stack word the bytes before which end with a call (a return address) or above a signal frame,
 * within QUIESCE_LIVE_NEAR_SP of sp -- not a stack word after no call, which is a stale pointer or a
 * page address more likely than code (round 25), nor one far up the stack. */
function refLooksLive() {
  const b = world.mem.busy;
  if (b.add(8).readU64().equals(0))
    return false;
  const { where, aboveSignal } = busyWhere();
  if (where < WORLD_REGS)
    return true;
  if (where - WORLD_REGS >= QUIESCE_LIVE_NEAR_SP)
    return false;
  return aboveSignal || Number(world.fns.followsCall(world.mem.world, ptr(b.add(24).readU64().toString()))) === 1;
}

/* The last look's first reference: a register index (< WORLD_REGS) or WORLD_REGS + a stack word's
 * offset from sp, and whether a signal frame lies below that word (its interrupted context: a pc
 * there resumes after no call). */
function busyWhere() {
  const raw = Number(world.mem.busy.add(16).readU64());
  const aboveSignal = raw >= WORLD_WHERE_ABOVE_SIGNAL;
  return { where: aboveSignal ? raw - WORLD_WHERE_ABOVE_SIGNAL : raw, aboveSignal };
}

/* Whether the bytes before code address v end with a call (cmodule/world.c mt_world_follows_call,
 * the check the stops make), for the evidence: a return address, or a pointer to code. */
function followsCall(v) {
  const got = Number(world.fns.followsCall(world.mem.world, v));
  return got < 0 ? '' : got === 1 ? ', after a call' : ', after no call';
}

const X64_MACH_REGS = ['rax', 'rbx', 'rcx', 'rdx', 'rdi', 'rsi', 'rbp', 'rsp', 'r8', 'r9', 'r10', 'r11', 'r12', 'r13',
  'r14', 'r15', 'rip', 'rflags', 'cs', 'fs', 'gs'];

/* The last busy stop's first thread in Frida's code, in words: its id and name, by what it pointed
 * in (a register, or a stack word at sp + offset) and where to (Frida's symbol).  Called with the
 * world running again (a JavaScript value may be made).  Without it a refusal cannot tell Frida's
 * own bootstrap from a program thread parked in a listener. */
function busyThread(ranges = null) {
  const b = world.mem.busy;
  const tid = Number(b.add(8).readU64());
  if (tid === 0)
    return null;
  const { where, aboveSignal } = busyWhere();
  const value = ptr(b.add(24).readU64().toString());
  let name = '?';
  try {
    name = File.readAllText(`/proc/self/task/${tid}/comm`).trim();
  } catch (e) {
    // the thread has gone since
  }
  const names = world.mach ? X64_MACH_REGS : X64_REGS;
  const how = where < WORLD_REGS
    ? `register ${Process.arch === 'x64' && where < names.length ? names[where] : where}`
    : `stack word at sp+0x${(where - WORLD_REGS).toString(16)}${aboveSignal ? ', above a signal frame' : ''}`;
  let sym = value.toString();
  try {
    const d = DebugSymbol.fromAddress(value);
    const m = Process.findModuleByAddress(value);
    // Frida's agent is cloaked from Process's modules: its offset from its first code mapping.
    const lo = world.fridaCode.length > 0 ? world.fridaCode[0][0] : null;
    const base = m !== null ? `${m.name}+0x${value.sub(m.base).toString(16)}`
      : lo !== null && value.compare(lo) >= 0 ? `frida-agent code+0x${value.sub(lo).toString(16)}` : value.toString();
    sym = d.name !== null ? `${d.name} (${base})` : base;
  } catch (e) {
    // no symbol: the address alone
  }
  // Where in the code being freed (a quiesce): a word at a range's very start, page-aligned, is
  // more likely a stale mapping address (an mmap's result, the same pages mapped again) than code.
  const k = ranges === null ? -1 : ranges.findIndex(([lo, hi]) => value.compare(lo) >= 0 && value.compare(hi) < 0);
  if (k >= 0)
    sym += ` (the code being freed, range ${k} +0x${value.sub(ranges[k][0]).toString(16)}${followsCall(value)})`;
  // Which thread it is, for the evidence: the main one, one Frida's cloak knows now (it was not
  // listed as Frida's when the world stopped), and where the kernel has it waiting.
  const what = [];
  if (tid === Process.id)
    what.push('the main thread');
  try {
    if (Cloak.hasThread(tid))
      what.push("Frida's (cloaked since)");
  } catch (e) {
    // no cloak query here
  }
  try {
    const wchan = File.readAllText(`/proc/self/task/${tid}/wchan`).trim();
    if (wchan !== '' && wchan !== '0')
      what.push(`waiting in ${wchan}`);
  } catch (e) {
    // the thread has gone since
  }
  return `thread ${tid} "${name}"${what.length > 0 ? ` (${what.join(', ')})` : ''}, ${how} = ${sym}`;
}

/* At process exit Frida's exit monitor holds the exiting thread inside Frida's own code until the
 * script's dispose has returned (rpc.js): it runs nothing of the target's meanwhile, yet a patch's
 * stop, which must find no thread in Frida's code (stopClear), never found it clear -- each of the
 * exit's three patches spent its CLEAR_TRIES stops (0.5-1.2 s each, 1.8-2.5 s per run) and then
 * patched with the world running.  Called by dispose at exit: a thread seen in Frida's code at
 * one same address in two looks in a row (blocked there: the held thread; threads passing
 * through Frida's code move on) is left out of every later stop; the others are stopped as
 * before.  Returns how many were left out. */
export function skipParkedAtExit() {
  if (world.fns === null)
    return 0;
  // A program with one thread: that thread is the exiting one, held in Frida's code by the exit
  // monitor, running nothing of the program's until dispose returns; no other thread of the
  // program exists to run the bytes a patch rewrites or to sit in our code, nor can one start.
  // The exit's patches need no stop then, and its waits nothing (each stop clones a helper and
  // attaches: a single-threaded program's exit cost ~20 ms of its CPU, 3-4 stops and 2 looks).
  const listed = new Set();
  const frida = new Set(fridaThreads(world.fns.listTasks, world.mem.listed, listed));
  const program = [...listed].filter(tid => !frida.has(tid) && tid !== Process.getCurrentThreadId());
  if (program.length === 1) {
    world.parked.add(program[0]);
    world.alone = true;
    world.stats.parked_at_exit = 1;
    return 1;
  }
  let before = inFridaCode();
  for (let look = 1; look < PARKED_LOOKS && world.parked.size === 0; look++) {
    if (before.size === 0 && look >= PARKED_IDLE_LOOKS)
      break;      // no thread in Frida's code at all: nothing is held there (each look is a stop)
    Thread.sleep(PARKED_PAUSE_MS / 1000);
    const now = inFridaCode();
    for (const [tid, pc] of now) {
      if (before.get(tid) === pc)
        world.parked.add(tid);
    }
    before = now;
  }
  world.stats.parked_at_exit = world.parked.size;
  return world.parked.size;
}

/* Thread id -> pc of the threads whose pc is in Frida's code, from one plain stop (read after the
 * resume: nothing runs in JavaScript while the world is stopped). */
function inFridaCode() {
  const out = new Map();
  // Let go in C at once: the stop's threads and registers stay in its buffers.
  if (stopOnce(0, false, true) !== STOP_CLEAR)
    return out;
  const n = Number(world.mem.world.add(WORLD.fields.n_threads[0]).readU64());
  for (let i = 0; i < n; i++) {
    const pc = ptr(world.fns.pc(world.mem.world, i).toString());
    if (world.fridaCode.some(([lo, hi]) => pc.compare(lo) >= 0 && pc.compare(hi) < 0))
      out.set(Number(world.mem.threads.add(i * WORLD_THREAD.size).readU64()), pc.toString());
  }
  return out;
}

function readErrorCode() {
  return Number(world.mem.world.add(WORLD.fields.error[0]).readU64());
}

function readError() {
  const e = readErrorCode();
  return WORLD_ERRORS[e] || `error ${e}`;
}

/* [start, end) pairs into the ranges buffer; returns how many. */
function writeRanges(ranges) {
  return writePairs(world.mem.ranges, ranges.slice(0, 4096));
}

/* [lo, hi) pairs into buf as u64 pairs (world.c's ranges); how many. */
function writePairs(buf, pairs) {
  pairs.forEach(([lo, hi], i) => {
    buf.add(i * 16).writePointer(lo);
    buf.add(i * 16 + 8).writePointer(hi);
  });
  return pairs.length;
}

/* A warning sent once the queued patches are applied (send() would apply them early). */
export function warnLater(message) {
  world.later.push(message);
}

function sendLater() {
  for (const message of world.later.splice(0))
    send({ type: 'agent:warning', message });
}

/* An Interceptor call (attach, replace...) made by applyPatches just before it stops the world:
 * most of Frida's other APIs (a symbol lookup among them) end the script's Interceptor
 * transaction, which would write what is queued so far with the world running. */
export function deferPatch(call) {
  world.deferred.push(call);
}

/* A code write of memtrace's own (Memory.patchCode) for applyPatches to make once the world is
 * stopped, queued from a deferred call (deferPatch) that chose it: made in that same stop. */
export function writeWhenStopped(write) {
  world.writes.push(write);
}

/* An Interceptor.attach on a site memtrace already redirects (the descriptor guard's close): it
 * rewrites no code -- the function is already Frida's -- but its listener is live the moment it
 * is made, and a thread waiting in it for the script's lock would hold the flush back.  So it is
 * made after the flush, once the world runs again. */
export function deferUntilFlushed(call) {
  world.afterFlush.push(call);
}

/*
 * Interceptor.revert(target), made by applyPatches once the world is stopped, right before its
 * flush.  revert() does not wait for the flush: it clears the function context's replacement at
 * once, and _gum_function_context_begin_invocation reads that field twice -- `if (replacement !=
 * NULL)` ... `*next_hop = replacement` (two loads in Frida 17.26.2's x86-64 build) -- so a thread entering the
 * function in between jumps to address 0 with the caller's return address already turned into the
 * on_leave trampoline: the fds storm's other SIGSEGV (pc 0, docs/hook-storm.md), its threads being in
 * close() without pause.  With the world stopped clear of Frida's code no thread is in between.
 */
export function revertWhenStopped(target) {
  world.reverts.push(target);
}

/* True when memtrace redirects `address` already (a replace or replaceFast noted by notePatched). */
export function isRedirected(address) {
  return world.otherSites.has(ptr(address).toString());
}

/* `address` is about to be patched (or restored): no stopped thread may be inside its first bytes.
 * `listener`: by a JavaScript listener (attachListener), which memtrace restores itself
 * (releaseListenerSites); anything else (a replaceFast, a replace) is left to Frida's restore.
 * Call it before the Interceptor call (or its deferPatch). */
export function notePatched(address, listener = false, deferred = false) {
  if (address === null || address === undefined)
    return;
  const site = ptr(address).toString();
  world.sites.add(site);
  if (!listener) {
    // `deferred`: the caller's replace is made by applyPatches (deferPatch), so a refused patch
    // leaves the site untouched (refuse forgets it again); else it is in Frida's transaction
    // already, where a refused patch cannot take it back.
    if (deferred && !world.otherSites.has(site))
      world.pendingRedirects.add(site);
    world.otherSites.add(site);
    if (!deferred)
      world.queuedDirect++;
  }
}

/* A JavaScript listener of memtrace's is on `address` now (its Interceptor.attach succeeded). */
export function holdListenerSite(address) {
  const site = ptr(address).toString();
  world.listenerHolds.set(site, (world.listenerHolds.get(site) || 0) + 1);
}

/*
 * Applies every queued Interceptor change with the world stopped (Linux), with it running
 * elsewhere.  `what` names the change in a warning.  Returns true when the world was stopped.
 */
export function applyPatches(what, write = null) {
  // write: a patch of memtrace's own (Memory.patchCode), made while the world is stopped too.
  world.stats.applied++;
  // What callers queued in Frida's transaction themselves (a replace: notePatched) cannot be taken
  // back; the deferred calls, the reverts and our own writes are made here, once the world is stopped.
  const direct = world.queuedDirect;
  world.queuedDirect = 0;
  if (write !== null)
    world.writes.push(write);
  if (world.fns === null) {
    makeQueued();
    Interceptor.flush();
    world.stats.running++;
    if (!world.warned) {
      world.warned = true;
      warnLater(`hooks patched with the world running: ${world.why}`);
    }
    for (const call of world.afterFlush.splice(0))
      call();
    sendLater();
    return false;
  }
  // Nor inside Interceptor's way in (entryRanges): a flush that takes a function's hook out frees
  // its context, and a thread on the way in has not yet counted itself in.
  const avoid = [...world.sites].map(s => [ptr(s).add(1), ptr(s).add(PROLOGUE_BYTES)]).concat(world.fridaCode,
    [...world.entryCode.values()]);
  // At exit with no other thread of the program (skipParkedAtExit): nothing to stop.
  const alone = world.alone;
  refreshSignalReturns();
  let stopped = alone || stopClear(avoid, true);
  if (!stopped && world.busy !== null && direct === 0)
    stopped = stopClearSleeping(avoid);
  if (!stopped && world.busy !== null)
    return refuse(what, direct);
  let rewritten = 0;
  const afters = [];
  try {
    // Which sites the flush rewrites, as seen while the world is still stopped (the proof that
    // the bytes changed under the stop, not after it).
    const before = [...world.sites].map(a => new Uint8Array(ptr(a).readByteArray(PROLOGUE_BYTES)));
    // The bytes of a site before memtrace's first patch there (nothing is written before the
    // flush below): what releaseListenerSites puts back.
    [...world.sites].forEach((a, i) => {
      if (!world.pristine.has(a))
        world.pristine.set(a, before[i]);
    });
    // Made with the world stopped strictly -- no stopped thread in Frida's code, so none holds a
    // lock of Frida's that Interceptor's calls take (theirs are Frida's own: its heap, the
    // interceptor's mutex, code slices mapped by system call) -- so that a patch that cannot
    // have such a stop is refused with nothing queued (refuse).  Back to back, nothing between
    // them and the flush: Interceptor's transaction stays open until it.
    makeQueued();
    Interceptor.flush();
    [...world.sites].forEach((a, i) => {
      const after = new Uint8Array(ptr(a).readByteArray(PROLOGUE_BYTES));
      if (after.some((b, k) => b !== before[i][k]))
        rewritten++;
      afters.push([ptr(a), after]);
    });
    if (stopped && !alone)
      world.stats.started_during += Number(world.fns.unheld(world.mem.world));
  } finally {
    if (stopped && !alone)
      world.fns.resume(world.mem.world);
  }
  for (const [site, bytes] of afters)
    noteEntryRanges(site, bytes);
  for (const call of world.afterFlush.splice(0))
    call();
  if (alone) {
    world.stats.alone++;
    world.log.push([what, rewritten]);
  } else if (stopped) {
    world.stats.stopped++;
    world.stats.rewritten_stopped += rewritten;
    world.log.push([what, rewritten]);
  } else {
    world.stats.running++;
    world.stats.failed++;
    if (!world.warned) {
      world.warned = true;
      warnLater(`${what}: patched with the world running (${readError()})`);
    }
  }
  sendLater();
  return stopped;
}

/*
 * applyPatches for a patch the capture cannot do without (the malloc tracer's redirects): `queue`
 * defers its Interceptor calls (deferPatch); when the patch is refused for a thread that stayed in
 * Frida's code, nothing was written (the deferred calls are dropped), so after PATCH_RETRY_S --
 * Thread.sleep lets go of the script's lock, and the thread gets the CPU to leave -- it is queued
 * and tried again, at most PATCH_TRIES times in all.  Only the last refusal is said and counted
 * as refused (frida_refused); the ones before are counted apart (frida_refused_retried).  A spawned
 * program on a loaded machine lost its whole capture to one refusal (CI, round 5).
 */
export function applyPatchesRetrying(what, queue, tries = world.patchTries) {
  for (let t = 1; ; t++) {
    queue();
    world.retrying = t < tries;
    const retriedBefore = world.stats.frida_refused_retried;
    let made;
    try {
      made = applyPatches(what);
    } finally {
      world.retrying = false;
    }
    if (world.stats.frida_refused_retried === retriedBefore)
      return made;
    Thread.sleep(PATCH_RETRY_S);
  }
}

/* The Interceptor calls and writes applyPatches makes: the deferred calls (attach), the reverts,
 * memtrace's own code writes. */
function makeQueued() {
  world.pendingRedirects.clear();
  for (const call of world.deferred.splice(0))
    call();
  for (const target of world.reverts.splice(0))
    Interceptor.revert(target);
  for (const write of world.writes.splice(0))
    write();
}

/* A strict stop that stayed busy while nothing at all is queued in Frida's transaction (the
 * reverts, the deferred calls and our writes are made only once the world is stopped): this thread
 * may sleep -- Thread.sleep() lets go of the script's lock, so a thread waiting for it in a
 * listener runs its callback and leaves Frida's code -- and try again, for at most FRIDA_SLEEP_MS. */
function stopClearSleeping(avoid) {
  const started = Date.now();
  const first = world.busy;
  while (Date.now() < started + world.fridaSleepMs) {
    world.stats.frida_sleeps++;
    Thread.sleep(FRIDA_SLEEP_S);
    if (stopClear(avoid, true, 50))
      return true;
    if (world.busy === null)
      return false;     // no longer Frida's doing: the caller's plain failure path
  }
  world.busy = { ms: first.ms + (Date.now() - started), tries: first.tries + world.busy.tries,
    threads: world.busy.threads, first: world.busy.first };
  return false;
}

/*
 * No stop could be had with every stopped thread out of Frida's code within the budget: the patch
 * is refused rather than made with a thread held that may own one of Frida's locks (the flush
 * would wait for it with the world stopped: a stall of the agent's thread, or worse).  Nothing of
 * what applyPatches makes is made: the reverts and memtrace's writes stay queued (the next
 * applyPatches makes them: at the latest the teardown's), the deferred calls are dropped (their
 * listeners and redirects never go in: the target is untouched).  Counted (frida_refused), named
 * in `refused` and said in a warning.  What a caller queued in Frida's transaction itself (`direct`:
 * a replace noted by notePatched without `deferred`; none of memtrace's now) cannot be taken back:
 * Frida writes it when this turn ends, and the warning says so.
 */
function refuse(what, direct) {
  const busy = world.busy;
  const dropped = world.deferred.length;
  world.deferred.splice(0);
  world.afterFlush.splice(0);
  // The redirects deferred here were never made: their sites are not memtrace's (isRedirected).
  for (const site of world.pendingRedirects)
    world.otherSites.delete(site);
  world.pendingRedirects.clear();
  if (world.retrying && direct === 0) {
    // applyPatchesRetrying queues it all again and tries once more: nothing said yet.
    world.stats.frida_refused_retried++;
    return false;
  }
  world.stats.frida_refused++;
  let why = `${busy.threads} thread(s) stayed inside Frida's code for ${busy.ms} ms (${busy.tries} stops)`;
  if (busy.first)
    why += ` (the first: ${busy.first})`;
  world.refused.push([what, why]);
  let message = `${what}: not patched: ${why}`;
  if (dropped > 0)
    message += `; ${dropped} hook(s) left out${direct === 0 ? ' (nothing of them was written: the target is untouched)' : ''}`;
  if (world.reverts.length > 0 || world.writes.length > 0)
    message += '; the restores are tried again at the next patch';
  if (direct > 0)
    message += `; ${direct} redirect(s) already queued are written by Frida with the world running`;
  warnLater(message);
  sendLater();
  return false;
}

/*
 * Interceptor's way into a hooked function, as [start, end) ranges (x86-64).  A redirected site
 * jumps to its function context's on_enter trampoline (`push [ctx]; jmp enter_thunk`, in a
 * 256-byte code slice that starts with the context's address and also holds the relocated
 * prologue), and the enter thunk calls _gum_function_context_begin_invocation, whose first act is
 * to count the thread in (trampoline_usage_counter).  A flush that takes the function's last hook
 * out destroys its context -- and frees the slice -- when that count is 0
 * (gum_interceptor_transaction_end): a thread stopped anywhere on that way in (neither in the
 * prologue nor in Frida's library) would resume into freed memory.  That is the fds storm's
 * SIGSEGV: a thread in close() read the freed context's listener array (docs/hook-storm.md).  So
 * every flush's stop is clear of these ranges too.  They are read from the site's bytes right after
 * the flush that put the hook in (a listener site memtrace restores itself keeps its ranges
 * recorded).  ARCH-UNVERIFIED: arm64's redirects are not decoded (nothing recorded there).
 */
function noteEntryRanges(site, bytes) {
  if (Process.arch !== 'x64')
    return;
  const enter = jumpTarget(site, bytes, 0);
  if (enter === null)
    return;
  let code;
  try {
    code = new Uint8Array(enter.readByteArray(32));
  } catch (e) {
    return;
  }
  let k = endbr(code, 0);
  // push qword [rip + disp32]: the context's address, at the slice's start
  if (code[k] !== 0xff || code[k + 1] !== 0x35)
    return;     // not a Frida trampoline (a replaceFast goes straight to its replacement)
  const slice = enter.add(k + 6).add(readS32(code, k + 2));
  k += 6;
  const thunk = jumpTarget(enter.add(k), code.subarray(k), 0);
  for (const lo of thunk === null ? [slice] : [slice, thunk]) {
    const hi = lo.add(TRAMPOLINE_BYTES);
    world.entryCode.set(`${lo}-${hi}`, [lo, hi]);
  }
}

/* Where an x86-64 jmp at bytes[k] (code at address `at`) goes: jmp rel32, or jmp [rip+0] with the
 * address after it; after an endbr64.  null for anything else. */
function jumpTarget(at, bytes, k) {
  k = endbr(bytes, k);
  if (bytes.length >= k + 5 && bytes[k] === 0xe9)
    return at.add(k + 5).add(readS32(bytes, k + 1));
  if (bytes.length >= k + 14 && bytes[k] === 0xff && bytes[k + 1] === 0x25 && readS32(bytes, k + 2) === 0) {
    let v = 0n;
    for (let i = 7; i >= 0; i--)
      v = (v << 8n) | BigInt(bytes[k + 6 + i]);
    return ptr('0x' + v.toString(16));
  }
  return null;
}

function endbr(bytes, k) {
  return bytes[k] === 0xf3 && bytes[k + 1] === 0x0f && bytes[k + 2] === 0x1e && bytes[k + 3] === 0xfa ? k + 4 : k;
}

function readS32(bytes, k) {
  return (bytes[k] | (bytes[k + 1] << 8) | (bytes[k + 2] << 16) | (bytes[k + 3] << 24));
}

/* Whether a loop of looks for a moment with no thread in Frida's code, begun at `started` with
 * `looks` made, gives up now: past `ms` with at least `minLooks` made, or past `capMs` whatever.
 * It is the looks that find such a moment, and on a loaded machine every stop takes long (the
 * Mach stand-in suspends each thread by a signal round trip): a bound by time alone may allow only
 * a handful (CI's rare Mach-stop failures: a drain and a key retirement that gave up). */
function givesUp(started, looks, ms, minLooks, capMs) {
  const spent = Date.now() - started;
  return spent > capMs || (spent > ms && looks >= minLooks);
}

/*
 * Waits (bounded) until no thread of the target is inside Frida's code: none then runs a
 * JavaScript callback of ours or waits for the script's lock, so none holds a level of
 * Interceptor's transaction, and the next flush made with the world stopped writes everything
 * queued.  Waiting means Thread.sleep(), which lets go of the script's lock (the threads waiting
 * for it run their callback and leave) and of this thread's level of the transaction: the last
 * thread to leave applies whatever is queued, with the world running.  So call it only when
 * nothing queued can hurt: before any Interceptor call of the change to come
 * (applyListenerPatches), or once the queued restores are already written (releaseListenerSites).
 * New callers are not let in meanwhile only if no listener of ours is live or the live ones' sites
 * are back to their own bytes.  Returns true when drained.
 */
export function drain() {
  if (world.fns === null || world.fridaCode.length === 0)
    return false;
  refreshSignalReturns();
  const started = Date.now();
  for (let looks = 1; ; looks++) {
    world.stats.drain_tries++;
    // A look, let go in C: clear (no thread in Frida's code) or busy.
    if (stopOnce(0, true, true) === STOP_CLEAR) {
      world.stats.drained++;
      return true;
    }
    if (givesUp(started, looks, DRAIN_MS, DRAIN_LOOKS, DRAIN_CAP_MS))
      break;
    Thread.sleep(0.002);
  }
  world.stats.not_drained++;
  return false;
}

/*
 * Listeners in: the tracer's Interceptor.attach calls were deferred (attachListener); threads still
 * inside Frida's code (an earlier listener, a thread observer) are drained first -- nothing is
 * queued yet --, then the calls are made back to back and written with the world stopped.
 */
export function applyListenerPatches(what) {
  drain();
  return applyPatches(what);
}

/*
 * Listeners out: `addresses` are the sites of listeners just detached (l.detach(): Frida stops
 * calling them at once, and queues the restore of the bytes).  Every site no listener of ours is
 * left on, and that no redirect of memtrace's shares, is put back to its pristine bytes by
 * memtrace itself with the world stopped (clear of its first bytes), right after Frida's flush: if
 * a thread waiting in a listener holds Interceptor's transaction open, Frida's own restore is
 * written later, by that thread, with the world running -- but then it writes the very bytes
 * already there, which no running thread can trip over.  Then the threads still in Frida's code
 * are drained, so that the patches that follow (the descriptor guard, the execve hook) are written
 * with the world stopped.  A site shared with a redirect keeps its bytes (Frida's function context
 * stays); it is restored when the redirect comes out.
 */
export function releaseListenerSites(addresses, what) {
  const mine = [];
  for (const a of addresses) {
    const site = ptr(a).toString();
    const left = (world.listenerHolds.get(site) || 0) - 1;
    if (left > 0) {
      world.listenerHolds.set(site, left);
      continue;
    }
    world.listenerHolds.delete(site);
    if (world.otherSites.has(site) || !world.pristine.has(site))
      world.stats.restored_by_frida++;
    else
      mine.push(site);
  }
  restoreStopped(mine, what + ' (memtrace)');
  drain();
  return applyPatches(what);   // Frida's restores, if still queued: the same bytes again
}

/*
 * Puts `sites` back to their pristine bytes with the world stopped (clear of their first bytes and
 * of Frida's code by pc).  Threads waiting in a listener for the script's lock are still there (they
 * are drained after), so nothing that may take one of Frida's locks runs under this stop: the bytes
 * are staged before it and written by cmodule/world.c's mt_world_write (mprotect and stores only).
 */
function restoreStopped(sites, what) {
  const staged = [];
  for (const site of sites) {
    const want = world.pristine.get(site);
    const now = new Uint8Array(ptr(site).readByteArray(want.length));
    let last = -1;
    for (let i = 0; i < want.length; i++) {
      if (now[i] !== want[i])
        last = i;
    }
    if (last < 0)
      continue;   // Frida's restore is in already
    const buf = Memory.alloc(last + 1);
    buf.writeByteArray(Array.from(want.subarray(0, last + 1)));
    staged.push([ptr(site), buf, last + 1]);
  }
  if (staged.length === 0 || world.fns === null || world.mprotect === null)
    return;     // (NULL, not null, on Darwin: the alias writer)
  const avoid = sites.map(s => [ptr(s).add(1), ptr(s).add(PROLOGUE_BYTES)]).concat(world.fridaCode);
  const writes = Memory.alloc(staged.length * 24);
  staged.forEach(([site, buf, len], i) => {
    writes.add(i * 24).writePointer(site);
    writes.add(i * 24 + 8).writePointer(buf);
    writes.add(i * 24 + 16).writeU64(len);
  });
  const n = writeRanges(avoid);
  // Stop, write, let go: all in C (world.c mt_world_write_stopped), since this stop cannot be
  // strict -- threads waiting in a listener for the script's lock are in Frida's code until we let
  // go of it -- and so must touch nothing of Frida's.
  let written = -2;
  for (let t = 0; t < NEW_THREAD_TRIES && written === -2; t++) {
    const nListed = prepare();
    written = Number(world.fns.writeStopped(world.mem.world, world.mem.ranges, n, CLEAR_TRIES, CLEAR_PAUSE_US,
      world.mem.listed, nListed, writes, staged.length, world.mprotect, Process.pageSize));
    if (written === -2)
      world.stats.retries++;
  }
  if (written < 0) {
    world.stats.failed++;
    return;    // left to Frida's restore (maybe with the world running): counted as failed
  }
  // A site the writer refused (Darwin: no writable alias allowed) is left to Frida's restore too.
  world.stats.restore_refused += staged.length - written;
  world.stats.restored_stopped += written;
  world.stats.stopped++;
  world.stats.applied++;
  world.log.push([what, written]);
}

/*
 * Waits (bounded) until no thread of the target runs in `ranges` ([start, end) NativePointer
 * pairs: code about to be freed) or will return into it.  Call with every hook into that code
 * already out.  ranges[openFrom ...] are entries only our own code calls (trampolines): a stack
 * word at one's very start is no reference (cmodule/world.c mt_world_open_start).  `returnsOnly`:
 * code no program thread calls through a pointer it keeps -- a stack word counts only as a return
 * address (below any signal frame), as in the strict stop.  Returns { clear, tries, threads }
 * (threads: still referring at the last look).
 */
export function quiesce(ranges, openFrom = ranges.length, returnsOnly = false) {
  if (world.fns === null || ranges.length === 0)
    return { clear: false, tries: 0, threads: null, why: world.why };
  if (world.alone) {
    // The program's one thread is held in Frida's exit monitor, not in our code (skipParkedAtExit).
    world.stats.quiesced++;
    return { clear: true, tries: 0, threads: 0 };
  }
  refreshSignalReturns();
  const t0 = Date.now();
  let tries = 0;
  let threads = null;
  let live = false;
  for (;;) {
    tries++;
    // Strict (no thread held in Frida's code, budget 0: looked at again below): the question is
    // asked from JavaScript while the world is stopped.
    if (stopClear([], true, 0)) {
      const n = writeRanges(ranges);
      threads = Number(world.fns.refs(world.mem.world, world.mem.ranges, n, openFrom, returnsOnly ? 1 : 0, REFS_DEPTH,
        world.mem.scratch, SCRATCH));
      // Which thread, and by what (read still stopped, said once the world runs: busyThread).
      if (threads !== 0)
        world.fns.firstRef(world.mem.world, world.mem.ranges, n, openFrom, returnsOnly ? 1 : 0, REFS_DEPTH,
          world.mem.scratch, SCRATCH, world.mem.busy.add(8));
      world.fns.resume(world.mem.world);
      if (threads === 0) {
        world.stats.quiesced++;
        if (live)
          world.stats.quiesced_late++;
        return { clear: true, tries, threads };
      }
      live = refLooksLive();
    }
    const waited = Date.now() - t0;
    if (waited > QUIESCE_LIVE_MS || (waited > QUIESCE_MS && !live))
      break;
    Thread.sleep(0.002);
  }
  world.stats.not_quiesced++;
  const first = threads !== null && threads !== 0 ? busyThread(ranges) : null;
  world.lastQuiesce = { tries, threads, first, why: threads === null ? readError() : null };
  return { clear: false, tries, threads, why: world.lastQuiesce.why, first };
}

/*
 * Frida's own pthread keys (its GLib's GPrivate: the Interceptor's per-thread context, ...) have
 * their destructors in Frida's agent.  Every thread that ran through any hook -- and, under the
 * threads tracer, every thread started or exiting, through gum's thread registry -- holds a value
 * there, so glibc calls that destructor when the thread exits (__nptl_deallocate_tsd: read the
 * key's destr, then call it).  Frida deletes the keys when its agent unloads but waits for no
 * thread already between that read and the call, or inside the destructor: the threads storm's
 * death at cycle 100 (docs/hook-storm.md) -- a thread exiting, running the NEXT session's agent,
 * mapped at the same address, on the freed agent's data.  So once the hooks are out, with the
 * world stopped strictly (no thread's pc, register or stack word in Frida's code: not a thread
 * holding that destr in a register or running it), every such key's destructor is set to NULL:
 * glibc then calls nothing for it, and a thread exiting from here on leaks its context into
 * Frida's heap, which the unload frees whole.  Linux/glibc only (its __pthread_keys table:
 * { seq, destr } per key, in use when seq is odd); idempotent.  Returns how many were retired, or
 * null when it could not be done (why in world.fridaKeys.why).
 */
const PTHREAD_KEYS_MAX = 1024;
const FRIDA_KEYS_MS = 3000;        // givesUp: at least this long,
const FRIDA_KEYS_LOOKS = 20;       // ... and this many strict stops,
const FRIDA_KEYS_CAP_MS = 4500;    // ... never longer than this

export function retireFridaKeyDestructors() {
  const fk = world.fridaKeys;
  if (fk.done)
    return fk.retired;
  fk.done = true;
  const table = IS_DARWIN ? null : Module.findGlobalExportByName('__pthread_keys');
  if (world.fns === null || table === null || world.fridaCode.length === 0) {
    fk.why = world.fns === null ? world.why : (table === null ? 'no glibc __pthread_keys' : 'no Frida code seen');
    return null;
  }
  const entry = Process.pointerSize * 2;
  const inFrida = p => world.fridaCode.some(([lo, hi]) => p.compare(lo) >= 0 && p.compare(hi) < 0);
  const ours = () => {
    const out = [];
    for (let i = 0; i < PTHREAD_KEYS_MAX; i++) {
      const at = table.add(i * entry);
      if ((at.readU32() & 1) === 1 && inFrida(at.add(Process.pointerSize).readPointer()))
        out.push(at.add(Process.pointerSize));
    }
    return out;
  };
  if (ours().length === 0)
    return (fk.retired = 0);
  refreshSignalReturns();
  const started = Date.now();
  for (let looks = 1; ; looks++) {
    if (stopClear([], true, 0)) {
      // Stopped strictly: read again (a key made meanwhile), then write -- nothing else runs.
      const slots = ours();
      for (const slot of slots)
        slot.writePointer(NULL);
      world.fns.resume(world.mem.world);
      fk.retired = slots.length;
      return fk.retired;
    }
    if (givesUp(started, looks, FRIDA_KEYS_MS, FRIDA_KEYS_LOOKS, FRIDA_KEYS_CAP_MS)) {
      const first = world.busy !== null && world.busy.first ? `; the first: ${world.busy.first}` : '';
      fk.why = `no strict stop in ${Date.now() - started} ms, ${looks} stops ` +
        `(${readError() || 'a thread in Frida\'s code'}${first})`;
      return null;
    }
    Thread.sleep(0.002);
  }
}

/* The first function of a CModule compiled from source (TinyCC lays functions out in source
 * order: process.js buildProcess puts this first): nothing calls it or takes its address, so no
 * live reference points at the module's first byte -- where stale words do.  A program thread
 * that keeps a page address mmap gave it, the pages unmapped since and given to the module, holds
 * a word equal to the module's start: quiesce waited its 3 s for it, in ~1 % of the hook-storm
 * tests' runs (docs/hook-storm.md, round 25).  moduleCode starts the range one byte on (not at the
 * next exported symbol: TinyCC exports no static function, and those after the lead stay in). */
export const TEXT_LEAD_C = 'void mt_text_lead (void) { }\n';

/* The code of a CModule `cm` as [start, end) pairs, for quiesce(): TinyCC's section bounds (Frida
 * hides the module's pages from Process's ranges); without them its functions' span, a page on.
 * A range that begins with TEXT_LEAD_C's function begins one byte on instead. */
export function moduleCode(cm) {
  let lo;
  let hi;
  if (cm.__start_text instanceof NativePointer && cm.__stop_text instanceof NativePointer &&
      cm.__stop_text.compare(cm.__start_text) > 0) {
    lo = cm.__start_text;
    hi = cm.__stop_text;
  } else {
    const addrs = Object.keys(cm).map(k => cm[k]).filter(p => p instanceof NativePointer && !p.isNull());
    if (addrs.length === 0)
      return [];
    lo = addrs[0];
    hi = addrs[0];
    for (const p of addrs) {
      if (p.compare(lo) < 0)
        lo = p;
      if (p.compare(hi) > 0)
        hi = p;
    }
    hi = hi.add(Process.pageSize);
  }
  const lead = cm.mt_text_lead;
  if (lead instanceof NativePointer && lead.equals(lo)) {
    world.stats.lead_skipped++;
    lo = lead.add(1);
  }
  return [[lo, hi]];
}

/* What the host records: how every patch went. */
export function worldReport() {
  return Object.assign({ why: world.why, stop_by: world.stopBy, sites: world.sites.size,
    frida_code_ranges: world.fridaCode.length,
    // signal-return code known to the strict stop (0: it counts every stack word into Frida's code)
    signal_returns: world.signalReturns,
    // a held program: its main thread's wait in the hold library is known (its stack not searched there)
    hold_code: world.hold !== null,
    entry_ranges: world.entryCode.size, log: world.log, refused: world.refused,
    frida_keys_retired: world.fridaKeys.retired, frida_keys_why: world.fridaKeys.why,
    // the last strict stop that gave up: how long, how many stops, which thread (busyThread)
    last_busy: world.busy, last_not_quiesced: world.lastQuiesce }, world.stats);
}
