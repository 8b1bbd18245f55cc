/*
 * The CModule core (cmodule/core.c + a tracer's own C): per-thread slots and rings, the stack
 * table, the live table.  The agent allocates every table (a CModule cannot have writable
 * statics), fills MtConfig and reads the counters; flush.js drains the records.
 */

import { CONFIG, LIVE_WAYS, MAX_FRAMES, MAX_RINGS, N_COUNTERS } from '../layout.js';
import { IS_DARWIN, NATIVE_PLATFORM, findExport, libcFunction } from './platform.js';
import { leakedStub, proc } from './process.js';
import { writeField, writeStruct } from './structs.js';

const SLOT_BYTES = 1024;          // per MtSlot; mt_slot_size() must fit
const GLOBALS_BYTES = 65536;      // MtGlobals; mt_globals_size() must fit

export const core = {
  cm: null,
  cfg: null,
  slowKinds: null,
  toolchainError: null,
  drainBuf: null,
  drainCap: 0,
  snapshotBuf: null,
  fns: {},
  tlsKey: null,
};

function pow2(n) {
  let p = 1;
  while (p < n)
    p *= 2;
  return p;
}

function sizeOf(cm, fn) {
  return Number(new NativeFunction(cm[fn], 'uint64', [])());
}

/* Compiles `sources` (cmodule/ files, the generated layout header first) with the core's tables
 * as symbols, plus the tracer's extraSymbols.  config: the host's agent config. */
export function buildCore(config, sources, extraSymbols) {
  const defines = [];
  defines.push(IS_DARWIN ? '#define MT_DARWIN 1' : '#define MT_LINUX 1');
  if (Process.arch === 'arm64')
    defines.push('#define MT_ARM64 1');
  const source = defines.join('\n') + '\n' + sources.join('\n');

  const ringSize = pow2(config.ringKb * 1024);
  const nSlots = config.threadSlots;
  const nRings = config.rings;
  if (nRings > MAX_RINGS)
    throw new Error(`memtrace agent: at most ${MAX_RINGS} rings (asked for ${nRings})`);
  const stackSlots = pow2(config.stackTable);
  const liveBuckets = pow2(Math.max(1024, Math.ceil(config.liveTable / LIVE_WAYS)));

  const cfg = Memory.alloc(CONFIG.size);
  const globals = Memory.alloc(GLOBALS_BYTES);
  const slots = Memory.alloc(nSlots * SLOT_BYTES);
  const rings = Memory.alloc(nRings * ringSize);
  const stackTable = Memory.alloc(stackSlots * 8);
  const liveTable = Memory.alloc(liveBuckets * LIVE_WAYS * 8);
  const liveOcc = Memory.alloc(liveBuckets * 4);
  const liveLocks = Memory.alloc(liveBuckets * 4);
  const slowKinds = Memory.alloc(8);
  const tlsOffset = Memory.alloc(8);

  const symbols = Object.assign({
    mt_config: cfg,
    mt_globals: globals,
    mt_slots: slots,
    mt_ring_pool: rings,
    mt_stack_table: stackTable,
    mt_live_table: liveTable,
    mt_live_occupancy: liveOcc,
    mt_live_locks: liveLocks,
    mt_slow_kinds: slowKinds,
    mt_tls_offset: tlsOffset,
    pthread_getspecific: findExport('pthread_getspecific'),
    pthread_setspecific: findExport('pthread_setspecific'),
    pthread_self: findExport('pthread_self'),
  }, extraSymbols);
  if (IS_DARWIN) {
    symbols.pthread_get_stackaddr_np = findExport('pthread_get_stackaddr_np');
    symbols.pthread_get_stacksize_np = findExport('pthread_get_stacksize_np');
    symbols.pthread_threadid_np = findExport('pthread_threadid_np');
  } else {
    symbols.pthread_getattr_np = findExport('pthread_getattr_np');
    symbols.pthread_attr_getstack = findExport('pthread_attr_getstack');
    symbols.pthread_attr_destroy = findExport('pthread_attr_destroy');
    symbols.syscall = findExport('syscall');
  }
  for (const [k, v] of Object.entries(symbols)) {
    if (v === null)
      throw new Error(`memtrace agent: required symbol ${k} not found in the target`);
  }

  let cm;
  let toolchain = 'internal';
  const wantExternal = config.toolchain === 'external' ||
      (config.toolchain === 'auto' && NATIVE_PLATFORM === 'linux');
  if (wantExternal) {
    try {
      cm = new CModule(source, symbols, { toolchain: 'external' });
      toolchain = 'external';
    } catch (e) {
      if (config.toolchain === 'external')
        throw e;
      core.toolchainError = String(e.message || e).split('\n')[0];
      cm = null;
    }
  }
  if (!cm)
    cm = new CModule(source, symbols);

  if (sizeOf(cm, 'mt_slot_size') > SLOT_BYTES)
    throw new Error('memtrace agent: MtSlot grew past its allocation');
  if (sizeOf(cm, 'mt_globals_size') > GLOBALS_BYTES)
    throw new Error('memtrace agent: MtGlobals grew past its allocation');
  if (sizeOf(cm, 'mt_config_size') !== CONFIG.size)
    throw new Error('memtrace agent: MtConfig in C and layout.js disagree');

  // The destructor outlives us in the C library's key table: it is handed over as a stub in
  // leaked memory that returns at once after teardown (process.js), and the key is deleted
  // at teardown too (releaseCore).
  const keyBuf = Memory.alloc(8);
  const keyCreate = libcFunction('pthread_key_create', 'int', ['pointer', 'pointer']);
  if (keyCreate(keyBuf, leakedStub(cm.mt_thread_exit)) !== 0)
    throw new Error('memtrace agent: pthread_key_create failed');
  const key = keyBuf.readU32();
  core.tlsKey = key;
  const tlsDirect = (NATIVE_PLATFORM === 'linux' && Process.arch === 'x64' && toolchain === 'external')
    ? findTlsOffset(key) : 0;
  tlsOffset.writeU64(tlsDirect);

  writeStruct(cfg, CONFIG, {
    live_threshold: config.liveThreshold,
    stack_threshold: config.stackThreshold,
    max_frames: Math.min(config.frames, MAX_FRAMES),
    sample_interval: config.sampleBytes || 0,
    ring_size: ringSize,
    n_slots: nSlots,
    n_rings: nRings,
    stack_mask: stackSlots - 1,
    live_mask: liveBuckets - 1,
    code_mask: (IS_DARWIN && Process.arch === 'arm64') ? uint64('0x7fffffffff') : uint64('0xffffffffffffffff'),
    tls_key: key,
    gettid_nr: Process.arch === 'arm64' ? 178 : 186,   // SYS_gettid
    enabled: 0,
  });

  new NativeFunction(cm.mt_reset, 'void', [])();

  core.cm = cm;
  core.cfg = cfg;
  core.slowKinds = slowKinds;
  core.drainCap = Math.max(4 * 1024 * 1024, ringSize * 4);
  core.drainBuf = Memory.alloc(core.drainCap);
  core.snapshotBuf = Memory.alloc(N_COUNTERS * 8);
  core.fns = {
    drain: new NativeFunction(cm.mt_drain, 'uint64', ['pointer', 'uint64']),
    snapshot: new NativeFunction(cm.mt_snapshot, 'void', ['pointer']),
    lost: new NativeFunction(cm.mt_lost_calls, 'uint64', []),
    live: new NativeFunction(cm.mt_live_count, 'uint64', []),
    stacks: new NativeFunction(cm.mt_stacks_interned, 'uint64', []),
  };
  const busy = new NativeFunction(cm.mt_busy_slots, 'uint64', []);
  proc.busyProbe = () => Number(busy());
  return {
    toolchain,
    toolchainError: core.toolchainError,
    tlsDirectOffset: tlsDirect,
    tlsKey: key,
    ringSize,
    threadSlots: nSlots,
    rings: nRings,
    stackTable: stackSlots,
    liveCapacity: liveBuckets * LIVE_WAYS,
  };
}

/* Where glibc keeps this thread's value for `key`, relative to the thread pointer (keys
 * below 32 live inline in struct pthread, the same offset for every thread).  Found by
 * planting two sentinels and checking both land at one offset; 0 when not found. */
function findTlsOffset(key) {
  if (key >= 32)
    return 0;
  const set = libcFunction('pthread_setspecific', 'int', ['uint', 'pointer']);
  const self = libcFunction('pthread_self', 'pointer', []);
  if (set === null || self === null)
    return 0;
  const base = self();
  const probe = sentinel => {
    set(key, ptr(sentinel));
    for (let off = 0; off < 4096; off += 8) {
      if (base.add(off).readPointer().equals(ptr(sentinel)))
        return off;
    }
    return -1;
  };
  try {
    const a = probe('0x6d656d7472616365');
    const b = probe('0x1d2c3b4a59687706');
    return (a > 0 && a === b) ? a : 0;
  } catch (e) {
    return 0;
  } finally {
    set(key, NULL);
  }
}

export function setEnabled(on) {
  if (core.cfg !== null)
    writeField(core.cfg, CONFIG, 'enabled', on ? 1 : 0);
}

/* The counters of every thread, live and retired, summed by the C side. */
export function readCounters() {
  core.fns.snapshot(core.snapshotBuf);
  const out = [];
  for (let i = 0; i < N_COUNTERS; i++)
    out.push(Number(core.snapshotBuf.add(i * 8).readU64()));
  return out;
}

/* Teardown (any path: window end, process exit, the host gone): the key is deleted so the C
 * library calls no destructor of ours again, whatever becomes of the stub. */
export function releaseCore() {
  if (core.tlsKey === null)
    return;
  const keyDelete = libcFunction('pthread_key_delete', 'int', ['uint']);
  if (keyDelete !== null)
    keyDelete(core.tlsKey);
  core.tlsKey = null;
}
