/*
 * Routing probe (docs/domain/iosurface-purgeable.md): inside the target, create a 16 MiB purgeable mapping, apply
 * each entry in turn and, after every step, read GET_STATE and the task_vm_info ledger.  The
 * truth table "does this entry drive the purgeable state machine?" goes out as one RESULT.
 *
 * Darwin: libc madvise with Darwin advice values.  Linux: the stand-in libmtdarwin's
 * mtdarwin_madvise (Darwin advice values, moves only the stand-in's reusable ledger) -- glibc's
 * madvise speaks Linux advice numbers and has no ledger to read.  The output names which one ran.
 */

import { PURGABLE_CONTROLS, VM_FLAGS_ANYWHERE, VM_FLAGS_PURGABLE } from './layout.js';
import { IS_DARWIN, findExport } from './runtime/platform.js';
import { selfTaskVmInfo } from './runtime/taskinfo.js';

const PROBE_BYTES = 16 * 1024 * 1024;
const SET_STATE = PURGABLE_CONTROLS.set_state;
const GET_STATE = PURGABLE_CONTROLS.get_state;
const STEPS = [
  { entry: 'madvise', advice: 4, label: 'madvise(MADV_DONTNEED=4)' },
  { entry: 'madvise', advice: 5, label: 'madvise(MADV_FREE=5)' },
  { entry: 'madvise', advice: 7, label: 'madvise(MADV_FREE_REUSABLE=7)' },
  { entry: 'madvise', advice: 8, label: 'madvise(MADV_FREE_REUSE=8)' },
  { entry: 'set', state: 1, label: 'SET_STATE VOLATILE' },
  { entry: 'set', state: 0, label: 'SET_STATE NONVOLATILE' },
  { entry: 'set', state: 2, label: 'SET_STATE EMPTY' },
  { entry: 'set', state: 0, label: 'reacquire (SET_STATE NONVOLATILE)' },
];

function madviseEntry() {
  if (IS_DARWIN)
    return { name: 'madvise', address: findExport('madvise') };
  return { name: 'mtdarwin_madvise', address: findExport('mtdarwin_madvise') };
}

function ledger() {
  const v = selfTaskVmInfo();
  if (v === null)
    return null;
  return {
    footprint: v.phys_footprint, purgeable_volatile: v.ledger_purgeable_volatile,
    purgeable_nonvolatile: v.ledger_purgeable_nonvolatile, reusable: v.reusable,
  };
}

function delta(before, after) {
  if (before === null || after === null)
    return null;
  const out = {};
  for (const k of Object.keys(before))
    out[k] = after[k] - before[k];
  return out;
}

function runProbe() {
  const result = { type: 'result', tracer: 'probe', bytes: PROBE_BYTES, rows: [], errors: [],
    platform: IS_DARWIN ? 'darwin' : 'linux' };
  const alloc = findExport('mach_vm_allocate');
  const control = findExport('mach_vm_purgable_control');
  const dealloc = findExport('mach_vm_deallocate');
  const selfVar = findExport('mach_task_self_');
  const madv = madviseEntry();
  result.madvise_entry = madv.name;
  result.entries = { mach_vm_allocate: alloc !== null, mach_vm_purgable_control: control !== null,
    mach_vm_deallocate: dealloc !== null, mach_task_self_: selfVar !== null, task_info: findExport('task_info') !== null };
  result.entries[madv.name] = madv.address !== null;
  if (alloc === null || control === null || selfVar === null) {
    result.errors.push('cannot run: the target has no mach_vm_allocate / mach_vm_purgable_control / mach_task_self_ ' +
      '(on Linux the target must load the stand-in libmtdarwin.so)');
    return result;
  }
  const task = selfVar.readU32();
  const allocate = new NativeFunction(alloc, 'int', ['uint', 'pointer', 'uint64', 'int']);
  const purg = new NativeFunction(control, 'int', ['uint', 'uint64', 'int', 'pointer']);
  const madvise = madv.address === null ? null : new NativeFunction(madv.address, 'int', ['pointer', 'size_t', 'int']);
  const stateBuf = Memory.alloc(4);
  const addrBuf = Memory.alloc(8);
  addrBuf.writeU64(0);

  const getState = addr => {
    stateBuf.writeS32(0);
    const kr = purg(task, addr, GET_STATE, stateBuf);
    return kr === 0 ? (stateBuf.readS32() & 3) : null;
  };

  const l0 = ledger();
  const kr = allocate(task, addrBuf, uint64(PROBE_BYTES), VM_FLAGS_ANYWHERE | VM_FLAGS_PURGABLE);
  if (kr !== 0) {
    result.errors.push(`mach_vm_allocate(16 MiB, ANYWHERE|PURGABLE) failed: kern_return ${kr}`);
    return result;
  }
  const addr = addrBuf.readU64();
  const base = ptr(addr.toString());
  // Touch every page so NONVOLATILE pages are really resident, as an app's would be.
  for (let off = 0; off < PROBE_BYTES; off += Process.pageSize)
    base.add(off).writeU8(1);
  const l1 = ledger();
  result.rows.push({ entry: 'mach_vm_allocate(ANYWHERE|PURGABLE)', drives_state_machine: null,
    state_before: null, state_after: getState(addr), kr, ledger_delta: delta(l0, l1) });

  for (const step of STEPS) {
    const before = getState(addr);
    const lb = ledger();
    let r;
    let oldState = null;
    let entryName;
    if (step.entry === 'madvise') {
      entryName = `${madv.name}(${step.advice})`;
      if (madvise === null) {
        result.rows.push({ entry: step.label, called: entryName, error: `MISSING ${madv.name}`,
          drives_state_machine: null, state_before: before, state_after: before, ledger_delta: null });
        continue;
      }
      r = madvise(base, PROBE_BYTES, step.advice);
    } else {
      entryName = `mach_vm_purgable_control(SET_STATE, ${step.state})`;
      stateBuf.writeS32(step.state);
      r = purg(task, addr, SET_STATE, stateBuf);
      oldState = r === 0 ? (stateBuf.readS32() & 3) : null;
    }
    const after = getState(addr);
    const la = ledger();
    const row = { entry: step.label, called: entryName, kr: r, drives_state_machine: before !== after,
      state_before: before, state_after: after, ledger_delta: delta(lb, la) };
    if (step.entry === 'set')
      row.old_state_read_back = oldState;
    result.rows.push(row);
  }
  if (dealloc !== null)
    new NativeFunction(dealloc, 'int', ['uint', 'uint64', 'uint64'])(task, addr, uint64(PROBE_BYTES));
  result.ledger_available = l0 !== null;
  return result;
}

export const tracer = {
  name: 'probe',

  symbols(config) {
    const wanted = ['mach_vm_allocate', 'mach_vm_purgable_control', 'mach_vm_deallocate', 'mach_task_self_',
      'task_info'].map(name => ({ name, role: 'probe' }));
    wanted.push({ name: IS_DARWIN ? 'madvise' : 'mtdarwin_madvise', role: 'probe' });
    return wanted;
  },

  init(config, sources) {
    return { madvise_entry: madviseEntry().name, bytes: PROBE_BYTES };
  },

  install(config) {
    let result;
    try {
      result = runProbe();
    } catch (e) {
      result = { type: 'result', tracer: 'probe', rows: [], errors: [`probe failed: ${e.message || e}`] };
    }
    send(result);
  },

  uninstall() {},
};
