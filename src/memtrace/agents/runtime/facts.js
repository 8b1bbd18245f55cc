/*
 * What `memtrace doctor` asks of an app on a device about the runtime itself (issue 23): the main
 * image's LC_UUID as read from memory (the host's symbolization keys on it), the full fence the
 * C core uses under TinyCC on arm64 (libSystem's OSMemoryBarrier), and task_info(TASK_VM_INFO)
 * with the exact count memtrace passes (the kernel writes back how many words it filled).
 */

import { TASK_VM_INFO_COUNT, TASK_VM_INFO_FLAVOR } from '../layout.js';
import { machoUuid } from './modules.js';
import { findExport } from './platform.js';
import { machTaskSelf } from './taskinfo.js';

export function darwinFacts() {
  const main = Process.enumerateModules()[0];
  const out = { main: main.name, uuid: machoUuid(main.base), fence: findExport('OSMemoryBarrier') !== null,
    task_info: null };
  const p = findExport('task_info');
  const task = machTaskSelf();
  if (p !== null && task !== null) {
    const f = new NativeFunction(p, 'int', ['uint', 'int', 'pointer', 'pointer']);
    const buf = Memory.alloc(TASK_VM_INFO_COUNT * 4);
    const count = Memory.alloc(4);
    count.writeU32(TASK_VM_INFO_COUNT);
    const kr = f(task, TASK_VM_INFO_FLAVOR, buf, count);
    out.task_info = { kr, asked: TASK_VM_INFO_COUNT, filled: count.readU32() };
  }
  return out;
}
