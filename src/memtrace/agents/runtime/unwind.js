/*
 * Unwind tables for modules built without frame pointers (glibc, libstdc++, ...): the host
 * computes them from each module's .eh_frame (memtrace/symbols/cfi.py) and hands them over
 * with unwindLoad; the C core's walk (cmodule/unwind.c) and walkFrames (stacks.js) use them.
 *
 * Registry: MtUnwindModule[MAX_UNWIND_MODULES] plus a count, both read by C without a lock;
 * modules that keep frame pointers are listed too, without rows.
 * An entry is filled before the count that publishes it is raised; tables are never freed
 * (a thread may be reading one), a module replaced at the same place only disables the old
 * entry (end = start).
 *
 * x86-64 Linux only: elsewhere unwindModules() asks for nothing (arm64 keeps frame records).
 */

import {
  MAX_UNWIND_MODULES, UNWIND_CFA_SP, UNWIND_INDEX_SHIFT, UNWIND_MODULE, UNWIND_NONE, UNWIND_ROW,
} from '../layout.js';
import { moduleList } from './modules.js';
import { NATIVE_PLATFORM } from './platform.js';

const reg = {
  modules: null,       // MtUnwindModule[MAX_UNWIND_MODULES]
  count: null,         // u64: entries published
  n: 0,
  asked: new Set(),    // module bases offered to the host
  tables: [],          // {start, end, rows, nRows} for the JavaScript walk; keeps the memory alive
};

const SUPPORTED = NATIVE_PLATFORM === 'linux' && Process.arch === 'x64';
const F = UNWIND_MODULE.fields;
const R = UNWIND_ROW.fields;

function registry() {
  if (reg.modules === null) {
    reg.modules = Memory.alloc(MAX_UNWIND_MODULES * UNWIND_MODULE.size);
    reg.count = Memory.alloc(8);
  }
  return reg;
}

/* The CModule symbols of the registry (the C core reads it). */
export function unwindSymbols() {
  const r = registry();
  return { mt_unwind_modules: r.modules, mt_unwind_count: r.count };
}

/* rpc: modules not offered before, for the host to compute tables for ([] where not needed). */
export function unwindModules() {
  if (!SUPPORTED)
    return [];
  const fresh = [];
  for (const m of moduleList()) {
    const k = m.base;
    if (reg.asked.has(k) || m.name.startsWith('frida-agent') || m.path.indexOf('/') < 0)
      continue;
    reg.asked.add(k);
    fresh.push(m);
  }
  return fresh;
}

function copyOut(data, offset, bytes) {
  if (bytes === 0)
    return NULL;
  const p = Memory.alloc(bytes);
  p.writeByteArray(data.slice(offset, offset + bytes));
  return p;
}

/* rpc: entries [{name, base, size, rows, index}]; data holds each entry's rows (UNWIND_ROW
 * records) and then its index (u32 each), entry after entry.  An entry with no rows is a module
 * that keeps frame pointers: listed so the walk knows it without searching. */
export function unwindLoad(entries, data) {
  const r = registry();
  let offset = 0;
  let loaded = 0;
  for (const e of entries) {
    const rowBytes = e.rows * UNWIND_ROW.size;
    const indexBytes = e.index * 4;
    const available = data === undefined || data === null ? 0 : data.byteLength;
    if (r.n === MAX_UNWIND_MODULES || offset + rowBytes + indexBytes > available)
      break;
    const rows = copyOut(data, offset, rowBytes);
    const index = copyOut(data, offset + rowBytes, indexBytes);
    offset += rowBytes + indexBytes;
    const start = ptr(e.base);
    const end = start.add(e.size);
    // A module now where another was (dlclose, dlopen): the old entry stops matching anything.
    for (let i = 0; i < r.n; i++) {
      const old = r.modules.add(i * UNWIND_MODULE.size);
      if (start.compare(old.add(F.end[0]).readPointer()) < 0 && end.compare(old.add(F.start[0]).readPointer()) > 0)
        old.add(F.end[0]).writePointer(old.add(F.start[0]).readPointer());
    }
    r.tables = r.tables.filter(t => !(start.compare(t.end) < 0 && end.compare(t.start) > 0));
    const slot = r.modules.add(r.n * UNWIND_MODULE.size);
    slot.add(F.start[0]).writePointer(start);
    slot.add(F.end[0]).writePointer(end);
    slot.add(F.rows[0]).writePointer(rows);
    slot.add(F.index[0]).writePointer(index);
    slot.add(F.n_rows[0]).writeU32(e.rows);
    slot.add(F.n_index[0]).writeU32(e.index);
    r.n++;
    r.count.writeU64(r.n);
    r.tables.push({ start, end, rows, index, nRows: e.rows, nIndex: e.index });
    loaded++;
  }
  return { loaded, modules: r.n };
}

/* The row in force at pc (a return address minus one), or null: the same lookup as unwind.c. */
function rowAt(pc) {
  const t = reg.tables.find(x => pc.compare(x.start) >= 0 && pc.compare(x.end) < 0);
  if (t === undefined || t.nRows === 0 || t.nIndex === 0)
    return null;
  const off = pc.sub(t.start).toUInt32();
  const startOf = i => t.rows.add(i * UNWIND_ROW.size + R.start[0]).readU32();
  const b = Math.min(off >>> UNWIND_INDEX_SHIFT, t.nIndex - 1);
  let i = t.index.add(4 * b).readU32();
  if (i >= t.nRows || startOf(i) > off)
    return null;
  while (i !== t.nRows - 1 && startOf(i + 1) <= off)
    i++;
  const row = t.rows.add(i * UNWIND_ROW.size);
  const cfaReg = row.add(R.cfa_reg[0]).readU8();
  if (cfaReg === UNWIND_NONE)
    return null;
  return { sp: cfaReg === UNWIND_CFA_SP, offset: row.add(R.cfa_offset[0]).readU16(),
    fpSlot: row.add(R.fp_slot[0]).readU8() };
}

/* One step out of the frame at pc through its table, the same rule as unwind.c; null when the
 * module has no table or no rule for pc (the caller then follows the frame pointer). */
export function unwindStep(pc, sp, fp, high) {
  if (reg.tables.length === 0)
    return null;
  const row = rowAt(pc.sub(1));
  if (row === null)
    return null;
  const cfa = (row.sp ? sp : fp).add(row.offset);
  if (cfa.compare(sp) <= 0 || (high !== null && cfa.compare(high) > 0) || !cfa.and(7).isNull())
    return { stop: true };
  const next = { pc: cfa.sub(8).readPointer(), sp: cfa, fp };
  if (row.fpSlot !== 0)
    next.fp = cfa.sub(8 * row.fpSlot).readPointer();
  return next;
}
