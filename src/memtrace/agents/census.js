/*
 * memtrace census agent (Darwin / iOS only). Loaded into ONE host process -- by default
 * Frida's system session (pid 0: frida-server itself, root, task_for_pid-capable) -- and
 * measures every other process from outside: nothing is injected into the measured processes.
 *
 * DEVICE-UNVERIFIED: every offset and constant below is written from xnu's public headers
 * (bsd/sys/resource.h, bsd/sys/kern_memorystatus.h, osfmk/mach/task_info.h) and has not yet
 * been run on an iPhone. Frida 17 API only (Module.findGlobalExportByName; no static
 * Module.findExportByName).
 *
 * rpc.exports.census() -> {rows: [...], errors: {...}, pageSize, pid}
 * rpc.exports.memlimit(pid) -> {pid, active, active_fatal, inactive, inactive_fatal, managed,
 *                               priority, limit, state, errors}: one process's limits, read here
 *                               because memorystatus_control needs root (apps get EPERM)
 *
 * task_vm_info's offsets are layout.js's (memtrace/layout.py), read by runtime/taskinfo.js.
 */

import { fridaThreadsAmong } from './runtime/platform.js';
import { machTaskSelf, readTaskVmInfo } from './runtime/taskinfo.js';

function fn(name, ret, args, system) {
  const address = Module.findGlobalExportByName(name);
  if (address === null)
    return null;
  // SystemFunction returns {value, errno}: the errno says *why* a pid could not be read.
  return system ? new SystemFunction(address, ret, args) : new NativeFunction(address, ret, args);
}

// libproc.h
const proc_listallpids = fn('proc_listallpids', 'int', ['pointer', 'int'], true);
const proc_pid_rusage = fn('proc_pid_rusage', 'int', ['int', 'int', 'pointer'], true);
const proc_name = fn('proc_name', 'int', ['int', 'pointer', 'uint32'], false);
// sys/kern_memorystatus.h (private; exported by libsystem_kernel)
const memorystatus_control = fn('memorystatus_control', 'int',
  ['uint32', 'int32', 'uint32', 'pointer', 'size_t'], true);
// mach: task_name_for_pid is enough for task_info(TASK_VM_INFO); task_for_pid is the fallback.
const task_name_for_pid = fn('task_name_for_pid', 'int', ['uint32', 'int', 'pointer'], false);
const task_for_pid = fn('task_for_pid', 'int', ['uint32', 'int', 'pointer'], false);
const mach_port_deallocate = fn('mach_port_deallocate', 'int', ['uint32', 'uint32'], false);

const RUSAGE_INFO_V4 = 4;
// struct rusage_info_v4 (bsd/sys/resource.h); all fields after ri_uuid[16] are uint64_t.
const RUSAGE_V4_SIZE = 296;            // 16 + 35 * 8
const RI_RESIDENT_SIZE = 64;           // ri_resident_size
const RI_PHYS_FOOTPRINT = 72;          // ri_phys_footprint
const RI_LIFETIME_MAX_FOOTPRINT = 240; // ri_lifetime_max_phys_footprint
const RI_INTERVAL_MAX_FOOTPRINT = 280; // ri_interval_max_phys_footprint

const MEMORYSTATUS_CMD_GET_PRIORITY_LIST = 1;
const MEMORYSTATUS_CMD_GET_MEMLIMIT_PROPERTIES = 8;
const MEMORYSTATUS_CMD_GET_PROCESS_IS_MANAGED = 17;
// memorystatus_memlimit_properties_t {int32 memlimit_active (MB, -1 none); uint32 active_attr;
//                                     int32 memlimit_inactive; uint32 inactive_attr}
const MEMLIMIT_PROPERTIES_SIZE = 16;
const MEMORYSTATUS_MEMLIMIT_ATTR_FATAL = 0x1;
// memorystatus_priority_entry_t {pid_t pid; int32_t priority; uint64_t user_data;
//                                int32_t limit /* MB, -1 = none */; uint32_t state;}
const PRIORITY_ENTRY_SIZE = 24;
const PE_PID = 0, PE_PRIORITY = 4, PE_USER_DATA = 8, PE_LIMIT = 16, PE_STATE = 20;
// Older kernels refuse buffers larger than MEMORYSTATUS_BUFFERSIZE_MAX (65536).
const MEMORYSTATUS_BUFFERSIZE_MAX = 65536;
const EINVAL = 22;

function u64(p) {
  return p.readU64().toNumber();
}

function listPids(errors) {
  if (proc_listallpids === null) {
    errors.proc_listallpids = 'not exported';
    return [];
  }
  const estimate = proc_listallpids(NULL, 0).value;
  const capacity = Math.max(estimate, 0) + 256;  // processes start between the two calls
  const buf = Memory.alloc(capacity * 4);
  const r = proc_listallpids(buf, capacity * 4);
  if (r.value < 0) {
    errors.proc_listallpids = 'errno ' + r.errno;
    return [];
  }
  const pids = [];
  for (let i = 0; i < r.value && i < capacity; i++) {
    const pid = buf.add(i * 4).readS32();
    if (pid > 0)
      pids.push(pid);
  }
  return pids;
}

function priorityList(errors) {
  const out = {};
  if (memorystatus_control === null) {
    errors.memorystatus_control = 'not exported';
    return out;
  }
  const sized = memorystatus_control(MEMORYSTATUS_CMD_GET_PRIORITY_LIST, 0, 0, NULL, 0);
  if (sized.value < 0) {
    errors.memorystatus_control = 'size query: errno ' + sized.errno;
    return out;
  }
  let size = sized.value + 64 * PRIORITY_ENTRY_SIZE;
  let buf = Memory.alloc(size);
  let r = memorystatus_control(MEMORYSTATUS_CMD_GET_PRIORITY_LIST, 0, 0, buf, size);
  if (r.value < 0 && r.errno === EINVAL && size > MEMORYSTATUS_BUFFERSIZE_MAX) {
    size = MEMORYSTATUS_BUFFERSIZE_MAX;
    buf = Memory.alloc(size);
    r = memorystatus_control(MEMORYSTATUS_CMD_GET_PRIORITY_LIST, 0, 0, buf, size);
  }
  if (r.value < 0) {
    errors.memorystatus_control = 'errno ' + r.errno;
    return out;
  }
  for (let off = 0; off + PRIORITY_ENTRY_SIZE <= r.value; off += PRIORITY_ENTRY_SIZE) {
    const e = buf.add(off);
    const limit = e.add(PE_LIMIT).readS32();
    out[e.add(PE_PID).readS32()] = {
      priority: e.add(PE_PRIORITY).readS32(),
      user_data: e.add(PE_USER_DATA).readU64().toString(),
      limit: limit > 0 ? limit * 1024 * 1024 : null,
      state: e.add(PE_STATE).readU32(),
    };
  }
  return out;
}

function vmInfo(pid, self, port) {
  // Returns null when the task cannot be reached (the census then leaves these columns empty).
  port.writeU32(0);
  let kr = task_name_for_pid === null ? -1 : task_name_for_pid(self, pid, port);
  if (kr !== 0 && task_for_pid !== null)
    kr = task_for_pid(self, pid, port);
  if (kr !== 0)
    return null;
  const task = port.readU32();
  const v = readTaskVmInfo(task);
  if (mach_port_deallocate !== null)
    mach_port_deallocate(self, task);
  if (v === null)
    return null;
  const graphics = v.ledger_tag_graphics_footprint;
  return {
    reusable: v.reusable,
    task_phys_footprint: v.phys_footprint,
    purgeable_nonvolatile: v.ledger_purgeable_nonvolatile,
    purgeable_volatile: v.ledger_purgeable_volatile,
    graphics: graphics === null ? null : graphics + (v.ledger_tag_graphics_footprint_compressed || 0),
  };
}

function census() {
  const errors = {};
  const pids = listPids(errors);
  const priorities = priorityList(errors);
  const ru = Memory.alloc(RUSAGE_V4_SIZE);
  const nameBuf = Memory.alloc(256);
  const port = Memory.alloc(4);
  const self = machTaskSelf() || 0;
  const rows = [];
  for (const pid of pids) {
    const row = { pid: pid, status: 'ok' };
    if (proc_name !== null && proc_name(pid, nameBuf, 256) > 0)
      row.name = nameBuf.readUtf8String();
    if (proc_pid_rusage !== null) {
      const r = proc_pid_rusage(pid, RUSAGE_INFO_V4, ru);
      if (r.value === 0) {
        row.footprint = u64(ru.add(RI_PHYS_FOOTPRINT));
        row.lifetime_max = u64(ru.add(RI_LIFETIME_MAX_FOOTPRINT));
        row.interval_max = u64(ru.add(RI_INTERVAL_MAX_FOOTPRINT));
        row.rss = u64(ru.add(RI_RESIDENT_SIZE));
      } else {
        row.status = r.errno === 3 /* ESRCH */ ? 'vanished' : (r.errno === 1 /* EPERM */ ? 'denied' : 'errno ' + r.errno);
      }
    }
    const prio = priorities[pid];
    if (prio !== undefined) {
      row.priority = prio.priority;
      row.limit = prio.limit;
      row.state = prio.state;
      row.user_data = prio.user_data;
    }
    if (row.status === 'ok') {
      const vm = vmInfo(pid, self, port);
      if (vm !== null)
        Object.assign(row, vm);
    }
    rows.push(row);
  }
  return { rows: rows, errors: errors, pid: Process.id, pageSize: Process.pageSize };
}

function memlimit(pid) {
  const errors = {};
  const out = { pid: pid, active: null, active_fatal: null, inactive: null, inactive_fatal: null, managed: null,
    priority: null, limit: null, state: null, errors: errors };
  if (memorystatus_control === null) {
    errors.memorystatus_control = 'not exported';
    return out;
  }
  const buf = Memory.alloc(MEMLIMIT_PROPERTIES_SIZE);
  const r = memorystatus_control(MEMORYSTATUS_CMD_GET_MEMLIMIT_PROPERTIES, pid, 0, buf, MEMLIMIT_PROPERTIES_SIZE);
  if (r.value === 0) {
    const mb = v => (v > 0 ? v * 1024 * 1024 : null);
    out.active = mb(buf.readS32());
    out.active_fatal = (buf.add(4).readU32() & MEMORYSTATUS_MEMLIMIT_ATTR_FATAL) !== 0;
    out.inactive = mb(buf.add(8).readS32());
    out.inactive_fatal = (buf.add(12).readU32() & MEMORYSTATUS_MEMLIMIT_ATTR_FATAL) !== 0;
  } else {
    errors.memlimit_properties = 'errno ' + r.errno;
  }
  // RunningBoard-managed (apps, extensions): os_proc_available_memory() answers only for those.
  const m = memorystatus_control(MEMORYSTATUS_CMD_GET_PROCESS_IS_MANAGED, pid, 0, NULL, 0);
  if (m.value >= 0)
    out.managed = m.value !== 0;
  else
    errors.process_is_managed = 'errno ' + m.errno;
  const prio = priorityList(errors)[pid];
  if (prio !== undefined) {
    out.priority = prio.priority;
    out.limit = prio.limit;
    out.state = prio.state;
  }
  return out;
}

rpc.exports = {
  census: census,
  memlimit: memlimit,
  fridaThreadsAmong: fridaThreadsAmong,
};
