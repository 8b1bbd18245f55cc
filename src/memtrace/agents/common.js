'use strict';
/*
 * memtrace agent runtime, shared by every tracer.  The host concatenates this
 * file with one tracer file (agents/<kind>.js), which defines `tracer`:
 *   { name, symbols: [...], cSources: [...], install(ctx), uninstall(ctx),
 *     extraExports: {...} }
 *
 * Protocol (host <- agent), namespaced message types:
 *   agent:ready      {platform, arch, pid, pointerSize, ...}
 *   events:batch     {t, counters, lost, live, stacks} + binary records (cmodule/core.c layout)
 *   events:json      {t, events: [...]}             low-frequency tracers' events
 *   modules:update   {modules: [...]}
 *   agent:exit       {t, status, how}               the target is exiting
 *   agent:crash      {t, signal, address, ...}      the target is crashing
 *   agent:warning    {message}
 */

const NATIVE_PLATFORM = Process.platform;   // 'linux' | 'darwin' | ...
const IS_DARWIN = NATIVE_PLATFORM === 'darwin';
const T0 = Date.now();
const DRAIN_INTERVAL_MS = 100;

const state = {
  cm: null,
  symbols: {},
  config: null,
  drainBuf: null,
  drainCap: 0,
  snapshotBuf: null,
  timer: null,
  running: false,
  finished: false,
  knownModules: new Set(),
  pendingJson: [],
  recon: [],
  fns: {},
};

function now() {
  return Date.now() - T0;
}

function findExport(name, moduleName) {
  if (moduleName) {
    const m = Process.findModuleByName(moduleName);
    return m === null ? null : m.findExportByName(name);
  }
  return Module.findGlobalExportByName(name);
}

/* The C library (Linux): its own exports, never a same-named one from another module
 * (the agent's allocator among them).  null on Darwin, where names are two-level anyway,
 * so libcExport there is the global export. */
function libcModule() {
  if (IS_DARWIN)
    return null;
  if (state.libc === undefined)
    state.libc = Process.enumerateModules().find(m => /^libc[.-]/.test(m.name) || m.name === 'libc.so') || null;
  return state.libc;
}

function libcExport(name) {
  const m = libcModule();
  const p = m === null ? null : m.findExportByName(name);
  return p !== null ? p : findExport(name);
}

function moduleOf(address) {
  const m = Process.findModuleByAddress(address);
  return m === null ? null : m.name;
}

/* Recon: every symbol a tracer wants, found or MISSING. */
function recon(wanted) {
  return wanted.map(w => {
    const spec = (typeof w === 'string') ? { name: w } : w;
    let address = null;
    try {
      address = spec.resolve ? spec.resolve() : findExport(spec.name, spec.module || null);
    } catch (e) {
      address = null;
    }
    return {
      name: spec.name,
      module: address === null ? (spec.module || null) : moduleOf(address),
      address: address === null ? null : address.toString(),
      status: address === null ? 'MISSING' : 'found',
      role: spec.role || 'hook',
    };
  });
}

function libcFunction(name, ret, args) {
  const p = findExport(name);
  return p === null ? null : new NativeFunction(p, ret, args);
}

/* ---- listeners for the JavaScript-hooked tracers ------------------------ */

/* A listener on `address` (null: the target lacks it, recon has said so), kept in `listeners`
 * for uninstall.  A refusal becomes a warning, never a failed start.  True when in place. */
function attachListener(name, address, callbacks, listeners, data) {
  if (address === null || address === undefined)
    return false;
  try {
    listeners.push(data === undefined ? Interceptor.attach(address, callbacks)
      : Interceptor.attach(address, callbacks, data));
    return true;
  } catch (e) {
    send({ type: 'agent:warning', message: `cannot hook ${name} at ${address}: ${e.message || e}` });
    return false;
  }
}

/* Every listener out, the list emptied, the code restored before returning. */
function detachListeners(listeners) {
  for (const l of listeners.splice(0))
    l.detach();
  Interceptor.flush();
}

/* ---- stacks for the JavaScript-hooked tracers ---------------------------- */

/* Return address + the frame-pointer chain above it; every read guarded, PAC stripped on
 * arm64e.  low: the stack pointer at the hook, when known: frames must lie above it (within
 * 64 MiB), which stops a walk that wandered off the stack.  (A frame of a function hooked
 * with a call listener would show Interceptor's trampoline: hooks above C-hooked entries are
 * therefore probes.) */
function walkFrames(ret, fp, max, low) {
  const frames = [ret.strip().toString()];
  const ps = Process.pointerSize;
  const high = low ? low.add(64 * 1024 * 1024) : null;
  let f = fp;
  try {
    while (frames.length < max && !f.isNull() && f.and(ps - 1).isNull()) {
      if (low && (f.compare(low) < 0 || f.compare(high) >= 0))
        break;
      const next = f.readPointer();
      const r = f.add(ps).readPointer().strip();
      if (r.isNull())
        break;
      frames.push(r.toString());
      if (next.compare(f) <= 0)
        break;
      f = next;
    }
  } catch (e) {
    // an unreadable frame ends the stack; what was read is still evidence
  }
  return frames;
}

/* The caller chain at a hooked function's entry, walked by us: Frida's accurate backtracer
 * is libunwind on Linux, which opens a pipe of its own in every thread it unwinds (and the fd
 * tracer would then find descriptors nobody opened). */
function entryFrames(ctx, max) {
  if (Process.arch === 'x64')
    return walkFrames(ctx.rsp.readPointer(), ctx.rbp, max, ctx.sp);   // [rsp]: the return address
  if (Process.arch === 'arm64')
    return walkFrames(ctx.lr, ctx.fp, max, ctx.sp);
  return Thread.backtrace(ctx, Backtracer.FUZZY).slice(0, max).map(p => p.toString());
}

/* ---- CModule core ------------------------------------------------------ */

function pow2(n) {
  let p = 1;
  while (p < n)
    p *= 2;
  return p;
}

function buildCore(config, sources, extraSymbols) {
  const defines = [];
  defines.push(IS_DARWIN ? '#define MT_DARWIN 1' : '#define MT_LINUX 1');
  if (Process.arch === 'arm64')
    defines.push('#define MT_ARM64 1');
  const source = defines.join('\n') + '\n' + sources.join('\n');

  const ringSize = pow2(config.ringKb * 1024);
  const nSlots = config.threadSlots;
  const nRings = config.rings;
  const stackSlots = pow2(config.stackTable);
  const liveBuckets = pow2(Math.max(1024, Math.ceil(config.liveTable / 8)));

  const cfg = Memory.alloc(16 * 8);
  const globals = Memory.alloc(65536);
  const slots = Memory.alloc(nSlots * 1024);
  const rings = Memory.alloc(nRings * ringSize);
  const stackTable = Memory.alloc(stackSlots * 8);
  const liveTable = Memory.alloc(liveBuckets * 8 * 8);
  const liveOcc = Memory.alloc(liveBuckets * 4);
  const liveLocks = Memory.alloc(liveBuckets * 4);
  const slowKinds = Memory.alloc(8);
  state.slowKinds = slowKinds;
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
      state.toolchainError = String(e.message || e).split('\n')[0];
      cm = null;
    }
  }
  if (!cm)
    cm = new CModule(source, symbols);

  const slotSize = new NativeFunction(cm.mt_slot_size, 'uint64', [])();
  if (Number(slotSize) > 1024)
    throw new Error('memtrace agent: MtSlot grew past its allocation');

  const keyBuf = Memory.alloc(8);
  const keyCreate = libcFunction('pthread_key_create', 'int', ['pointer', 'pointer']);
  if (keyCreate(keyBuf, cm.mt_thread_exit) !== 0)
    throw new Error('memtrace agent: pthread_key_create failed');
  const key = keyBuf.readU32();
  const tlsDirect = (NATIVE_PLATFORM === 'linux' && Process.arch === 'x64' && toolchain === 'external')
    ? findTlsOffset(key) : 0;
  tlsOffset.writeU64(tlsDirect);

  const codeMask = (IS_DARWIN && Process.arch === 'arm64') ? uint64('0x7fffffffff') : uint64('0xffffffffffffffff');
  cfg.writeU64(config.liveThreshold);
  cfg.add(8).writeU64(config.stackThreshold);
  cfg.add(16).writeU64(Math.min(config.frames, 64));
  cfg.add(24).writeU64(config.sampleBytes || 0);
  cfg.add(32).writeU64(ringSize);
  cfg.add(40).writeU64(nSlots);
  cfg.add(48).writeU64(nRings);
  cfg.add(56).writeU64(stackSlots - 1);
  cfg.add(64).writeU64(liveBuckets - 1);
  cfg.add(72).writeU64(codeMask);
  cfg.add(80).writeU64(key);
  cfg.add(88).writeU64(Process.arch === 'arm64' ? 178 : 186);   // SYS_gettid
  cfg.add(96).writeU64(0);                                       // enabled

  new NativeFunction(cm.mt_reset, 'void', [])();

  state.cm = cm;
  state.cfg = cfg;
  state.drainCap = Math.max(4 * 1024 * 1024, ringSize * 4);
  state.drainBuf = Memory.alloc(state.drainCap);
  state.snapshotBuf = Memory.alloc(64 * 8);
  state.fns = {
    drain: new NativeFunction(cm.mt_drain, 'uint64', ['pointer', 'uint64']),
    snapshot: new NativeFunction(cm.mt_snapshot, 'void', ['pointer']),
    lost: new NativeFunction(cm.mt_lost_calls, 'uint64', []),
    live: new NativeFunction(cm.mt_live_count, 'uint64', []),
    stacks: new NativeFunction(cm.mt_stacks_interned, 'uint64', []),
  };
  return {
    toolchain,
    toolchainError: state.toolchainError || null,
    tlsDirectOffset: tlsDirect,
    tlsKey: key,
    ringSize,
    threadSlots: nSlots,
    rings: nRings,
    stackTable: stackSlots,
    liveCapacity: liveBuckets * 8,
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

function setEnabled(on) {
  if (state.cfg)
    state.cfg.add(96).writeU64(on ? 1 : 0);
}

function readCounters() {
  state.fns.snapshot(state.snapshotBuf);
  const out = [];
  for (let i = 0; i < 64; i++)
    out.push(Number(state.snapshotBuf.add(i * 8).readU64()));
  return out;
}

/* One drain: every thread's records, then the counters, in one message. */
function flush() {
  if (state.cm !== null) {
    let more = true;
    while (more) {
      const n = Number(state.fns.drain(state.drainBuf, state.drainCap));
      more = n > state.drainCap / 2;
      const payload = {
        type: 'events:batch',
        t: now(),
        counters: readCounters(),
        lost: Number(state.fns.lost()),
        live: Number(state.fns.live()),
        stacks: Number(state.fns.stacks()),
      };
      send(payload, n > 0 ? state.drainBuf.readByteArray(n) : null);
    }
  }
  if (state.pendingJson.length > 0) {
    const events = state.pendingJson;
    state.pendingJson = [];
    send({ type: 'events:json', t: now(), events });
  } else if (state.cm === null) {
    // The host reads a silent agent as a frozen process (anti-debug): a tracer with nothing to
    // report still says it is alive.
    send({ type: 'agent:alive', t: now() });
  }
}

function emitJson(event) {
  event.t = now();
  state.pendingJson.push(event);
  if (state.pendingJson.length >= 512)
    flush();
}

/* ---- modules and symbols ----------------------------------------------- */

function describeModule(m) {
  return { name: m.name, path: m.path, base: m.base.toString(), size: m.size };
}

function announceModules() {
  const fresh = [];
  for (const m of Process.enumerateModules()) {
    const k = m.base.toString();
    if (!state.knownModules.has(k)) {
      state.knownModules.add(k);
      fresh.push(describeModule(m));
    }
  }
  if (fresh.length > 0)
    send({ type: 'modules:update', t: now(), modules: fresh });
}

function symbolize(addresses) {
  return addresses.map(a => {
    const p = ptr(a);
    let s = null;
    try {
      s = DebugSymbol.fromAddress(p);
    } catch (e) {
      s = null;
    }
    const m = Process.findModuleByAddress(p);
    return [
      a,
      m === null ? null : m.name,
      m === null ? null : p.sub(m.base).toInt32(),
      (s === null || s.name === null) ? null : s.name,
      (s === null || !s.fileName) ? null : s.fileName,
      (s === null || !s.lineNumber) ? null : s.lineNumber,
    ];
  });
}

/* ---- calibration ------------------------------------------------------- */

function readProcKeyValues(path) {
  const out = {};
  let text;
  try {
    text = File.readAllText(path);
  } catch (e) {
    return null;
  }
  for (const line of text.split('\n')) {
    const m = /^(\w+):\s+(\d+)\s*kB/.exec(line);
    if (m)
      out[m[1]] = Number(m[2]) * 1024;
  }
  return out;
}

function calibrateLinux() {
  const result = { allocator: null, footprint: null };
  const mi2 = findExport('mallinfo2');
  if (mi2 !== null) {
    const f = new NativeFunction(mi2, ['size_t', 'size_t', 'size_t', 'size_t', 'size_t',
      'size_t', 'size_t', 'size_t', 'size_t', 'size_t'], []);
    const v = f().map(Number);
    result.allocator = {
      source: 'mallinfo2', arena: v[0], ordblks: v[1], hblks: v[3], hblkhd: v[4],
      uordblks: v[7], fordblks: v[8], in_use: v[7] + v[4],
    };
  }
  const status = readProcKeyValues('/proc/self/status');
  const rollup = readProcKeyValues('/proc/self/smaps_rollup');
  if (status !== null) {
    result.footprint = {
      source: '/proc/self/status',
      rss: status.VmRSS || 0,
      rss_anon: status.RssAnon || 0,
      hwm: status.VmHWM || 0,
      pss_anon: rollup === null ? null : (rollup.Pss_Anon || 0),
      footprint: status.RssAnon || 0,
    };
  }
  return result;
}

function calibrateDarwin() {
  // DEVICE-UNVERIFIED: struct layouts from <malloc/malloc.h> and <mach/task_info.h>.
  const result = { allocator: null, footprint: null };
  const zs = findExport('malloc_zone_statistics');
  if (zs !== null) {
    const stats = Memory.alloc(32);
    new NativeFunction(zs, 'void', ['pointer', 'pointer'])(NULL, stats);
    result.allocator = {
      source: 'malloc_zone_statistics',
      blocks_in_use: stats.readU32(),
      in_use: Number(stats.add(8).readU64()),
      max_in_use: Number(stats.add(16).readU64()),
      allocated: Number(stats.add(24).readU64()),
    };
  }
  const vm = taskVmInfo();
  if (vm !== null)
    result.footprint = Object.assign({ source: 'task_vm_info' }, vm);
  return result;
}

/* task_info(mach_task_self(), TASK_VM_INFO, ...): offsets of task_vm_info_data_t. */
function taskVmInfo() {
  const ti = findExport('task_info');
  const selfVar = findExport('mach_task_self_');
  if (ti === null || selfVar === null)
    return null;
  const buf = Memory.alloc(512);
  const count = Memory.alloc(4);
  count.writeU32(512 / 4);
  const kr = new NativeFunction(ti, 'int', ['uint', 'int', 'pointer', 'pointer'])(selfVar.readU32(), 22, buf, count);
  if (kr !== 0)
    return null;
  const u64 = off => Number(buf.add(off).readU64());
  return {
    resident: u64(16),
    internal: u64(48),
    reusable: u64(80),
    purgeable_volatile_pmap: u64(96),
    compressed: u64(120),
    footprint: u64(144),
    ledger_purgeable_nonvolatile: u64(176),
    ledger_purgeable_volatile: u64(192),
  };
}

function calibrate() {
  const r = IS_DARWIN ? calibrateDarwin() : calibrateLinux();
  r.t = now();
  return r;
}

/* ---- end of life: exit and crash --------------------------------------- */

/* Process exit is seen through rpc.exports.dispose, which Frida runs (and
 * flushes) from its own exit monitor; a JavaScript listener on exit() deadlocks
 * against that monitor.  Crashes come through the exception handler. */
function watchExit() {
  Process.setExceptionHandler(details => {
    if (!state.finished) {
      try {
        flush();
      } catch (e) {
        // keep going: reporting the crash matters more
      }
      send({
        type: 'agent:crash', t: now(), kind: details.type,
        address: details.address.toString(), module: moduleOf(details.address),
      });
    }
    return false;
  });
}

/* ---- rpc --------------------------------------------------------------- */

rpc.exports = Object.assign({
  hello() {
    return {
      platform: NATIVE_PLATFORM, arch: Process.arch, pid: Process.id,
      pointerSize: Process.pointerSize, pageSize: Process.pageSize,
      fridaVersion: Frida.version, tracer: tracer.name,
      mainModule: describeModule(Process.mainModule),
    };
  },
  init(config, sources) {
    state.config = config;
    state.recon = recon(tracer.symbols(config));
    const info = tracer.init ? tracer.init(config, sources) : {};
    return { recon: state.recon, info };
  },
  start() {
    announceModules();
    if (tracer.install)
      tracer.install(state.config);
    watchExit();
    state.running = true;
    state.moduleTick = 1;
    state.timer = setInterval(() => {
      flush();
      if (state.moduleTick++ % 10 === 0)
        announceModules();
    }, DRAIN_INTERVAL_MS);
    return { t: now() };
  },
  flush() {
    flush();
    return { t: now() };
  },
  stop() {
    if (state.finished)
      return { t: now() };
    state.finished = true;
    if (state.timer !== null)
      clearInterval(state.timer);
    setEnabled(false);
    if (tracer.uninstall)
      tracer.uninstall(state.config);
    flush();
    announceModules();
    return { t: now() };
  },
  dispose() {
    // Frida calls this as the process exits (and on unload); messages sent here are flushed.
    if (state.finished)
      return;
    state.finished = true;
    try {
      flush();
    } catch (e) {
      // the process is going away; nothing more to save
    }
    // Take our hooks out before Frida tears the agent down: its teardown with
    // replaced allocator entries still in place hangs the exiting process.
    setEnabled(false);
    try {
      if (tracer.uninstall)
        tracer.uninstall(state.config);
      Interceptor.detachAll();
      Interceptor.flush();
      flush();   // what uninstall itself reported (the fd tracer's end census)
    } catch (e) {
      // keep going: the goodbye message matters more
    }
    let calibration = null;
    try {
      calibration = calibrate();
    } catch (e) {
      calibration = null;
    }
    send({
      type: 'agent:exit', t: now(), exiting: true,
      status: null,
      how: 'process exit',
      calibration,
    });
  },
  symbolize(addresses) {
    return symbolize(addresses);
  },
  calibrate() {
    return calibrate();
  },
}, tracer.extraExports || {});
