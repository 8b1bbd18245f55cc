/*
 * purgeable tracer: when the target declares memory discardable and takes it back.
 *
 * Entries (docs/domain/iosurface-purgeable.md, "Entries"):
 *   vm_purgable_control / mach_vm_purgable_control  C listener: GET / PURGE_ALL only counted
 *       (GET is hot); SET reads the new state on enter and the old state the kernel writes
 *       back into *state on leave, then hands old->new + caller frames to JS.
 *   vm_allocate / mach_vm_allocate / mach_vm_map    C listener: every call counted; those with
 *       VM_FLAGS_PURGABLE (0x2) streamed with the address read back on leave (object sizes
 *       let a later SET carry its bytes).
 *   madvise (libc)                                  C listener: counted per advice value; the
 *       platform's "reusable"-line advice values streamed with their caller.  Never a
 *       purgeable transition.
 *   IOSurfaceSetPurgeable                           JS: *oldState after the call.
 *   CABackingStoreSetVolatile, CA::Render::Shmem::new_shmem / set_volatile
 *                                                   JS: calls with stacks (the transition
 *       itself is seen underneath, at mach_vm_purgable_control).
 *
 * Events of the C listeners never enter JavaScript on the target's thread: the C side writes each
 * into a ring (cmodule/purgeable.c: the return address and the frame-pointer chain, walked in C
 * within the thread's stack), which the flush drains on the agent's thread (drainEvents); a full
 * ring drops the event and counts it (events_dropped in the counts event, said by the report).
 *
 * The C listeners are cmodule/purgeable.c, passed in by the host (init's cSources); their
 * entry numbers and counter slots are layout.js's PURGEABLE_* and PC_* (memtrace/layout.py).
 */

import {
  ALLOCATOR_RANGES, MADVISE_NAMES, PC_CONTROLS, PC_CONTROL_OTHER, PC_CONTROL_STRIDE, PC_CREATION, PC_EVENTS_DROPPED, PC_MADVISE,
  PC_MADVISE_INTERNAL, PC_MADVISE_SLOTS, PC_NESTED, PURGABLE_CONTROLS, PURGEABLE_ENTRIES, PURGEABLE_N_COUNTS, PURG_EVENT,
  PURG_KIND_CREATE, PURG_KIND_MADVISE, PURG_KIND_SET, PURG_RING_SLOTS, PURG_SLOT_BYTES,
} from './layout.js';
import { writeMainStack } from './runtime/core.js';
import { addFlushSource, emitJson } from './runtime/flush.js';
import { applyListeners, attachListener, detachListeners } from './runtime/listeners.js';
import { IS_DARWIN, findExport, libcExport, libcModule, now } from './runtime/platform.js';
import { entryFrames } from './runtime/stacks.js';

/* Advice values of the reusable line, per platform (the values are the platform's own). */
const MADVISE_DARWIN = MADVISE_NAMES.darwin;
const MADVISE_LINUX = MADVISE_NAMES.linux;
const FN_NAMES = PURGEABLE_ENTRIES;
const FN = Object.fromEntries(FN_NAMES.map((name, i) => [name, i]));
const STATE_MACHINE = ['vm_purgable_control', 'mach_vm_purgable_control'];
const CREATION = ['vm_allocate', 'mach_vm_allocate', 'mach_vm_map'];
const CA_SET_VOLATILE = 'CA::Render::Shmem::set_volatile';
const CA_NEW_SHMEM = 'CA::Render::Shmem::new_shmem';
const CA_MODULE = 'QuartzCore';
const ALLOCATOR_DARWIN = 'libsystem_malloc.dylib';
const ALLOCATOR_STANDIN = 'libmtmalloc.so';
const CA_CXX = [[CA_NEW_SHMEM, false], [CA_SET_VOLATILE, true]];    // [qualified name, member function]
const STACK_FRAMES = 16;

const purg = {
  cm: null,
  counts: null,
  drain: null,              // cmodule/purgeable.c purg_drain
  hooked: false,            // the C listeners are in (the flush drains a share; once out, all)
  drainBuf: null,
  draining: false,
  listeners: [],
  objects: new Map(),       // base address (string) -> size, from creation events
  resolved: {},
};

/* Itanium nested-name encoding of a qualified C++ name: the part every mangled overload shares. */
function mangledNestedName(qualified) {
  return 'N' + qualified.split('::').map(p => p.length + p).join('') + 'E';
}

/* Builtin parameter codes of the Itanium ABI, enough to find an overload's size argument. */
const BUILTIN = { v: 'void', b: 'bool', c: 'char', a: 'signed char', h: 'unsigned char', s: 'short',
  t: 'unsigned short', i: 'int', j: 'unsigned int', l: 'long', m: 'unsigned long', x: 'long long',
  y: 'unsigned long long', f: 'float', d: 'double' };

/* The parameter list after the nested name: ['unsigned long'], ['bool', 'int*'] ... (null where a
 * parameter is not a builtin or a pointer/reference to one). */
function mangledParams(rest) {
  const out = [];
  let i = 0;
  while (i < rest.length) {
    let suffix = '';
    while (rest[i] === 'P' || rest[i] === 'R' || rest[i] === 'K') {
      suffix = (rest[i] === 'K' ? ' const' : rest[i] === 'P' ? '*' : '&') + suffix;
      i++;
    }
    const t = BUILTIN[rest[i]];
    if (t === undefined)
      return out.concat([null]);
    out.push(t + suffix);
    i++;
  }
  return (out.length === 1 && out[0] === 'void') ? [] : out;
}

/* A defined function symbol: 'function' on ELF; frida-gum reports Mach-O's defined symbols as
 * 'section' (gum_emit_symbol: N_SECT), so there the section must be __TEXT's ("<n>.__TEXT.<sect>"). */
function isCode(sym) {
  if (sym.type === 'function')
    return true;
  return sym.type === 'section' && sym.section !== undefined && sym.section !== null &&
      /(^|\.)__TEXT\./.test(String(sym.section.id));
}

/* Every overload of `qualified` in a symbol list, each by its full mangled name, with its
 * parameters and the argument index of its size (the first unsigned long; member functions
 * take `this` first).  Pure: the hook table of the Core Animation entries, tested apart. */
export function matchCxxOverloads(symbols, qualified, member) {
  const prefix = '_Z' + mangledNestedName(qualified);
  const seen = new Set();
  const out = [];
  for (const sym of symbols) {
    // Mach-O names carry one more leading underscore where a list was not normalized.
    const name = sym.name.startsWith('__Z') ? sym.name.slice(1) : sym.name;
    if (!name.startsWith(prefix) || !isCode(sym))
      continue;
    const address = sym.address.toString();
    if (address === '0x0' || seen.has(name))
      continue;
    seen.add(name);
    const params = mangledParams(name.slice(prefix.length));
    const sizeParam = params.indexOf('unsigned long');
    out.push({ name, address, params, sizeArg: sizeParam < 0 ? null : sizeParam + (member ? 1 : 0) });
  }
  out.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  return out;
}

/* The debug-symbol search walks every symbol of every image (CoreSymbolication: seconds and tens
 * of MB in an app), so it is bounded: one search per process for the class's functions, shared by
 * every entry, at most DEBUG_MATCHES_MAX names read back; more than that is a pattern too loose to
 * trust, and the entries stay MISSING. */
const DEBUG_MATCHES_MAX = 64;
let debugMatches;     // undefined until searched; then the class's functions' addresses

function classFunctionsByDebugSymbols(qualified) {
  if (debugMatches === undefined) {
    const parts = qualified.split('::');
    try {
      debugMatches = DebugSymbol.findFunctionsMatching('*' + parts[parts.length - 2] + '*');
    } catch (e) {
      debugMatches = [];
    }
    if (debugMatches.length > DEBUG_MATCHES_MAX)
      debugMatches = [];
  }
  return debugMatches;
}

/* Where the symbol table has no entry (a stripped build), the debug-symbol search: names come
 * back demangled or mangled, and are checked against the qualified name. */
function findByDebugSymbols(qualified, member) {
  const last = qualified.split('::').pop();
  const symbols = [];
  for (const a of classFunctionsByDebugSymbols(qualified)) {
    const name = DebugSymbol.fromAddress(a).name;
    if (name === null || name.indexOf(last) < 0)
      continue;
    if (name.indexOf(qualified + '(') >= 0) {
      const inner = name.slice(name.indexOf('(') + 1, name.lastIndexOf(')'));
      const params = inner.trim() === '' ? [] : inner.split(',').map(p => p.trim());
      const sizeParam = params.indexOf('unsigned long');
      symbols.push({ name, address: a.toString(), params, sizeArg: sizeParam < 0 ? null : sizeParam + (member ? 1 : 0) });
    } else {
      symbols.push({ name, type: 'function', address: a });
    }
  }
  const mangled = matchCxxOverloads(symbols.filter(x => x.type === 'function'), qualified, member);
  return mangled.concat(symbols.filter(x => x.type === undefined));
}

function findCxx(qualified, member) {
  let modules;
  if (IS_DARWIN) {
    const qc = Process.findModuleByName(CA_MODULE);
    modules = qc === null ? [] : [qc];
  } else {
    modules = Process.enumerateModules();
  }
  for (const m of modules) {
    if (m.name.startsWith('frida-agent'))
      continue;
    let symbols;
    try {
      symbols = m.enumerateSymbols();
    } catch (e) {
      continue;
    }
    const found = matchCxxOverloads(symbols, qualified, member);
    if (found.length > 0)
      return found;
  }
  // DEVICE-UNVERIFIED: whether QuartzCore's symbols in the shared cache reach enumerateSymbols
  // on a given iOS build; the debug-symbol search (CoreSymbolication, before the window opens,
  // bounded) is the fallback -- only where QuartzCore is loaded, the only place they can be.
  return IS_DARWIN && modules.length > 0 ? findByDebugSymbols(qualified, member) : [];
}

function resolveOnce(name, how) {
  if (!(name in purg.resolved))
    purg.resolved[name] = how();
  return purg.resolved[name];
}

function wantedSymbols(config) {
  const list = [];
  for (const n of STATE_MACHINE)
    list.push({ name: n, role: 'state-machine', resolve: () => resolveOnce(n, () => findExport(n)) });
  for (const n of CREATION)
    list.push({ name: n, role: 'creation', resolve: () => resolveOnce(n, () => findExport(n)) });
  list.push({ name: 'madvise', role: 'reusable', resolve: () => resolveOnce('madvise', () => libcExport('madvise')) });
  if (config.standinMadvise)
    list.push({ name: 'mtdarwin_madvise', role: 'reusable-standin',
      resolve: () => resolveOnce('mtdarwin_madvise', () => findExport('mtdarwin_madvise')) });
  for (const n of ['IOSurfaceSetPurgeable', 'CABackingStoreSetVolatile'])
    list.push({ name: n, role: 'framework', resolve: () => resolveOnce(n, () => findExport(n)) });
  for (const [n, member] of CA_CXX) {
    // One recon row per overload, named by its full mangled name; one MISSING row if none.
    const overloads = resolveOnce(n, () => findCxx(n, member));
    if (overloads.length === 0)
      list.push({ name: n, module: IS_DARWIN ? CA_MODULE : null, role: 'framework', resolve: () => null });
    for (const o of overloads)
      list.push({ name: o.name, module: IS_DARWIN ? CA_MODULE : null, role: 'framework', resolve: () => ptr(o.address) });
  }
  list.push({ name: 'IOSurfaceGetAllocSize', role: 'accessor',
    resolve: () => resolveOnce('IOSurfaceGetAllocSize', () => findExport('IOSurfaceGetAllocSize')) });
  return list;
}

function objectSize(addr) {
  const key = addr.toString();
  if (purg.objects.has(key))
    return purg.objects.get(key);
  // SET may name any address inside the object.
  for (const [base, size] of purg.objects) {
    const b = ptr(base);
    if (addr.compare(b) >= 0 && addr.compare(b.add(size)) < 0)
      return size;
  }
  return null;
}

/* cmodule/purgeable.c's mt_purg_cfg: the main thread's stack ([lo, hi) of the [stack] mapping,
 * room for 8 MiB of growth below; Linux only: Darwin's threads all answer
 * pthread_get_stackaddr_np), its id, the address bits of a return address, and the C library's
 * functions the C side calls by address. */
function purgConfig() {
  const cfg = Memory.alloc(7 * 8);
  if (!IS_DARWIN)
    writeMainStack(cfg);     // zeros if unreadable: the main thread's events keep their return address only
  // arm64e signs return addresses: only the low 39 bits are the address (what ptr.strip() keeps).
  cfg.add(24).writeU64(IS_DARWIN && Process.arch === 'arm64' ? uint64('0x7fffffffff') : uint64('0xffffffffffffffff'));
  const fn = name => {
    const p = Module.findGlobalExportByName(name);
    if (p === null)
      throw new Error(`purgeable: ${name} not found`);
    return uint64(p.toString());
  };
  cfg.add(32).writeU64(fn(IS_DARWIN ? 'pthread_mach_thread_np' : 'syscall'));
  cfg.add(40).writeU64(fn('pthread_self'));
  cfg.add(48).writeU64(IS_DARWIN ? fn('pthread_get_stackaddr_np') : uint64(0));
  return cfg;
}

const EV = Object.fromEntries(Object.entries(PURG_EVENT.fields).map(([name, [off]]) => [name, off]));

function hexU64(view, at) {
  const lo = view.getUint32(at, true);
  const hi = view.getUint32(at + 4, true);
  return hi === 0 ? '0x' + lo.toString(16) : '0x' + hi.toString(16) + lo.toString(16).padStart(8, '0');
}

function numU64(view, at) {
  return view.getUint32(at + 4, true) * 4294967296 + view.getUint32(at, true);
}

/* One event of the ring, as the JavaScript callbacks made it before. */
function decodeEvent(view, at) {
  const i32 = name => view.getInt32(at + EV[name], true);
  const fn = i32('fn');
  const kr = i32('kr');
  const addr = hexU64(view, at + EV.addr);
  const tid = numU64(view, at + EV.tid);
  const frames = [];
  const nframes = i32('nframes');
  for (let k = 0; k < nframes; k++)
    frames.push(hexU64(view, at + PURG_EVENT.size + 8 * k));
  const kind = i32('kind');
  if (kind === PURG_KIND_SET) {
    return {
      type: 'set', entry: FN_NAMES[fn], control: i32('control'), addr,
      new_state: i32('new_state') & 3, old_state: kr === 0 ? (i32('old_state') & 3) : null, kr,
      bytes: objectSize(ptr(addr)), tid, frames,
    };
  }
  if (kind === PURG_KIND_CREATE) {
    const size = numU64(view, at + EV.size);
    // The kernel rounds an object up to whole pages.
    const bytes = Math.ceil(size / Process.pageSize) * Process.pageSize;
    if (kr === 0)
      purg.objects.set(addr, bytes);
    return { type: 'create', entry: FN_NAMES[fn], addr, size, bytes, flags: i32('flags'), kr, tid, frames };
  }
  const advice = i32('advice');
  const standin = fn === FN.mtdarwin_madvise;
  const table = (standin || IS_DARWIN) ? MADVISE_DARWIN : MADVISE_LINUX;
  return {
    type: 'madvise', entry: FN_NAMES[fn], advice, advice_name: table[advice] || null,
    platform: (standin || IS_DARWIN) ? 'darwin' : 'linux',
    addr, len: numU64(view, at + EV.size), tid, frames,
  };
}

/* Events taken from the ring per flush (10 a second): what the host is sent stays bounded (the
 * ring absorbs a burst; a flood beyond this is dropped and counted, not queued without end in the
 * agent, Frida's transport or the host). */
const DRAIN_PER_FLUSH = 256;

/* The ready events of the C ring, in the order the calls took their tickets, onto the flush's
 * batch (a flush source: runtime/flush.js; not re-entered by the flush emitJson may start);
 * `all`: every one (the hooks are out). */
function drainEvents(all = false) {
  if (purg.drain === null || purg.draining)
    return;
  purg.draining = true;
  try {
    let n;
    do {
      n = drainSome(all ? PURG_RING_SLOTS : DRAIN_PER_FLUSH);
    } while (all && n > 0);
  } finally {
    purg.draining = false;
  }
}

function drainSome(max) {
  const n = purg.drain(purg.drainBuf, max);
  if (n === 0)
    return 0;
  const view = new DataView(purg.drainBuf.readByteArray(n * PURG_SLOT_BYTES));
  const order = [];
  for (let i = 0; i < n; i++)
    order.push(i * PURG_SLOT_BYTES);
  // Tickets are a 32-bit counter: ordered by their distance from the first one drained.
  const first = view.getUint32(EV.ticket, true);
  const rel = at => (view.getUint32(at + EV.ticket, true) - first) | 0;
  order.sort((a, b) => rel(a) - rel(b));
  for (const at of order)
    emitJson(decodeEvent(view, at));
  return n;
}

/* Whose madvise calls are the allocator's own (counted, never streamed): libsystem_malloc on
 * Darwin (libmalloc madvises freed pages reusable, on iOS on most large frees); on Linux the C
 * library (glibc trims its arenas) and, with the Darwin stand-in, its libmalloc (libmtmalloc). */
function allocatorModules(config) {
  const names = IS_DARWIN ? [ALLOCATOR_DARWIN] : [ALLOCATOR_STANDIN];
  const out = names.map(n => Process.findModuleByName(n)).filter(m => m !== null);
  if (!IS_DARWIN && libcModule() !== null)
    out.unshift(libcModule());
  return out;
}

function adviceMask(table) {
  let lo = 0;
  let hi = 0;
  for (const k of Object.keys(table).map(Number)) {
    if (k < 32)
      lo |= (1 << k);
    else
      hi |= (1 << (k - 32));
  }
  return [lo, hi];
}

/* Cumulative C counters as one event; the analyzer keeps the last one. */
function countsEvent() {
  const c = i => purg.counts.add(i * 4).readS32();
  const byFn = name => {
    const base = PC_CONTROLS + FN[name] * PC_CONTROL_STRIDE;
    return { set: c(base + PURGABLE_CONTROLS.set_state), get: c(base + PURGABLE_CONTROLS.get_state),
      purge_all: c(base + PURGABLE_CONTROLS.purge_all),
      set_from_kernel: c(base + PURGABLE_CONTROLS.set_state_from_kernel), other: c(base + PC_CONTROL_OTHER) };
  };
  const advice = table => {
    const out = {};
    const last = PC_MADVISE_SLOTS - 1;    // anything larger
    for (let a = 0; a <= last; a++) {
      const n = c(PC_MADVISE + PC_MADVISE_SLOTS * table + a);
      if (n)
        out[a === last ? `${last}+` : String(a)] = n;
    }
    return out;
  };
  const created = name => c(PC_CREATION + FN[name]);
  const nestedIn = names => Object.fromEntries(names.map(name => [name, c(PC_NESTED + FN[name])]));
  return {
    type: 'counts', t: now(),
    controls: Object.fromEntries(STATE_MACHINE.map(name => [name, byFn(name)])),
    creation_calls: Object.fromEntries(CREATION.map(name => [name, created(name)])),
    // Calls made from inside another traced entry (vm_allocate -> mach_vm_allocate): not counted above.
    nested_calls: nestedIn(STATE_MACHINE.concat(CREATION)),
    madvise_all: advice(0),
    madvise_standin_all: advice(1),
    madvise_allocator_internal: c(PC_MADVISE_INTERNAL),
    madvise_platform: IS_DARWIN ? 'darwin' : 'linux',
    // Streamed events the ring had no room for (the flush did not keep up): counted, never silent.
    events_dropped: c(PC_EVENTS_DROPPED),
  };
}

function hookJs(name, callbacks) {
  attachListener(name, purg.resolved[name], callbacks, purg.listeners);
}

/* A C listener; its function data is the entry's number (the C side's `fn`). */
function hookC(name, enter, leave) {
  const p = purg.resolved[name];
  if (p === null || p === undefined)
    return;
  const cbs = { onEnter: purg.cm[enter] };
  if (leave)
    cbs.onLeave = purg.cm[leave];
  attachListener(name, p, cbs, purg.listeners, ptr(FN[name]));
}

function jsFrames(ctx) {
  return entryFrames(ctx, STACK_FRAMES);
}

function installFramework() {
  let allocSize = null;
  const a = purg.resolved.IOSurfaceGetAllocSize;
  if (a)
    allocSize = new NativeFunction(a, 'size_t', ['pointer']);
  hookJs('IOSurfaceSetPurgeable', {
    onEnter(args) {
      this.surface = args[0];
      this.newState = args[1].toUInt32();
      this.oldp = args[2];
      // A caller may pass NULL for oldState; give the call our own slot so the transition is known.
      if (this.oldp.isNull()) {
        this.oldp = Memory.alloc(4);
        args[2] = this.oldp;
      }
      this.frames = jsFrames(this.context);
    },
    onLeave(retval) {
      const kr = retval.toInt32();
      let bytes = null;
      try {
        bytes = allocSize === null ? null : Number(allocSize(this.surface));
      } catch (e) {
        bytes = null;
      }
      emitJson({
        type: 'set', entry: 'IOSurfaceSetPurgeable', control: this.newState === 3 ? 'keep-current' : 'set',
        addr: this.surface.toString(), new_state: this.newState,
        old_state: kr === 0 ? (this.oldp.readU32() & 3) : null, kr, bytes,
        tid: Process.getCurrentThreadId(), frames: this.frames,
      });
    },
  });
  hookJs('CABackingStoreSetVolatile', function (args) {
    emitJson({ type: 'call', entry: 'CABackingStoreSetVolatile', store: args[0].toString(),
      volatile: args[1].toInt32() !== 0, tid: Process.getCurrentThreadId(), frames: jsFrames(this.context) });
  });
  // Probes, not call listeners: a call listener (even without onLeave) makes Interceptor
  // rewrite the return address, and the frame-pointer walk of the mach_vm_* calls these
  // make underneath would then see its trampoline instead of the caller.
  // A bare function is a probe: Interceptor then leaves the return path alone.  Every overload
  // is hooked by its own mangled name (new_shmem(size) and new_shmem(port, size) both create).
  for (const o of purg.resolved[CA_SET_VOLATILE] || []) {
    attachListener(o.name, ptr(o.address), function (args) {
      // C++ member: args[0] = this, args[1] = bool, args[2] = int *old
      emitJson({ type: 'call', entry: CA_SET_VOLATILE, overload: o.name, shmem: args[0].toString(),
        volatile: (args[1].toUInt32() & 0xff) !== 0, tid: Process.getCurrentThreadId(),
        frames: jsFrames(this.context) });
    }, purg.listeners);
  }
  for (const o of purg.resolved[CA_NEW_SHMEM] || []) {
    attachListener(o.name, ptr(o.address), function (args) {
      emitJson({ type: 'call', entry: CA_NEW_SHMEM, overload: o.name,
        size: o.sizeArg === null ? null : Number(args[o.sizeArg].toString()),
        tid: Process.getCurrentThreadId(), frames: jsFrames(this.context) });
    }, purg.listeners);
  }
}

export const tracer = {
  name: 'purgeable',

  symbols(config) {
    return wantedSymbols(config);
  },

  init(config, sources) {
    // Own C listener (not the malloc core): hot GET/madvise counted without entering JS.
    purg.counts = Memory.alloc(PURGEABLE_N_COUNTS * 4);
    const streamLo = Memory.alloc(8);
    const streamHi = Memory.alloc(8);
    const [l0, h0] = adviceMask(IS_DARWIN ? MADVISE_DARWIN : MADVISE_LINUX);
    const [l1, h1] = adviceMask(MADVISE_DARWIN);
    streamLo.writeS32(l0);
    streamLo.add(4).writeS32(l1);
    streamHi.writeS32(h0);
    streamHi.add(4).writeS32(h1);
    const ranges = Memory.alloc(ALLOCATOR_RANGES * 16);
    const allocators = allocatorModules(config);
    allocators.slice(0, ALLOCATOR_RANGES).forEach((m, i) => {
      ranges.add(16 * i).writeU64(uint64(m.base.toString()));
      ranges.add(16 * i + 8).writeU64(uint64(m.base.add(m.size).toString()));
    });
    purg.allocRanges = ranges;
    const ring = Memory.alloc(PURG_RING_SLOTS * PURG_SLOT_BYTES);     // zeroed: every slot free
    const head = Memory.alloc(8);
    const next = Memory.alloc(8);       // where the next drain starts looking (purg_drain)
    const cfg = purgConfig();
    purg.cm = new CModule((IS_DARWIN ? '#define MT_DARWIN 1\n' : '') + sources.join('\n'), {
      mt_counts: purg.counts, mt_madv_stream: streamLo, mt_madv_stream_hi: streamHi, mt_alloc_ranges: ranges,
      mt_purg_ring: ring, mt_purg_head: head, mt_purg_cfg: cfg, mt_purg_next: next,
    });
    purg.memory = [ring, head, cfg, next];
    purg.drainBuf = Memory.alloc(PURG_RING_SLOTS * PURG_SLOT_BYTES);
    // Exclusive: the drain keeps the script's lock (and Interceptor's transaction) for its few
    // microseconds.
    purg.drain = new NativeFunction(purg.cm.purg_drain, 'uint', ['pointer', 'uint'], { scheduling: 'exclusive' });
    addFlushSource(() => drainEvents(!purg.hooked));
    purg.streamMasks = [streamLo, streamHi];
    return {
      allocator_modules: allocators.map(m => m.name),
      madvise_platform: IS_DARWIN ? 'darwin' : 'linux',
      madvise_streamed: IS_DARWIN ? MADVISE_DARWIN : MADVISE_LINUX,
      standin_madvise: !!config.standinMadvise,
    };
  },

  install(config) {
    for (const name of STATE_MACHINE)
      hookC(name, 'purg_enter', 'purg_leave');
    hookC('madvise', 'madv_enter', null);
    if (config.standinMadvise)
      hookC('mtdarwin_madvise', 'madv_enter', null);
    for (const name of CREATION)
      hookC(name, 'create_enter', 'create_leave');
    installFramework();
    purg.hooked = true;
    applyListeners('purgeable hooks in');
    purg.timer = setInterval(() => emitJson(countsEvent()), 1000);
  },

  extraExports: {
    /* The Core Animation hook table over a symbol list (tests: Mach-O 'section' symbols). */
    matchCxxOverloads(symbols, qualified, member) {
      return matchCxxOverloads(symbols.map(x => Object.assign({}, x, { address: ptr(x.address) })), qualified, member);
    },
  },

  uninstall() {
    if (purg.timer)
      clearInterval(purg.timer);
    purg.timer = null;
    detachListeners(purg.listeners);
    purg.hooked = false;
    drainEvents(true);      // what the last calls wrote (the flush after uninstall drains again)
    if (purg.counts !== null)
      emitJson(countsEvent());     // the runtime flushes after uninstall, at exit too
  },
};
