/*
 * malloc tracer.  Hot paths live in cmodule/ (core.c, track.c, drain.c, malloc.c; leaks.c for
 * --leaks); this file finds the hook points, wires them up, and adds to each batch what only it
 * knows (the timeline sample, counts moved between aliased names).
 *
 * Linux:  Interceptor.replaceFast on the glibc malloc family.
 * Darwin: libmalloc's `malloc_logger` (every zone, nano included) and
 *         libsyscall's `__syscall_logger` (VM operations with their tag);
 *         the public malloc family through replaceFast where the logger
 *         cannot be set.  DEVICE-UNVERIFIED: written from libmalloc's
 *         stack_logging.h and malloc.c, exercised on Linux through the
 *         stand-in libmtmalloc (tests/integration/test_malloc_logger.py).
 */

import { C_BYTES, C_CALLS, KINDS, LOGGER_EVENT, N_SITES, OWN_THREADS_WORDS, SITE } from './layout.js';
import { LEAKS_LIVE_TABLE, forgetExitedFridaThreads, leakSymbols, markFridaThreads, scanLeaks } from './leaks.js';
import { buildCore, core, exactU64, retireThreadKey, setEnabled } from './runtime/core.js';
import { setBatchHook, warn } from './runtime/flush.js';
import { LOGGER_MODULES, drainLogger, familyFor, ignoreAgentThread, loggerSymbols, loggerVariable,
  selfTask } from './runtime/logger.js';
import { IS_DARWIN, findExport, libcModule, now } from './runtime/platform.js';
import { readStruct } from './runtime/structs.js';
import { selfTaskVmInfo } from './runtime/taskinfo.js';
import {
  applyPatches, applyPatchesRetrying, deferPatch, moduleCode, notePatched, quiesce, revertWhenStopped, warnLater,
} from './runtime/world.js';

/* The replaced entries; each one's call kind is KINDS[name] (layout.js), its C replacement mt_<name>. */
const FAMILY = ['malloc', 'calloc', 'realloc', 'free', 'posix_memalign', 'memalign',
  'aligned_alloc', 'valloc', 'pvalloc', 'reallocarray'];

const LOGGER_MODULE = LOGGER_MODULES.malloc_logger;
const SYSCALL_LOGGER_MODULE = LOGGER_MODULES.__syscall_logger;
const DRAIN_TIMEOUT_MS = 1000;
const TRAMPOLINE_BYTES = 256;      // one Interceptor code slice

const mallocState = {
  drain: null,
  tlsKey: null,
  keyRetired: null,        // how the core's pthread key ended (retireThreadKey): 'kept', 'replaced', ...
  agentThreadIgnored: false,
  ownThreads: null,        // the core's table of Frida's own threads (mt_own_threads)
  fridaThreads: null,      // what markFridaThreads wrote there
  fridaThreadsChecked: 0,  // when exited ones were last forgotten (now())
  replaced: [],
  trampolines: [],         // Interceptor's relocated prologues our C calls the real entries through
  quiesce: null,           // how the last uninstall's wait for threads inside our code ended
  loggerSlots: [],
  realSlots: {},
  aliases: {},
  failed: {},
  slow: [],
  backend: null,
  leaksDone: false,
  tStart: null,
  sites: new Map(),        // call site (string) -> the name its caller used, or null
  imports: new Map(),      // module base (string) -> Map(GOT slot (string) -> imported name)
  inUse: undefined,        // the allocator's in-use reader, or null
  inUseNext: 0,            // Date.now() before which the timeline sample does not read it again
  inUseTook: null,         // µs of the thread's CPU time the last mallinfo2 call took (sampledInUse)
  inUseSampled: false,     // a timeline sample has asked for it (the first read waits IN_USE_FIRST_MS)
  cpuClock: undefined,     // clock_gettime for the thread's CPU time (threadCpuUs), or null
  kept: [],                // blocks mallocOnAgentThread holds (tests)
};

/* The code a thread inside one of our hooks may be running or return into: the C module (every
 * symbol it exports lies in it, with its data; one mapping of its own where Frida shows it) and
 * the trampolines the replacements call the real entries through. */
function ownCode(cm, trampolines) {
  const ranges = [];
  const range = Process.findRangeByAddress(cm.mt_malloc);
  if (range !== null) {
    ranges.push([range.base, range.base.add(range.size)]);
  } else {
    ranges.push(...moduleCode(cm));
  }
  for (const t of trampolines)
    ranges.push([t, t.add(TRAMPOLINE_BYTES)]);
  return ranges;
}

/* doctor's self-test (extraExports.selfTest): compiled on first use, kept while the agent lives. */
let selfTestModule = null;

function allocatorModule() {
  return IS_DARWIN ? Process.findModuleByName(LOGGER_MODULE) : libcModule();
}

/* The allocator's own export, not a same-named one from another module (the agent's). */
function familyAddress(name) {
  const m = allocatorModule();
  if (m !== null) {
    const p = m.findExportByName(name);
    if (p !== null)
      return p;
  }
  return Module.findGlobalExportByName(name);
}

/* Darwin: the logger unless told otherwise.  Linux: the logger only when asked for and the
 * stand-in libmtmalloc is loaded (tests of the Darwin path). */
function chooseBackend(config) {
  if (config.backend === 'symbols' || (!IS_DARWIN && config.backend !== 'logger'))
    return 'symbols';
  return loggerVariable('malloc_logger') !== null ? 'logger' : 'symbols';
}

/* ---- names that share one entry point (glibc: memalign is also aligned_alloc) ---------------- */

/* The GOT slot a call at return address `ra` went through: a direct call to a PLT stub that jumps
 * through the slot, or a call through the slot itself (-fno-plt).  null when it is neither. */
function callSlot(ra) {
  try {
    if (Process.arch === 'x64') {
      const direct = Instruction.parse(ra.sub(5));
      if (direct.mnemonic === 'call' && direct.next.equals(ra) && direct.operands[0].type === 'imm')
        return stubSlot(ptr(direct.operands[0].value));
      const viaGot = Instruction.parse(ra.sub(6));
      const op = viaGot.operands[0];
      if (viaGot.mnemonic === 'call' && viaGot.next.equals(ra) && op.type === 'mem' && op.value.base === 'rip')
        return ra.add(op.value.disp);
    } else if (Process.arch === 'arm64') {
      // ARCH-UNVERIFIED on arm64 Linux (tests run on x86-64): the PLT decoding has not run there.
      const bl = Instruction.parse(ra.sub(4));
      if (bl.mnemonic === 'bl' && bl.operands[0].type === 'imm')
        return stubSlot(ptr(bl.operands[0].value));
    }
  } catch (e) {
    // not code we can read: the site stays with the hooked name
  }
  return null;
}

/* The slot a PLT stub jumps through: x86-64 `[endbr64;] [bnd] jmp *disp(%rip)`, arm64
 * `adrp x16, page; ldr x17, [x16, #off]`. */
function stubSlot(stub) {
  let insn = Instruction.parse(stub);
  if (Process.arch === 'x64') {
    if (insn.mnemonic === 'endbr64')
      insn = Instruction.parse(insn.next);
    const op = insn.operands[0];
    if (insn.mnemonic.endsWith('jmp') && op !== undefined && op.type === 'mem' && op.value.base === 'rip')
      return insn.next.add(op.value.disp);
    return null;
  }
  const ldr = Instruction.parse(insn.next);
  if (insn.mnemonic === 'adrp' && ldr.mnemonic === 'ldr' && ldr.operands[1].type === 'mem')
    return ptr(insn.operands[1].value).add(ldr.operands[1].value.disp);
  return null;
}

/* Which of the shared names the caller at `ra` imported, or null. */
function siteName(ra, names) {
  const slot = callSlot(ra);
  const m = Process.findModuleByAddress(ra);
  if (slot === null || m === null)
    return null;
  let slots = mallocState.imports.get(m.base.toString());
  if (slots === undefined) {
    slots = new Map();
    for (const imp of m.enumerateImports()) {
      if (imp.slot !== undefined && names.includes(imp.name))
        slots.set(imp.slot.toString(), imp.name);
    }
    mallocState.imports.set(m.base.toString(), slots);
  }
  return slots.get(slot.toString()) || null;
}

/* Counts to move from each hooked kind to the name its call sites used: [[from, to, calls, bytes]]. */
function aliasMoves() {
  const moves = [];
  if (Object.keys(mallocState.aliases).length === 0)
    return moves;
  const used = Math.min(N_SITES, Number(core.fns.sitesUsed()));
  for (let i = 0; i < used; i++) {
    const site = readStruct(core.sites.add(i * SITE.size), SITE);
    const hooked = Object.keys(KINDS).find(k => KINDS[k] === site.kind.toNumber());
    const names = [hooked, ...Object.keys(mallocState.aliases).filter(a => mallocState.aliases[a] === hooked)];
    const key = site.ra.toString();
    if (!mallocState.sites.has(key))
      mallocState.sites.set(key, siteName(ptr(key), names));
    const name = mallocState.sites.get(key);
    if (name !== null && name !== hooked)
      moves.push([KINDS[hooked], KINDS[name], site.calls, site.bytes]);
  }
  return moves;
}

/* ---- the timeline: one sample per drain ---------------------------------------------------- */

/* The allocator's in-use figure for a timeline sample, at a small cost: glibc's mallinfo2 walks every free
 * chunk of every bin under the arena's lock, which on a large fragmented heap (CPython with
 * PYTHONMALLOC=malloc) took a tenth of the target's CPU when read every 100 ms, and on cc1plus's heap
 * was a sixth of the drain's time.  A call that took d µs of the thread's CPU time (Linux: the load on
 * the machine does not lengthen it as it does a wall clock's) makes the next wait 5 d ms, at most 2 s
 * (0.02 % of the thread's time, 0.5 % for a call of 10 ms or more); a call under 100 µs (a small heap) is
 * made every time.  Elsewhere Date.now's milliseconds around the read: one of d >= 2 ms waits 100 d ms.
 * The first read comes IN_USE_FIRST_MS after the first sample, not at it: a heap that grew fast from
 * the start (the C++ benchmark's: 100 K map nodes in 0.1 s) made that read 5 ms of a 0.11 s program,
 * its arena locked meanwhile; calibration reads the figure at the start and the end anyway.
 * A sample in between says null (not read), never a stale value. */
const IN_USE_FIRST_MS = 1000;

/* t0: the sample's own `t` (ms), so that the wait is measured on the clock the timeline shows. */
function sampledInUse(t0) {
  if (!mallocState.inUseSampled) {
    mallocState.inUseSampled = true;
    mallocState.inUseNext = t0 + IN_USE_FIRST_MS;
  }
  if (t0 < mallocState.inUseNext)
    return null;
  mallocState.inUseTook = null;
  const d0 = Date.now();
  const v = allocatorInUse();
  const took = mallocState.inUseTook;
  if (took !== null) {
    mallocState.inUseNext = took >= 100 ? t0 + Math.min(Math.ceil(5 * took), 2000) : 0;
  } else {
    const ms = Date.now() - d0;
    mallocState.inUseNext = ms >= 2 ? t0 + 100 * ms : 0;
  }
  return v;
}

/* The calling thread's CPU time in microseconds (Linux CLOCK_THREAD_CPUTIME_ID: the load on the machine
 * does not lengthen it as it does a wall clock's), or null. */
function threadCpuUs() {
  if (mallocState.cpuClock === undefined) {
    mallocState.cpuClock = null;
    const f = IS_DARWIN ? null : findExport('clock_gettime');
    if (f !== null)
      mallocState.cpuClock = { get: new NativeFunction(f, 'int', ['int', 'pointer']), ts: Memory.alloc(16) };
  }
  const c = mallocState.cpuClock;
  if (c === null || c.get(3, c.ts) !== 0)
    return null;
  return c.ts.readS64().toNumber() * 1e6 + c.ts.add(8).readS64().toNumber() / 1000;
}

function allocatorInUse() {
  if (mallocState.inUse === undefined) {
    mallocState.inUse = null;
    if (IS_DARWIN) {
      const zs = findExport('malloc_zone_statistics');
      if (zs !== null) {
        const f = new NativeFunction(zs, 'void', ['pointer', 'pointer']);
        const stats = Memory.alloc(32);
        mallocState.inUse = () => {
          f(NULL, stats);
          return exactU64(stats.add(8).readU64());
        };
      }
    } else {
      const mi2 = findExport('mallinfo2');
      if (mi2 !== null) {
        const f = new NativeFunction(mi2, ['size_t', 'size_t', 'size_t', 'size_t', 'size_t',
          'size_t', 'size_t', 'size_t', 'size_t', 'size_t'], []);
        mallocState.inUse = () => {
          const c0 = threadCpuUs();
          const v = f();
          if (c0 !== null)
            mallocState.inUseTook = threadCpuUs() - c0;
          return exactU64(uint64(v[7].toString()).add(v[4]));   // uordblks + hblkhd, as the calibration reads it
        };
      }
    }
  }
  return mallocState.inUse === null ? null : mallocState.inUse();
}

/* The footprint, where it is cheap: Linux anonymous resident memory from /proc/self/statm
 * (resident - shared pages), Darwin's phys_footprint. */
function footprint() {
  try {
    if (IS_DARWIN) {
      const vm = selfTaskVmInfo();
      return vm === null ? null : vm.phys_footprint;
    }
    const f = File.readAllText('/proc/self/statm').split(' ');
    const resident = uint64(f[1]), shared = uint64(f[2]);
    const pages = resident.compare(shared) > 0 ? resident.sub(shared) : uint64(0);
    return exactU64(pages.shl(Math.log2(Process.pageSize)));
  } catch (e) {
    return null;
  }
}

/* Agent milliseconds of a core clock reading (g_get_monotonic_time, microseconds, a BigInt): the
 * difference is taken in 64 bits, only the milliseconds before the drain become a Number. */
function agentMs(us, info) {
  const now_us = info.raw.now_us;
  const ago = now_us > us ? Number(now_us - us) : 0;
  return now() - Math.round(ago / 1000);
}

/* counters[i] += (or -=) an UInt64, in 64 bits: a counter is exactU64's (core.js readCounters). */
function moveCounter(counters, i, amount, add) {
  const v = uint64(counters[i].toString());
  counters[i] = exactU64(add ? v.add(amount) : v.sub(amount));
}

function onBatch(payload, info, last) {
  // Once a second: Frida's listed threads that have exited are forgotten before their ids come back.
  if (mallocState.fridaThreads !== null && payload.t - mallocState.fridaThreadsChecked >= 1000) {
    mallocState.fridaThreadsChecked = payload.t;
    mallocState.fridaThreads.forgotten += forgetExitedFridaThreads(mallocState.ownThreads);
  }
  for (const [from, to, calls, bytes] of aliasMoves()) {
    moveCounter(payload.counters, C_CALLS + from, calls, false);
    moveCounter(payload.counters, C_CALLS + to, calls, true);
    moveCounter(payload.counters, C_BYTES + from, bytes, false);
    moveCounter(payload.counters, C_BYTES + to, bytes, true);
  }
  payload.t0 = mallocState.tStart;
  payload.clock = [info.now_us, now()];
  payload.tracked = { bytes: info.tracked_bytes, blocks: info.tracked_blocks };
  payload.peak = { bytes: info.peak_bytes, epoch: info.peak_epoch,
    t: info.peak_epoch === 0 ? null : agentMs(info.raw.peak_t_us, info) };
  if (info.live_done)
    payload.live_done = true;
  if (last) {
    payload.sample = { t: payload.t, tracked_bytes: info.tracked_bytes, tracked_blocks: info.tracked_blocks,
      peak_bytes: info.peak_bytes, in_use: sampledInUse(payload.t), footprint: footprint(), top: info.top };
  }
}

/* Queues the allocator family's redirects (made by applyPatches with the world stopped): one per
 * address.  Called again for each try of a refused patch (applyPatchesRetrying). */
function queueHooks(targets, cm) {
  const seen = new Map();
  for (const [name, target] of targets) {
    if (target === null)
      continue;
    const key = target.toString();
    // glibc aliases some of the family (aligned_alloc = memalign): one hook per address, and
    // the hook records its call sites so that each call is counted as the name its caller used.
    if (seen.has(key)) {
      mallocState.aliases[name] = seen.get(key);
      const kind = KINDS[seen.get(key)];
      core.aliasKinds.writeU64(core.aliasKinds.readU64().or(uint64(1).shl(kind)));
      continue;
    }
    seen.set(key, name);
    // Made by applyPatches once the world is stopped (deferPatch, runtime/world.js): a refused
    // patch leaves the allocator untouched (its hooks left out, said in a warning).
    notePatched(target, false, true);
    deferPatch(() => {
      try {
        const original = Interceptor.replaceFast(target, cm['mt_' + name]);
        mallocState.realSlots[name].writePointer(original);
        mallocState.replaced.push(target);
        mallocState.trampolines.push(original);
      } catch (fastError) {
        // Some entries are too short or too branchy for a fast redirect; plain
        // replace still works, and calling `target` from the replacement reaches
        // the original implementation.
        try {
          mallocState.realSlots[name].writePointer(target);
          Interceptor.replace(target, cm['mt_' + name]);
          mallocState.replaced.push(target);
          mallocState.slow.push(name);
          core.slowKinds.writeU64(core.slowKinds.readU64().or(uint64(1).shl(KINDS[name])));
        } catch (e) {
          mallocState.realSlots[name].writePointer(NULL);
          mallocState.failed[name] = String(e.message || e);
          warnLater(`cannot hook ${name} at ${target}: ${e.message || e}`);
        }
      }
    });
  }
}

export const tracer = {
  name: 'malloc',

  symbols(config) {
    const wanted = familyFor(FAMILY, IS_DARWIN).map(name => ({ name, resolve: () => familyAddress(name), role: 'hook' }));
    if (IS_DARWIN || config.backend === 'logger') {
      wanted.push({ name: 'malloc_logger', module: LOGGER_MODULE, role: 'logger',
        resolve: () => loggerVariable('malloc_logger') });
      wanted.push({ name: '__syscall_logger', module: SYSCALL_LOGGER_MODULE, role: 'logger',
        resolve: () => loggerVariable('__syscall_logger') });
    }
    if (IS_DARWIN) {
      wanted.push({ name: 'malloc_zone_statistics', role: 'calibration' });
      wanted.push({ name: 'task_info', role: 'calibration' });
    } else {
      wanted.push({ name: 'mallinfo2', role: 'calibration' });
    }
    return wanted;
  },

  init(config, sources) {
    if (config.leaks) {
      // Every live block is a candidate, whatever its size, and is reported with its stack: the
      // live table holds every block (and is sized for a million of them), each with its stack.
      config.liveThreshold = 0;
      config.stackThreshold = 0;
      if (!IS_DARWIN)
        config.liveTable = Math.max(config.liveTable, LEAKS_LIVE_TABLE);
    }
    const extra = {};
    for (const name of FAMILY) {
      const slot = Memory.alloc(Process.pointerSize);
      mallocState.realSlots[name] = slot;
      extra['real_' + name] = slot;
    }
    Object.assign(extra, leakSymbols(), loggerSymbols());
    mallocState.ownThreads = Memory.alloc(OWN_THREADS_WORDS * 8);
    extra.mt_own_threads = mallocState.ownThreads;
    const info = buildCore(config, sources, extra);
    // Frida's TinyCC in place of gcc is a slower core for every hooked call (no direct TLS read,
    // no solo mode, a lock for every live-table insert): said, never left to be found by timing.
    if (info.toolchain === 'internal' && info.toolchainError)
      warn(`memtrace's C core was built by Frida's TinyCC, not gcc (${info.toolchainError}): every hooked ` +
        'call costs more; `memtrace doctor` checks the toolchain');
    mallocState.backend = chooseBackend(config);
    info.backend = mallocState.backend;
    info.stackThreshold = config.stackThreshold;
    info.self_task = selfTask();
    mallocState.tlsKey = info.tlsKey;
    return info;
  },

  install(config) {
    const cm = core.cm;
    // Frida's threads (this one included: rpcs, timers, symbolization) allocate for Frida only.
    mallocState.fridaThreads = markFridaThreads(mallocState.ownThreads);
    mallocState.agentThreadIgnored = ignoreAgentThread(cm);
    mallocState.tStart = now();
    allocatorInUse();    // its NativeFunction made now, not in the first drain
    setBatchHook(onBatch);
    if (mallocState.backend === 'logger') {
      for (const name of ['malloc_logger', '__syscall_logger']) {
        const v = loggerVariable(name);
        if (v === null)
          continue;
        const previous = v.readPointer();
        if (!previous.isNull())
          warn(`${name} was already set (${previous}); memtrace replaces it for the window`);
        mallocState.loggerSlots.push({ name, address: v, previous });
      }
      setEnabled(true);
      for (const s of mallocState.loggerSlots)
        s.address.writePointer(cm.mt_malloc_logger);
      return;
    }
    // Every address first: a lookup ends the Interceptor transaction (runtime/world.js), so none
    // may come between two replaceFast calls, or the first would be written with the world running.
    const targets = FAMILY.map(name => [name, familyAddress(name)]);
    // Queued again if the patch is refused and tried again (applyPatchesRetrying): nothing of a
    // refused try was written.
    applyPatchesRetrying('malloc hooks in', () => queueHooks(targets, cm));
    setEnabled(true);
  },

  uninstall() {
    const hadLogger = mallocState.loggerSlots.length > 0;
    for (const s of mallocState.loggerSlots)
      s.address.writePointer(s.previous);
    mallocState.loggerSlots = [];
    if (hadLogger) {
      // Unloading the script frees the callback's code: no thread may still be inside it.
      mallocState.drain = drainLogger(core.cm, DRAIN_TIMEOUT_MS);
      if (!mallocState.drain.drained)
        warn(`${mallocState.drain.inflight} malloc_logger call(s) still in flight after ${mallocState.drain.waited_ms} ms`);
    }
    // Out with the world stopped (runtime/world.js); then, before anything of ours can be freed,
    // wait until no thread still runs in our C or Interceptor's trampolines (or will return into
    // them): a call that entered a replacement just before the revert finishes there.
    const hadHooks = mallocState.replaced.length > 0;
    for (const target of mallocState.replaced)
      revertWhenStopped(target);    // (a fallback Interceptor.replace races a running revert: world.js)
    mallocState.replaced = [];
    applyPatches('malloc hooks out');
    if (hadHooks) {
      const code = ownCode(core.cm, mallocState.trampolines);
      // (the trampolines last: entries only our code calls)
      mallocState.quiesce = quiesce(code, code.length - mallocState.trampolines.length);
      const q = mallocState.quiesce;
      if (!q.clear && q.threads !== null)
        warn(`${q.threads} thread(s) still inside memtrace's malloc hooks after ${q.tries} looks` +
          `${q.first ? ` (the first: ${q.first})` : ''}; the agent unloads regardless`);
      else if (!q.clear && q.tries > 0)
        // Stops were made, none clear (a thread that would not stop): nothing was looked at.
        warn(`no stop of every thread could be had in ${q.tries} tries to see that none is still inside ` +
          `memtrace's malloc hooks${q.why ? ` (${q.why})` : ''}; the agent unloads regardless`);
    }
    // No more destructor calls into the CModule, and the key's index never reused (core.js).
    mallocState.keyRetired = retireThreadKey();
  },

  /* --leaks: the scan as the process exits (rpc.js dispose), while its hooks are still in. */
  beforeExit(config) {
    if (config.leaks && !mallocState.leaksDone) {
      mallocState.leaksDone = true;
      scanLeaks(config, 'exit');
    }
  },

  extraExports: {
    /* --leaks at the end of the window, before the hooks come out (the host calls it). */
    leaks(config) {
      mallocState.leaksDone = true;
      return scanLeaks(config, 'window-end');
    },
    /* libmalloc's logger argument patterns through the real C decoder (selfTask: the task that is
     * ours, '0x0' for unknown). */
    decodeLoggerEvent(type, arg1, arg2, arg3, result, selfTaskPort) {
      const ev = Memory.alloc(LOGGER_EVENT.size);
      const f = new NativeFunction(core.cm.mt_logger_decode, 'void',
        ['uint32', 'uint64', 'uint64', 'uint64', 'uint64', 'uint64', 'pointer']);
      f(type, uint64(arg1), uint64(arg2), uint64(arg3), uint64(result), uint64(selfTaskPort || '0x0'), ev);
      const r = readStruct(ev, LOGGER_EVENT);
      return { op: r.op.toNumber(), kind: r.kind.toNumber(), ptr: r.ptr.toString(), size: r.size.toString(),
        old_ptr: r.old_ptr.toString(), tag: r.tag.toNumber(), skip: r.skip.toNumber() };
    },
    /* How the last uninstall drained the logger: {drained, waited_ms, inflight} (null: no logger). */
    loggerDrain() {
      return mallocState.drain || null;
    },
    /* Process.enumerateThreads(): on Linux Frida reads the threads' registers from a thread it
     * starts for it, which allocates and frees with the target's malloc (tests: none of it may
     * count).  Returns how many threads it listed. */
    listThreadsThroughFrida(times) {
      let n = 0;
      for (let i = 0; i < times; i++)
        n = Process.enumerateThreads().length;
      return n;
    },
    /* Frida's threads as the core tells them apart: {threads, code_ranges} (null: not installed). */
    fridaThreads() {
      return mallocState.fridaThreads;
    },
    /* The core's pthread key and how it was retired at uninstall (null: not yet). */
    threadKey() {
      return { key: mallocState.tlsKey, retired: mallocState.keyRetired };
    },
    /* Calls the target's malloc/free from the agent's own thread (tests: they must not count);
     * keep: the blocks are held (the agent's own heap, which calibration must take out). */
    mallocOnAgentThread(n, size, keep) {
      const m = new NativeFunction(familyAddress('malloc'), 'pointer', ['size_t']);
      const f = new NativeFunction(familyAddress('free'), 'void', ['pointer']);
      for (let i = 0; i < n; i++) {
        const p = m(size);
        if (keep)
          mallocState.kept.push(p);
        else
          f(p);
      }
      return { ignored: mallocState.agentThreadIgnored === true };
    },
    /* Drive the real logger callback with a synthetic libmalloc event (tests). */
    feedLogger(type, arg1, arg2, arg3, result) {
      const f = new NativeFunction(core.cm.mt_malloc_logger, 'void',
        ['uint32', 'uint64', 'uint64', 'uint64', 'uint64', 'uint32']);
      f(type, uint64(arg1), uint64(arg2), uint64(arg3), uint64(result), 0);
      return true;
    },
    /* memtrace doctor's self-test: n malloc(size)/free pairs through the allocator's own entry
     * (so through whatever memtrace hooked there), from one named C function (cmodule/selftest.c,
     * sent by the host) on a new thread of the target; returns that function's address so the
     * host can find it in the recorded stack. */
    selfTest(n, size, source) {
      selfTestModule = selfTestModule || new CModule(source, {
        malloc: familyAddress('malloc'), free: familyAddress('free'),
        pthread_create: Module.getGlobalExportByName('pthread_create'),
        pthread_join: Module.getGlobalExportByName('pthread_join'),
      });
      const run = new NativeFunction(selfTestModule.memtrace_doctor_run, 'int', ['int', 'uint64']);
      const rc = run(n, uint64(size));
      return { function: selfTestModule.memtrace_doctor_selftest.toString(), rc };
    },
  },
};
