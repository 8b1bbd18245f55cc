/*
 * Darwin's task_info(task, TASK_VM_INFO): the footprint and its ledgers.  Offsets come from
 * layout.js (memtrace/layout.py).  DEVICE-UNVERIFIED: written from xnu's
 * osfmk/mach/task_info.h; on Linux the stand-in libmtdarwin exports task_info.
 */

import { TASK_VM_INFO_BUFFER, TASK_VM_INFO_COUNT, TASK_VM_INFO_FIELDS, TASK_VM_INFO_FLAVOR } from '../layout.js';

let taskInfo = null;     // looked up until found (the stand-in may load late)
let buf = null;
let count = null;

/* The calling process's own task port, or null without mach_task_self_. */
export function machTaskSelf() {
  const selfVar = Module.findGlobalExportByName('mach_task_self_');
  return selfVar === null ? null : selfVar.readU32();
}

/* Every field layout.py names, as a Number (null for a field past what the kernel filled:
 * an older revision); null when task_info is missing or fails. */
export function readTaskVmInfo(task) {
  if (taskInfo === null) {
    const p = Module.findGlobalExportByName('task_info');
    if (p === null)
      return null;
    taskInfo = new NativeFunction(p, 'int', ['uint', 'int', 'pointer', 'pointer']);
    buf = Memory.alloc(TASK_VM_INFO_BUFFER);
    count = Memory.alloc(4);
  }
  if (task === null)
    return null;
  count.writeU32(TASK_VM_INFO_COUNT);     // the newest revision's exact count (layout.py says why)
  if (taskInfo(task, TASK_VM_INFO_FLAVOR, buf, count) !== 0)
    return null;
  const filled = count.readU32() * 4;
  const out = {};
  for (const [name, [offset, type]] of Object.entries(TASK_VM_INFO_FIELDS)) {
    out[name] = filled >= offset + 8 ? buf.add(offset)['read' + type.toUpperCase()]().toNumber() : null;
  }
  return out;
}

/* The calling process's own figures. */
export function selfTaskVmInfo() {
  return readTaskVmInfo(machTaskSelf());
}
