/*
 * The CModule core (cmodule/core.c + a tracer's own C): per-thread slots, the stack table and
 * its definitions buffer, the live table, the per-stack aggregate rows, and in events mode the
 * per-thread rings.  The agent allocates every table (a CModule cannot have writable statics),
 * fills MtConfig and reads the counters; flush.js drains.
 *
 * The big tables are whole pages from the OS (Memory.alloc of a page multiple): zero, and only
 * the pages the core touches become resident, so sizing them for the worst case costs nothing
 * until it is used.
 */

import { AGG_COLD, AGG_HOT, AGG_SHIPPED_HOT, CONFIG, COUNTERS, DRAIN_INFO, FRAME_CACHE_BYTES, LIVE_ENTRY, LIVE_KEY_ADDRESS_BITS,
  LIVE_MIN_BUCKET_BITS, LIVE_MIN_BUCKET_BITS_DARWIN, LIVE_STACK_IDS_MAX, LIVE_WAYS, MAX_FRAMES, MAX_LANES,
  MAX_RINGS, N_COUNTERS, N_SITES, PSEUDO_STACKS, SITE, TOP_CHANGED_MAX, TOP_STACKS } from '../layout.js';
import { IS_DARWIN, NATIVE_PLATFORM, findExport, libcFunction } from './platform.js';
import { disarmStub, leakedStub, proc, withCompilerEnv } from './process.js';
import { writeField, writeStruct } from './structs.js';
import { unwindSymbols } from './unwind.js';
import { signalStopSymbols } from './world.js';

const SLOT_BYTES = 4096;          // per MtSlot (its unwind-rule cache is 2 KiB); mt_slot_size() must fit
const GLOBALS_BYTES = 65536;      // MtGlobals; mt_globals_size() must fit
const CORE_BYTES = 4096;          // MtCore; mt_core_size() must fit
const DEFAULT_LANES = 8;          // aggregate lanes: threads that get one of their own add without atomics

export const core = {
  tables: [],       // [{base, size}]: every table the agent mapped (calibration measures what is resident)
  cm: null,
  cfg: null,
  slowKinds: null,
  toolchainError: null,
  precompiled: false,       // the CModule came from the host's cached build
  precompiledAs: null,      // 'module' (its shared object, loaded as it is) or 'assembly' (gcc assembled it here)
  precompiledError: null,
  drainBuf: null,
  drainCap: 0,
  snapshotBuf: null,
  drainInfo: null,
  top: null,
  sites: null,
  aliasKinds: null,
  events: false,
  enabled: false,
  started: false,   // the hooks have been enabled at some point
  fns: {},
  owned: [],      // memtrace's own large tables {base, size}: never roots of a leak scan (agents/leaks.js)
  pagemapFd: null,  // /proc/self/pagemap for the final drain (openPagemap), -1 when none
  tlsKey: null,     // the core's pthread key until it is retired (retireThreadKey)
  keyStub: null,    // its destructor's leaked stub (null where none can be made)
};

function pow2(n) {
  let p = 1;
  while (p < n)
    p *= 2;
  return p;
}

/* A table as whole pages of its own: the OS hands them out zeroed and untouched, so nothing needs
 * clearing (and dirtying) before use, and the agent's resident footprint grows only as they are
 * used -- app extensions are jetsammed in the tens of MB. */
function rawPages(size, name, prefix = false, extent = null) {
  const ps = Process.pageSize;
  const bytes = Math.max(ps, Math.ceil(size / ps) * ps);
  const base = Memory.alloc(bytes);
  core.tables.push({ base, size: bytes, name, prefix, extent });
  return base;
}

/* A table sized by the stack budget (every stack id's rows, the stack index's generations): on Linux
 * address space reserved without committing swap for it (MAP_NORESERVE), so a budget of millions of
 * stacks costs nothing until stacks use it -- the rows are by dense id, so they fill page by page --
 * and no overcommit heuristic refuses the reservation.  Unmapped when the script goes away, as
 * Memory.alloc's pages are freed.  Elsewhere (Darwin: a jetsam-sized budget) rawPages.  `prefix`:
 * the table fills from its start (rows by dense id, the index's generations one after the other, the
 * threads' frame caches by slot), so calibration's count of its resident pages stops at the first
 * stretch with none (runtime/calibrate.js); `extent`: a function giving the bytes from its start that
 * may be resident at all (calibration counts no further). */
function budgetPages(size, name, prefix = false, extent = null) {
  const ps = Process.pageSize;
  const bytes = Math.max(ps, Math.ceil(size / ps) * ps);
  if (NATIVE_PLATFORM !== 'linux')
    return rawPages(bytes, name, prefix, extent);
  const mmap = libcFunction('mmap', 'pointer', ['pointer', 'size_t', 'int', 'int', 'int', 'int64']);
  const munmap = libcFunction('munmap', 'int', ['pointer', 'size_t']);
  if (mmap === null || munmap === null)
    return rawPages(bytes, name, prefix, extent);
  // PROT_READ | PROT_WRITE; MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE
  const base = mmap(NULL, bytes, 3, 0x02 | 0x20 | 0x4000, -1, 0);
  if (base.equals(ptr('-1')))
    throw new Error(`memtrace agent: cannot reserve ${bytes} bytes for the stack tables (a smaller --stack-table?)`);
  core.tables.push({ base, size: bytes, name, prefix, extent });
  Script.bindWeak(base, () => munmap(base, bytes));
  return base;
}

/* Bits of the highest address mapped now (the stack's, the shared cache's, a heap region's): blocks
 * come from below it -- new mappings are placed under the stack -- so the live table's keys must
 * name addresses up to it (core.c, mt_live_key).  0 when the ranges cannot be listed. */
function highestAddressBits() {
  let bits = 0;
  try {
    for (const r of Process.enumerateRanges('---'))
      bits = Math.max(bits, r.base.add(r.size - 1).toString(2).length);
  } catch (e) {
    return 0;
  }
  return bits;
}

/* Buckets (log2) a table needs for its keys to name every address below 2^bits, with one bit to
 * spare: a key names addresses below about 2^(LIVE_KEY_ADDRESS_BITS + buckets' bits).  A local macOS
 * target's heap sits near 2^47, where an iPhone app's stays below 2^40. */
function liveBucketBitsFor(bits) {
  return bits === 0 ? 0 : bits + 1 - LIVE_KEY_ADDRESS_BITS;
}

function sizeOf(cm, fn) {
  return Number(new NativeFunction(cm[fn], 'uint64', [])());
}

/* A function that is one `dmb ish`: libSystem's OSMemoryBarrier on Darwin (libsystem_platform,
 * exactly that), else one written here.  DEVICE-UNVERIFIED: arm64 is not run by the tests. */
function fullFence() {
  const exported = IS_DARWIN ? findExport('OSMemoryBarrier') : null;
  if (exported !== null)
    return exported;
  const code = Memory.alloc(Process.pageSize);
  Memory.patchCode(code, 8, (p) => {
    const w = new Arm64Writer(p, { pc: code });
    w.putInstruction(0xd5033bbf);     // dmb ish
    w.putRet();
    w.flush();
  });
  return code;
}

/* make() -- the core the host built, `as` 'module' or 'assembly' -- or null, the reason kept. */
function precompiledCore(as, make) {
  try {
    const cm = make();
    core.precompiled = true;
    core.precompiledAs = as;
    return cm;
  } catch (e) {
    core.precompiledError = String(e.message || e).split('\n')[0];
    return null;
  }
}

/* The bytes of the host's module file { file, length, sha256 } (FridaHost._core_module): throws
 * unless they are exactly those the host built. */
function hostModule(ref) {
  const bytes = File.readAllBytes(ref.file);
  if (bytes.byteLength !== ref.length || Checksum.compute('sha256', bytes) !== ref.sha256)
    throw new Error(`${ref.file}: not the module the host built`);
  return bytes;
}

/* Compiles `sources` (cmodule/ files, the generated layout header first) with the core's tables
 * as symbols, plus the tracer's extraSymbols.  config: the host's agent config. */
export function buildCore(config, sources, extraSymbols) {
  const defines = [];
  defines.push(IS_DARWIN ? '#define MT_DARWIN 1' : '#define MT_LINUX 1');
  if (Process.arch === 'arm64')
    defines.push('#define MT_ARM64 1');
  // Under seccomp the leak scan stops the world with the process CModule's signal (world.c
  // MT_WORLD_SIGSTOP): compiled in here too, over the one shared block.  Never otherwise, so the
  // precompiled and cached builds stay what they were.
  const sigstop = seccompFiltered() ? signalStopSymbols() : null;
  if (sigstop !== null)
    defines.push('#define MT_WORLD_SIGSTOP 1');
  const source = defines.join('\n') + '\n' + sources.join('\n');

  // Per-event rings only in events mode; the default ships aggregates and needs none.
  const events = !!config.events;
  const ringSize = pow2(config.ringKb * 1024);
  const nSlots = config.threadSlots;
  const nRings = events ? config.rings : 0;
  if (nRings > MAX_RINGS)
    throw new Error(`memtrace agent: at most ${MAX_RINGS} rings (asked for ${nRings})`);
  // A live-table entry holds a stack id in LIVE_STACK_BITS bits (layout.py): the table is bounded there.
  const stackSlots = Math.min(pow2(config.stackTable), LIVE_STACK_IDS_MAX);
  // At least 2^LIVE_MIN_BUCKET_BITS buckets, whatever was asked: a key names the address bits above
  // its bucket's in 32 bits (core.c, mt_live_key; layout.py).  Only the pages a heap touches are resident.
  const minBucketBits = Math.max(IS_DARWIN ? LIVE_MIN_BUCKET_BITS_DARWIN : LIVE_MIN_BUCKET_BITS,
    liveBucketBitsFor(highestAddressBits()));
  const liveBuckets = pow2(Math.max(2 ** minBucketBits, Math.ceil(config.liveTable / LIVE_WAYS)));
  const lanes = Math.min(MAX_LANES, pow2(config.aggLanes || DEFAULT_LANES));
  const rows = stackSlots + PSEUDO_STACKS.length;
  // Stack definitions waiting for the drain (100 ms): a burst of new stacks past it loses theirs
  // (dropped_stacks), so the complete capture's default is large; only what is used is resident.
  const DEFS_BYTES = pow2((config.defsKb || 1024) * 1024);

  const cfg = Memory.alloc(CONFIG.size);
  core.tables = [];
  const globals = rawPages(GLOBALS_BYTES, 'globals');
  const coreState = rawPages(CORE_BYTES, 'core');
  const slots = rawPages((nSlots + 1) * SLOT_BYTES, 'slots');   // + the shared slot of threads past nSlots
  const rings = rawPages(nRings * ringSize, 'rings');
  // The stack index's generations (core.c, mt_intern): (hash, id) pairs, from 4096 up to twice as
  // many as stack ids, 4 * stackSlots pairs in all; only the generations reached are written.
  const stackTable = budgetPages(4 * stackSlots * 16, 'stack_index', true);
  const defs = rawPages(DEFS_BYTES, 'defs');
  // Each bucket: LIVE_WAYS entries of LIVE_ENTRY.size bytes, two cache lines at most (core.c).
  const liveTable = budgetPages(liveBuckets * LIVE_WAYS * LIVE_ENTRY.size, 'live_table');
  const liveLocks = budgetPages(liveBuckets * 4, 'live_locks');
  // A byte a bucket: it once sent a block to an alternate (core.c, mt_live_spill).
  const liveSpill = budgetPages(liveBuckets, 'live_spill');
  const agg = budgetPages(rows * lanes * AGG_HOT * 8, 'agg', true);
  // The rows' cold fields (a full table, sampling, failed calls), written only for rows that have them;
  // calibration counts their resident pages only in the lanes that may hold any (drain.c,
  // mt_cold_lanes): a mincore over gigabytes never written was milliseconds of every target's exit.
  let coldLanesFn = null;
  const coldLanes = () => {
    if (coldLanesFn === null && core.cm && core.cm.mt_cold_lanes)
      coldLanesFn = new NativeFunction(core.cm.mt_cold_lanes, 'uint64', []);
    return coldLanesFn === null ? lanes : Number(coldLanesFn());
  };
  const aggCold = budgetPages(rows * lanes * AGG_COLD * 8, 'agg_cold', false, () => coldLanes() * rows * AGG_COLD * 8);
  const aggColdRows = budgetPages(rows, 'agg_cold_rows', false, () => (coldLanes() !== 0 ? rows : 0));
  const aggDirty = budgetPages(rows, 'agg_dirty', true);
  const aggShipped = budgetPages(rows * AGG_SHIPPED_HOT * 8, 'agg_shipped', true);
  const aggShippedCold = budgetPages(rows * AGG_COLD * 8, 'agg_shipped_cold', false,
    () => (coldLanes() !== 0 ? rows * AGG_COLD * 8 : 0));
  const aggLive = budgetPages(rows * 8, 'agg_live', true);
  const drainInfo = Memory.alloc(DRAIN_INFO.size);
  const top = Memory.alloc(2 * TOP_STACKS * 8);
  // drain.c's rows changed since the last top: a count (first "unknown": more than it holds), then
  // up to TOP_CHANGED_MAX rows.
  const topChanged = Memory.alloc((1 + TOP_CHANGED_MAX) * 8);
  topChanged.writeU64(TOP_CHANGED_MAX + 1);
  const sites = Memory.alloc(N_SITES * SITE.size);
  const slowKinds = Memory.alloc(8);
  const aliasKinds = Memory.alloc(8);
  const tlsOffset = Memory.alloc(8);

  const symbols = Object.assign({
    mt_config: cfg,
    mt_globals: globals,
    mt_core: coreState,
    mt_slots: slots,
    mt_ring_pool: rings,
    mt_stack_table: stackTable,
    mt_defs: defs,
    mt_live_table: liveTable,
    mt_live_locks: liveLocks,
    mt_live_spill: liveSpill,
    mt_agg: agg,
    mt_agg_cold: aggCold,
    mt_agg_cold_rows: aggColdRows,
    mt_agg_shipped_cold: aggShippedCold,
    mt_agg_dirty: aggDirty,
    mt_agg_shipped: aggShipped,
    mt_agg_live: aggLive,
    mt_drain_info: drainInfo,
    mt_top: top,
    mt_top_changed: topChanged,
    mt_sites: sites,
    mt_slow_kinds: slowKinds,
    mt_alias_kinds: aliasKinds,
    mt_tls_offset: tlsOffset,
    pthread_getspecific: findExport('pthread_getspecific'),
    pthread_setspecific: findExport('pthread_setspecific'),
    pthread_self: findExport('pthread_self'),
    sched_yield: findExport('sched_yield'),
  }, unwindSymbols(), extraSymbols, sigstop === null ? {} : sigstop);
  if (Process.arch === 'arm64')
    symbols.mt_full_fence = fullFence();      // core.c's mt_barrier under TinyCC
  if (!IS_DARWIN && Process.arch === 'x64') {
    // unwind.c's frame caches, one per slot, resident only as threads walk (MEMTRACE_FRAME_CACHE=off: none).
    const on = config.frameCache !== false;
    symbols.mt_frame_caches = on ? budgetPages((nSlots + 1) * FRAME_CACHE_BYTES, 'frame_caches', true) : rawPages(8, 'frame_caches');
    symbols.mt_frame_cache_on = Memory.alloc(8).writeU64(on ? 1 : 0);
  }
  symbols.mt_usable_size = usableSizeCell();
  if (IS_DARWIN) {
    symbols.pthread_get_stackaddr_np = findExport('pthread_get_stackaddr_np');
    symbols.pthread_get_stacksize_np = findExport('pthread_get_stacksize_np');
    symbols.pthread_mach_thread_np = findExport('pthread_mach_thread_np');
  } else {
    symbols.pthread_getattr_np = findExport('pthread_getattr_np');
    symbols.mt_main_stack = mainStack();
    symbols.mt_main_arena = mainArenaCell();
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
  // The external toolchain runs the compiler from inside the target (a fork/spawn of the
  // target): never under a seccomp filter, which may kill the process for a non-thread clone,
  // and never while children are followed: the compiler would be a child held and followed in
  // turn, its agent compiling with a compiler of its own, and so on without end (seen with
  // toolchain 'external' asked for).  TinyCC compiles in the process; children are traced from
  // their first instruction with it (tests/integration/test_peer_suite.py).
  const wantExternal = !config.followChildren && (config.toolchain === 'external' ||
      (config.toolchain === 'auto' && NATIVE_PLATFORM === 'linux' && !seccompFiltered()));
  // The module itself, built by the host as Frida's gcc toolchain would build it here
  // (agentbuild.precompiled_module): loaded from its bytes, so no compiler runs from the target
  // (no fork, no shell, no gcc) -- hence also for a followed child, which compiled with TinyCC
  // only because a compiler would be a child to follow.  Not with the signal stop compiled in
  // (the host built the source without it).  Only the exact bytes the host built (a process in
  // another mount namespace may see another file at that path); anything else goes on below.
  const useModule = !!config.cmoduleModule && sigstop === null &&
      (config.toolchain === 'external' || config.toolchain === 'auto') && NATIVE_PLATFORM === 'linux';
  if (useModule)
    cm = precompiledCore('module', () => new CModule(hostModule(config.cmoduleModule), symbols));
  if (!cm && config.followChildren && config.toolchain === 'external')
    core.toolchainError = 'not with --follow-children: the compiler would be a followed child';
  if (wantExternal && !cm && config.cmoduleAsm) {
    // The same source compiled to assembly by the host once (agentbuild.precompiled_cmodule): gcc
    // only assembles it.  Any failure falls back to compiling the C below.  gcc runs as the C
    // compile's does: with the program's environment, not held (withCompilerEnv).
    cm = precompiledCore('assembly', () => withCompilerEnv(config, () => new CModule(
      defines.join('\n') + '\n' + config.cmoduleAsm, symbols, { toolchain: 'external' })));
  }
  if (cm)
    toolchain = 'external';
  if (wantExternal && !cm) {
    try {
      cm = withCompilerEnv(config, () => new CModule(source, symbols, { toolchain: 'external' }));
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
  if (sizeOf(cm, 'mt_core_size') > CORE_BYTES)
    throw new Error('memtrace agent: MtCore grew past its allocation');
  if (sizeOf(cm, 'mt_config_size') !== CONFIG.size)
    throw new Error('memtrace agent: MtConfig in C and layout.js disagree');

  const key = createThreadKey(cm);
  const tlsDirect = (NATIVE_PLATFORM === 'linux' && Process.arch === 'x64' && toolchain === 'external')
    ? findTlsOffset(key) : 0;
  tlsOffset.writeU64(tlsDirect);

  // Blocks smaller than this are only counted (0 while sampling: any block may be sampled).
  const trackMin = config.sampleBytes ? 0 : Math.min(config.liveThreshold, config.stackThreshold);
  writeStruct(cfg, CONFIG, {
    live_threshold: config.liveThreshold,
    stack_threshold: config.stackThreshold,
    max_frames: Math.min(config.frames, MAX_FRAMES - 1),   // room for the truncation mark
    sample_interval: config.sampleBytes || 0,
    ring_size: ringSize,
    n_slots: nSlots,
    n_rings: nRings,
    stack_mask: stackSlots - 1,
    live_mask: liveBuckets - 1,
    live_bits: Math.round(Math.log2(liveBuckets)),
    code_mask: (IS_DARWIN && Process.arch === 'arm64') ? uint64('0x7fffffffff') : uint64('0xffffffffffffffff'),
    tls_key: key,
    gettid_nr: Process.arch === 'arm64' ? 178 : 186,   // SYS_gettid
    enabled: 0,
    agg_lanes: lanes,
    events: events ? 1 : 0,
    defs_size: DEFS_BYTES,
    track_min: trackMin,
    // glibc keeps each block's chunk size in the word before it: a free can tell an untracked block
    // without looking it up.  Elsewhere 0 turns the shortcut off.
    chunk_min: (!IS_DARWIN && findExport('gnu_get_libc_version') !== null) ? trackMin : 0,
  });

  // Every table is fresh OS pages (rawPages): already zero, so mt_reset (which would touch them
  // all, ~10 MiB at the default sizes) is not called.

  core.cm = cm;
  core.cfg = cfg;
  core.slowKinds = slowKinds;
  core.aliasKinds = aliasKinds;
  core.events = events;
  // The definitions buffer always fits in one drain, with room for rings and rows after it.
  core.drainCap = Math.max(4 * 1024 * 1024, 2 * DEFS_BYTES + (events ? ringSize * 4 : 0));
  core.drainBuf = Memory.alloc(core.drainCap);
  core.snapshotBuf = Memory.alloc(N_COUNTERS * 8);
  core.drainInfo = drainInfo;
  core.top = top;
  core.sites = sites;
  // Every table (slots and the live table hold block addresses) and the drain buffer (LIVE records).
  core.owned = [...core.tables, { base: core.drainBuf, size: core.drainCap }];
  core.fns = {
    // Exclusive: the script's lock held through the call, so that no other thread's flush (an exec's,
    // a crash's) runs a second mt_drain at once over the one drain buffer and the drain's own state.
    drain: new NativeFunction(cm.mt_drain, 'uint64', ['pointer', 'uint64', 'uint64'], { scheduling: 'exclusive' }),
    snapshot: new NativeFunction(cm.mt_snapshot, 'void', ['pointer']),
    lost: new NativeFunction(cm.mt_lost_calls, 'uint64', []),
    live: new NativeFunction(cm.mt_live_count, 'uint64', []),
    stacks: new NativeFunction(cm.mt_stacks_interned, 'uint64', []),
    monotonicUs: new NativeFunction(cm.mt_monotonic_us, 'uint64', []),
    sitesUsed: new NativeFunction(cm.mt_sites_used, 'uint64', []),
    pagemap: new NativeFunction(cm.mt_live_pagemap, 'void', ['uint64', 'uint64']),
    peakMark: new NativeFunction(cm.mt_peak_mark, 'void', []),
  };
  const busy = new NativeFunction(cm.mt_busy_slots, 'uint64', []);
  proc.busyProbe = () => Number(busy());
  return {
    // frames[0] is the hooked call's own caller even for entries behind a Frida trampoline
    // (track.c, mt_call_stack): the host keeps a first frame in no module as it is.
    callerFrame: 'exact',
    toolchain,
    toolchainError: core.toolchainError,
    precompiled: core.precompiled,
    precompiledAs: core.precompiledAs,
    precompiledError: core.precompiledError,
    tlsDirectOffset: tlsDirect,
    tlsKey: key,
    mode: events ? 'events' : 'aggregate',
    ringSize: events ? ringSize : 0,
    threadSlots: nSlots,
    rings: nRings,
    stackTable: stackSlots,
    aggLanes: lanes,
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
  // The peak is placed in time by the agent's looks at it (cmodule/drain.c, mt_place_peak): one as
  // the hooks go in opens the first interval, one as they go out closes the last.
  if (core.fns.peakMark)
    core.fns.peakMark();
  core.enabled = on;
  if (on)
    core.started = true;
}

/* One mt_drain call: the bytes written and what the core holds now (MtDrainInfo).  Every value
 * is exact (exactU64: a Number up to 2^53, its decimal string past it); `raw` keeps the BigInts
 * for arithmetic.  `final`: the hooks are out; ship the peak's composition and the live table. */
export function drainOnce(final) {
  if (final && core.pagemapFd === null)
    core.pagemapFd = openPagemap();
  const n = Number(core.fns.drain(core.drainBuf, core.drainCap, final ? 1 : 0));
  // Every field of MtDrainInfo is a u64 (layout.py): one view over the struct, read as BigInts,
  // where a UInt64 object per field (and per top entry, and per counter) was most of the drain's
  // JavaScript.
  const words = keptView(core.drainInfo, DRAIN_INFO.size / 8);
  const raw = {};
  const info = { raw };
  for (const [k, word] of DRAIN_FIELDS) {
    raw[k] = words[word];
    info[k] = exactBig(raw[k]);
  }
  if (info.live_done && core.pagemapFd !== null && core.pagemapFd >= 0) {
    core.fns.pagemap(0, 0);
    const close = libcFunction('close', 'int', ['int']);
    if (close !== null)
      close(core.pagemapFd);
    core.pagemapFd = -1;
  }
  info.top = [];
  const top = keptView(core.top, 2 * TOP_STACKS);
  const nTop = Math.min(TOP_STACKS, Number(raw.n_top));
  for (let i = 0; i < nTop; i++)
    info.top.push([exactBig(top[2 * i]), exactBig(top[2 * i + 1])]);
  return { n, info };
}

/* Linux: /proc/self/pagemap open for the final drain's walk of the live table (drain.c,
 * mt_live_bucket_untouched: buckets on pages never written are not read); -1 elsewhere or when it
 * cannot be opened (every bucket is read). */
function openPagemap() {
  if (NATIVE_PLATFORM !== 'linux')
    return -1;
  const open = libcFunction('open', 'int', ['pointer', 'int']);
  if (open === null)
    return -1;
  const fd = open(Memory.allocUtf8String('/proc/self/pagemap'), 0);
  if (fd >= 0)
    core.fns.pagemap(fd + 1, Process.pageSize);
  return fd;
}

/* n u64 words of native memory as a BigUint64Array over that memory (no copy: read it before the
 * memory changes). */
function u64View(p, n) {
  return new BigUint64Array(ArrayBuffer.wrap(p, n * 8));
}

/* u64View of a buffer the agent keeps for its life (the drain's info, the top stacks, the counters'
 * snapshot), made once: every drain read each through a new one. */
const keptViews = new Map();

function keptView(p, n) {
  let v = keptViews.get(p);
  if (v === undefined || v.length !== n) {
    v = u64View(p, n);
    keptViews.set(p, v);
  }
  return v;
}

/* MtDrainInfo's fields as (name, u64 index), in order. */
const DRAIN_FIELDS = Object.entries(DRAIN_INFO.fields).map(([k, [offset]]) => [k, offset / 8]);

/* exactU64 of a BigInt. */
const MAX_EXACT_BIG = BigInt(Number.MAX_SAFE_INTEGER);

export function exactBig(v) {
  return v > MAX_EXACT_BIG ? v.toString() : Number(v);
}

/* track.c's mt_usable_size: a cell holding the allocator's usable-size function (glibc's
 * malloc_usable_size, Darwin's malloc_size), or NULL -- how big the blocks memtrace's own thread
 * allocates are, so calibration can take them out of the allocator's in-use figures. */
let usableSize = null;

function usableSizeCell() {
  if (usableSize === null) {
    usableSize = Memory.alloc(Process.pointerSize);
    const f = findExport(IS_DARWIN ? 'malloc_size' : 'malloc_usable_size');
    usableSize.writePointer(f === null ? NULL : f);
  }
  return usableSize;
}

/* The bytes memtrace's own thread holds now (allocated less freed, usable sizes). */
export function ownBytes() {
  if (core.cm === null)
    return null;
  const c = readCounters();
  const held = uint64(c[COUNTERS.own_bytes].toString());
  const freed = uint64(c[COUNTERS.own_freed_bytes].toString());
  // Freed can pass held (blocks from before the counting began): that difference is small.
  return held.compare(freed) >= 0 ? exactU64(held.sub(freed)) : -freed.sub(held).toNumber();
}

/* A seccomp filter on this process (/proc/self/status "Seccomp: 2"): spawning anything from here
 * could get it killed with SIGSYS. */
function seccompFiltered() {
  try {
    const line = File.readAllText('/proc/self/status').split('\n').find(l => l.startsWith('Seccomp:'));
    return line !== undefined && line.split(/\s+/)[1] === '2';
  } catch (e) {
    return false;
  }
}

/* The main thread's stack as core.c's mt_main_stack: [lo, hi) and the main thread's id.  hi is the
 * top of the [stack] mapping; lo leaves it room to grow to 8 MiB (the usual RLIMIT_STACK), as
 * glibc's pthread_getattr_np reports it.  Zeros when the maps cannot be read (then the core asks
 * pthread_getattr_np, as for every other thread). */
const MAIN_STACK_ROOM = 8 * 1024 * 1024;
let mainStackCell = null;

/* Writes the main thread's [lo, hi) and id at `cell` (three u64); leaves them as they are (zeros)
 * when the maps cannot be read.  Also purgeable.c's frame walk's bounds (agents/purgeable.js). */
export function writeMainStack(cell) {
  try {
    const line = File.readAllText('/proc/self/maps').split('\n').find(l => l.endsWith('[stack]'));
    if (line !== undefined) {
      const [lo, hi] = line.split(' ')[0].split('-').map(h => uint64('0x' + h));
      const room = hi.sub(MAIN_STACK_ROOM);
      cell.writeU64(lo.compare(room) < 0 ? lo : room);
      cell.add(8).writeU64(hi);
      cell.add(16).writeU64(Process.id);
    }
  } catch (e) {
    // zeros: the core falls back to pthread_getattr_np
  }
}

function mainStack() {
  if (mainStackCell === null) {
    mainStackCell = Memory.alloc(3 * 8);
    writeMainStack(mainStackCell);
  }
  return mainStackCell;
}

/* glibc's main arena, for the program's main thread (core.c, mt_adopt_main_arena): a cell of two
 * u64, the main arena's address and where the C library keeps a thread's arena pointer (its offset
 * from pthread_self(), the same in every thread: initial-exec TLS), or zeros wherever either is not
 * found for certain (not glibc, not 64-bit, glibc before 2.27, a layout that does not check out).
 * Why: the thread that loaded the agent made the process's first malloc call, so glibc gave it the
 * main arena, and it ended (a raw clone, no pthread exit) without putting the arena back; the main
 * thread's own first call then got an arena of its own -- an mmap'd heap grown a page at a time by
 * mprotect, which the program never has without memtrace. */
const ARENA_NEXT = 2160;                 // offsetof(struct malloc_state, next): glibc >= 2.27 (have_fastchunks), LP64
const ARENA_HEAP_MAX = 64 * 1024 * 1024; // a non-main arena's heaps are aligned to this (HEAP_MAX_SIZE)
const NON_MAIN_ARENA = 4;                // the chunk size's bit: the block is not the main arena's
const PT_LOAD = 1;
const PT_TLS = 7;

function mainArenaCell() {
  const cell = Memory.alloc(16);
  try {
    const found = findMainArena();
    if (found !== null) {
      cell.writePointer(found.arena);
      cell.add(8).writePointer(found.offset);
    }
  } catch (e) {
    // zeros: the main thread gets whatever arena glibc gives it
  }
  return cell;
}

function findMainArena() {
  if (IS_DARWIN || Process.pointerSize !== 8)
    return null;
  const versionFn = findExport('gnu_get_libc_version');
  if (versionFn === null)
    return null;
  const [major, minor] = new NativeFunction(versionFn, 'pointer', [])().readCString().split('.').map(Number);
  if (!(major > 2 || (major === 2 && minor >= 27)))
    return null;
  const libc = Process.findModuleByAddress(versionFn);
  const malloc = libcFunction('malloc', 'pointer', ['size_t']);
  const free = libcFunction('free', 'void', ['pointer']);
  const self = libcFunction('pthread_self', 'pointer', []);
  const iterate = libcFunction('dl_iterate_phdr', 'int', ['pointer', 'pointer']);
  if (libc === null || malloc === null || free === null || self === null || iterate === null)
    return null;
  const inLibc = a => a.compare(libc.base) >= 0 && a.compare(libc.base.add(libc.size)) < 0;

  // This thread's arena, by one of its blocks: a non-main arena's block says so in its size word,
  // and its heap starts with the arena's address (heap_info.ar_ptr).
  const block = malloc(64);
  if (block.isNull())
    return null;
  const nonMain = (block.sub(8).readU64().toNumber() & NON_MAIN_ARENA) !== 0;
  const heapArena = nonMain ? block.and(ptr(ARENA_HEAP_MAX - 1).not()).readPointer() : null;
  free(block);

  // The C library's TLS block as this thread has it (dl_iterate_phdr's dlpi_tls_data, PT_TLS's size).
  let tls = null;
  const visit = new NativeCallback((info, size) => {
    if (size < 64)
      return 0;
    const bias = info.readPointer();
    const phdrs = info.add(16).readPointer();
    const n = info.add(24).readU16();
    let mine = false;
    let tlsSize = 0;
    for (let i = 0; i !== n; i++) {
      const ph = phdrs.add(i * 56);
      const type = ph.readU32();
      const start = bias.add(ph.add(16).readPointer());
      if (type === PT_LOAD && versionFn.compare(start) >= 0 && versionFn.compare(start.add(ph.add(40).readPointer())) < 0)
        mine = true;
      if (type === PT_TLS)
        tlsSize = ph.add(40).readU64().toNumber();
    }
    if (!mine)
      return 0;
    tls = { data: info.add(56).readPointer(), size: tlsSize };
    return 1;
  }, 'int', ['pointer', 'size_t', 'pointer']);
  iterate(visit, NULL);
  if (tls === null || tls.data.isNull() || tls.size === 0 || tls.size > 4096)
    return null;

  // The main arena: the one arena of the ring (malloc_state.next) inside the C library's image.
  const ringMain = start => {
    let main = null;
    let a = start;
    for (let hops = 0; hops !== 1024; hops++) {
      if (inLibc(a)) {
        if (main !== null)
          return null;
        main = a;
      } else if (!a.and(15).isNull()) {
        return null;
      }
      a = a.add(ARENA_NEXT).readPointer();
      if (a.equals(start))
        return main;
      if (a.isNull() || Process.findRangeByAddress(a) === null)
        return null;
    }
    return null;
  };
  const hits = [];
  for (let off = 0; off + 8 <= tls.size; off += 8) {
    const word = tls.data.add(off);
    const v = word.readPointer();
    if (v.isNull() || !v.and(7).isNull() || Process.findRangeByAddress(v) === null)
      continue;
    if (nonMain ? !v.equals(heapArena) : !inLibc(v))
      continue;
    let main = null;
    try {
      main = ringMain(v);
    } catch (e) {
      main = null;
    }
    if (main !== null && (nonMain || main.equals(v)))
      hits.push({ arena: main, offset: word.sub(self()) });   // wraps below zero: the core adds it back
  }
  if (hits.length !== 1)
    return null;
  return hits[0];
}

/* A 64-bit value never passes through a Number: one past 2^53 goes as its decimal string (the
 * host makes it an int, capture_loop.py), one up to it as the Number it is exactly.  Takes an
 * UInt64, or what exactU64 gave (a Number or such a string). */
const MAX_EXACT = uint64(Number.MAX_SAFE_INTEGER.toString());

export function exactU64(v) {
  const u = v instanceof UInt64 ? v : uint64(v.toString());
  return u.compare(MAX_EXACT) > 0 ? u.toString() : u.toNumber();
}

/* The counters of every thread, live and retired, summed by the C side, each exactU64. */
export function readCounters() {
  core.fns.snapshot(core.snapshotBuf);
  return Array.from(keptView(core.snapshotBuf, N_COUNTERS), exactBig);
}

/* ---- the core's pthread key: one life for every way a session ends -----------------------
 *
 * The key's value on each thread is that thread's MtSlot, and its destructor (mt_thread_exit)
 * marks the slot dead.  Two things outlive the agent: the C library keeps the destructor for as
 * long as the key exists, and the threads keep their values at the key's index (the core reads
 * its value straight from the thread, with no check that the value is its own).  So:
 *   - the destructor is handed over as a stub in a page that is never freed (process.js);
 *   - retireThreadKey -- at the end of the window (the tracer's uninstall) and again on every way
 *     out (rpc.js dispose: process exit, our detach, the host gone) -- turns the stub into a bare
 *     return and KEEPS the key: a thread exiting at any time later, even one that had already
 *     read the destructor when we retired it, only returns, and no later session's key (a
 *     re-attach) can be given this index with our stale slot pointers in it.  One key per session
 *     is the cost (glibc has 1024, Darwin 512).
 *   - Where no stub can be made (Darwin: no page of our own code may be left behind; other
 *     architectures), the key is deleted, so the C library calls the destructor no more, and its
 *     index is taken for good by a key without a destructor (a placeholder), for the same reason.
 *     DEVICE-UNVERIFIED on Darwin: a thread already inside its exit's destructor loop when the key
 *     is deleted after the host went away may still call freed code.
 */
function createThreadKey(cm) {
  const destructor = leakedStub(cm.mt_thread_exit);
  const keyBuf = Memory.alloc(8);
  const keyCreate = libcFunction('pthread_key_create', 'int', ['pointer', 'pointer']);
  if (keyCreate(keyBuf, destructor) !== 0)
    throw new Error('memtrace agent: pthread_key_create failed');
  core.tlsKey = keyBuf.readU32();
  core.keyStub = destructor.equals(cm.mt_thread_exit) ? null : destructor;
  return core.tlsKey;
}

/* Idempotent; returns how the key ended ('kept', 'replaced', 'deleted' or null: nothing to do). */
export function retireThreadKey() {
  if (core.tlsKey === null)
    return null;
  const key = core.tlsKey;
  core.tlsKey = null;
  if (core.keyStub !== null) {
    disarmStub(core.keyStub);
    return 'kept';
  }
  return replaceThreadKey(key);
}

const PLACEHOLDER_TRIES = 8;

/* Deletes `key` and takes its index with a destructor-less key.  pthread_key_create hands out the
 * lowest free index, which need not be ours: placeholders are made until one lands on it (bounded),
 * and the ones that landed elsewhere are freed again (never used: no values behind them). */
function replaceThreadKey(key) {
  const del = libcFunction('pthread_key_delete', 'int', ['uint']);
  const create = libcFunction('pthread_key_create', 'int', ['pointer', 'pointer']);
  if (del === null || create === null || del(key) !== 0)
    return null;
  const buf = Memory.alloc(8);
  const strays = [];
  let landed = false;
  for (let i = 0; i < PLACEHOLDER_TRIES && !landed; i++) {
    if (create(buf, NULL) !== 0)
      break;
    const got = buf.readU32();
    if (got === key)
      landed = true;
    else
      strays.push(got);
  }
  for (const k of strays)
    del(k);
  return landed ? 'replaced' : 'deleted';
}
