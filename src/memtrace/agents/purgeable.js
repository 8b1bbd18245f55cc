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
 * Stacks of C-listener events: the C side passes the return address and the caller's frame
 * pointer at function entry; JS walks the frame-pointer chain with guarded reads (a bad frame
 * throws in JS instead of crashing the target).
 *
 * The C listeners are cmodule/purgeable.c, passed in by the host (init's cSources); their
 * entry numbers and counter slots are layout.js's PURGEABLE_* and PC_* (memtrace/layout.py).
 */

import {
  MADVISE_NAMES, PC_CONTROLS, PC_CONTROL_OTHER, PC_CONTROL_STRIDE, PC_CREATION, PC_MADVISE, PC_MADVISE_INTERNAL,
  PC_MADVISE_SLOTS, PURGABLE_CONTROLS, PURGEABLE_ENTRIES, PURGEABLE_N_COUNTS,
} from './layout.js';
import { emitJson } from './runtime/flush.js';
import { attachListener, detachListeners } from './runtime/listeners.js';
import { IS_DARWIN, findExport, libcExport, libcModule, now } from './runtime/platform.js';
import { entryFrames, walkFrames } from './runtime/stacks.js';

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
const STACK_FRAMES = 16;

const purg = {
  cm: null,
  counts: null,
  callbacks: [],
  listeners: [],
  objects: new Map(),       // base address (string) -> size, from creation events
  resolved: {},
};

/* Itanium nested-name encoding of a qualified C++ name: the part every mangled overload shares. */
function mangledNestedName(qualified) {
  return 'N' + qualified.split('::').map(p => p.length + p).join('') + 'E';
}

function findCxx(qualified) {
  const needle = mangledNestedName(qualified);
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
    // `_ZN…E<args>`: the nested name right after the _Z prefix (Mach-O names may carry one more `_`).
    const hit = symbols.find(s => s.type === 'function' && !s.address.isNull() &&
        (s.name.startsWith('_Z' + needle) || s.name.startsWith('__Z' + needle)));
    if (hit !== undefined)
      return hit.address;
  }
  return null;
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
  for (const n of [CA_NEW_SHMEM, CA_SET_VOLATILE])
    list.push({ name: n, module: IS_DARWIN ? CA_MODULE : null, role: 'framework',
      resolve: () => resolveOnce(n, () => findCxx(n)) });
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

function makeCallbacks() {
  const onSet = new NativeCallback((fn, addr, control, newState, oldState, kr, ret, fp) => {
    emitJson({
      type: 'set', entry: FN_NAMES[fn], control, addr: addr.toString(),
      new_state: newState & 3, old_state: kr === 0 ? (oldState & 3) : null, kr,
      bytes: objectSize(addr), tid: Process.getCurrentThreadId(),
      frames: walkFrames(ret, fp, STACK_FRAMES),
    });
  }, 'void', ['int', 'pointer', 'int', 'int', 'int', 'int', 'pointer', 'pointer']);
  const onCreate = new NativeCallback((fn, addr, size, flags, kr, ret, fp) => {
    const a = ptr(addr.toString());
    // The kernel rounds an object up to whole pages.
    const bytes = Number(size.add(Process.pageSize - 1).and(uint64(Process.pageSize - 1).not()));
    if (kr === 0)
      purg.objects.set(a.toString(), bytes);
    emitJson({
      type: 'create', entry: FN_NAMES[fn], addr: a.toString(), size: Number(size), bytes, flags, kr,
      tid: Process.getCurrentThreadId(), frames: walkFrames(ret, fp, STACK_FRAMES),
    });
  }, 'void', ['int', 'uint64', 'uint64', 'int', 'int', 'pointer', 'pointer']);
  const onMadvise = new NativeCallback((fn, addr, len, advice, ret, fp) => {
    const standin = fn === FN.mtdarwin_madvise;
    const table = (standin || IS_DARWIN) ? MADVISE_DARWIN : MADVISE_LINUX;
    emitJson({
      type: 'madvise', entry: FN_NAMES[fn], advice, advice_name: table[advice] || null,
      platform: (standin || IS_DARWIN) ? 'darwin' : 'linux',
      addr: addr.toString(), len: Number(len), tid: Process.getCurrentThreadId(),
      frames: walkFrames(ret, fp, STACK_FRAMES),
    });
  }, 'void', ['int', 'pointer', 'uint64', 'int', 'pointer', 'pointer']);
  purg.callbacks = [onSet, onCreate, onMadvise];
  return { mt_on_set: onSet, mt_on_create: onCreate, mt_on_madvise: onMadvise };
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
  return {
    type: 'counts', t: now(),
    controls: Object.fromEntries(STATE_MACHINE.map(name => [name, byFn(name)])),
    creation_calls: Object.fromEntries(CREATION.map(name => [name, created(name)])),
    madvise_all: advice(0),
    madvise_standin_all: advice(1),
    madvise_allocator_internal: c(PC_MADVISE_INTERNAL),
    madvise_platform: IS_DARWIN ? 'darwin' : 'linux',
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
  // A bare function is a probe: Interceptor then leaves the return path alone.
  hookJs(CA_SET_VOLATILE, function (args) {
    // C++ member: args[0] = this, args[1] = bool, args[2] = int *old
    emitJson({ type: 'call', entry: CA_SET_VOLATILE, shmem: args[0].toString(),
      volatile: (args[1].toUInt32() & 0xff) !== 0, tid: Process.getCurrentThreadId(),
      frames: jsFrames(this.context) });
  });
  hookJs(CA_NEW_SHMEM, function (args) {
    emitJson({ type: 'call', entry: CA_NEW_SHMEM, size: Number(args[0].toString()),
      tid: Process.getCurrentThreadId(), frames: jsFrames(this.context) });
  });
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
    const libcRange = Memory.alloc(16);
    const libc = libcModule();
    if (libc) {
      libcRange.writeU64(uint64(libc.base.toString()));
      libcRange.add(8).writeU64(uint64(libc.base.add(libc.size).toString()));
    }
    purg.libcRange = libcRange;
    purg.cm = new CModule(sources.join('\n'), Object.assign({
      mt_counts: purg.counts, mt_madv_stream: streamLo, mt_madv_stream_hi: streamHi, mt_libc_range: libcRange,
    }, makeCallbacks()));
    purg.streamMasks = [streamLo, streamHi];
    return {
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
    Interceptor.flush();
    purg.timer = setInterval(() => emitJson(countsEvent()), 1000);
  },

  uninstall() {
    if (purg.timer)
      clearInterval(purg.timer);
    purg.timer = null;
    detachListeners(purg.listeners);
    if (purg.counts !== null)
      emitJson(countsEvent());     // the runtime flushes after uninstall, at exit too
  },
};
