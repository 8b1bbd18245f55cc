/*
 * memtrace limit agent (Darwin / iOS only), loaded into the target process itself.
 *
 * DEVICE-UNVERIFIED: offsets and constants are written from xnu's public headers
 * (osfmk/mach/task_info.h, bsd/sys/kern_memorystatus.h, libdispatch's source.c) and have
 * not yet been run on an iPhone. Frida 17 API only.
 *
 * rpc.exports:
 *   sample()      -> {footprint, available, limit, memlimit: {...} | null, errors}
 *   watch(on)     -> install / keep the memory-pressure hooks; each notification is sent as
 *                    {type: 'limit:pressure', t, via, event, footprint, available}
 *
 * task_vm_info's offsets are layout.js's (memtrace/layout.py), read by runtime/taskinfo.js.
 */

import { selfTaskVmInfo } from './runtime/taskinfo.js';

function fn(name, ret, args) {
  const address = Module.findGlobalExportByName(name);
  return address === null ? null : new NativeFunction(address, ret, args);
}

// iOS 13+: bytes the process may still allocate before hitting its jetsam limit.
const os_proc_available_memory = fn('os_proc_available_memory', 'size_t', []);
const memorystatusAddress = Module.findGlobalExportByName('memorystatus_control');
const memorystatus_control = memorystatusAddress === null ? null
  : new SystemFunction(memorystatusAddress, 'int', ['uint32', 'int32', 'uint32', 'pointer', 'size_t']);

const MEMORYSTATUS_CMD_GET_MEMLIMIT_PROPERTIES = 8;
// memorystatus_memlimit_properties_t {int32 memlimit_active (MB, -1 none); uint32 active_attr;
//                                     int32 memlimit_inactive; uint32 inactive_attr}
const MEMLIMIT_PROPERTIES_SIZE = 16;
const MEMORYSTATUS_MEMLIMIT_ATTR_FATAL = 0x1;

// NOTE_MEMORYSTATUS_* / DISPATCH_MEMORYPRESSURE_* bits delivered with a pressure event.
const PRESSURE_BITS = {
  0x01: 'normal', 0x02: 'warn', 0x04: 'critical', 0x10: 'proc-limit-warn', 0x20: 'proc-limit-critical',
};

const memlimit = Memory.alloc(MEMLIMIT_PROPERTIES_SIZE);

function vmInfo() {
  const v = selfTaskVmInfo();
  if (v === null)
    return null;
  return {
    footprint: v.phys_footprint,
    footprint_peak: v.ledger_phys_footprint_peak,
    limit_bytes_remaining: v.limit_bytes_remaining,
  };
}

function available() {
  return os_proc_available_memory === null ? null : uint64(os_proc_available_memory().toString()).toNumber();
}

function memlimitProperties(errors) {
  if (memorystatus_control === null) {
    errors.memorystatus_control = 'not exported';
    return null;
  }
  // Allowed on the caller's own pid without root (kern_memorystatus.c permission check).
  const r = memorystatus_control(MEMORYSTATUS_CMD_GET_MEMLIMIT_PROPERTIES, Process.id, 0, memlimit,
    MEMLIMIT_PROPERTIES_SIZE);
  if (r.value !== 0) {
    errors.memorystatus_control = 'errno ' + r.errno;
    return null;
  }
  const mb = (v) => (v > 0 ? v * 1024 * 1024 : null);
  const activeAttr = memlimit.add(4).readU32();
  const inactiveAttr = memlimit.add(12).readU32();
  return {
    active: mb(memlimit.readS32()),
    active_fatal: (activeAttr & MEMORYSTATUS_MEMLIMIT_ATTR_FATAL) !== 0,
    inactive: mb(memlimit.add(8).readS32()),
    inactive_fatal: (inactiveAttr & MEMORYSTATUS_MEMLIMIT_ATTR_FATAL) !== 0,
  };
}

function sample() {
  const errors = {};
  const vm = vmInfo();
  if (vm === null)
    errors.task_info = 'TASK_VM_INFO failed';
  const avail = available();
  if (avail === null)
    errors.os_proc_available_memory = 'not exported (iOS < 13?)';
  const footprint = vm === null ? null : vm.footprint;
  return {
    t: Date.now() / 1000,
    footprint: footprint,
    footprint_peak: vm === null ? null : vm.footprint_peak,
    available: avail,
    // The iOS 13+ identity: limit = phys_footprint + os_proc_available_memory().
    limit: footprint !== null && avail !== null ? footprint + avail : null,
    limit_bytes_remaining: vm === null ? null : vm.limit_bytes_remaining,
    memlimit: memlimitProperties(errors),
    errors: errors,
  };
}

function describe(bits) {
  const names = [];
  for (const k of Object.keys(PRESSURE_BITS)) {
    if ((bits & Number(k)) !== 0)
      names.push(PRESSURE_BITS[k]);
  }
  return names.length > 0 ? names.join('|') : '0x' + bits.toString(16);
}

function report(via, bits) {
  const vm = vmInfo();
  send({
    type: 'limit:pressure', t: Date.now() / 1000, via: via, event: describe(bits), bits: bits,
    footprint: vm === null ? null : vm.footprint, available: available(),
  });
}

let hooked = null;

function installHooks() {
  if (hooked !== null)
    return hooked;
  hooked = [];
  // libdispatch's own memory-pressure source (created at libdispatch init in every process,
  // so it exists before we attach) passes each event to libmalloc's exported handler:
  // _dispatch_memorypressure_handler -> malloc_memory_event_handler(event bits).
  const mallocHandler = Module.findGlobalExportByName('malloc_memory_event_handler');
  if (mallocHandler !== null) {
    Interceptor.attach(mallocHandler, {
      onEnter(args) { report('malloc_memory_event_handler', args[0].toUInt32()); },
    });
    hooked.push('malloc_memory_event_handler');
  }
  // UIKit apps: -[UIApplication _receivedMemoryNotification] posts
  // UIApplicationDidReceiveMemoryWarningNotification (-> didReceiveMemoryWarning). Resolved
  // through the Objective-C runtime's C API because scripts created from Python have no ObjC bridge.
  const objc_getClass = fn('objc_getClass', 'pointer', ['pointer']);
  const sel_registerName = fn('sel_registerName', 'pointer', ['pointer']);
  const class_getMethodImplementation = fn('class_getMethodImplementation', 'pointer', ['pointer', 'pointer']);
  if (objc_getClass !== null && sel_registerName !== null && class_getMethodImplementation !== null) {
    const cls = objc_getClass(Memory.allocUtf8String('UIApplication'));
    if (!cls.isNull()) {
      const sel = sel_registerName(Memory.allocUtf8String('_receivedMemoryNotification'));
      const imp = class_getMethodImplementation(cls, sel);
      const forward = Module.findGlobalExportByName('_objc_msgForward');
      if (!imp.isNull() && (forward === null || !imp.equals(forward))) {
        Interceptor.attach(imp, { onEnter() { report('UIApplication._receivedMemoryNotification', 0x02); } });
        hooked.push('UIApplication._receivedMemoryNotification');
      }
    }
  }
  return hooked;
}

rpc.exports = {
  sample: sample,
  watch: installHooks,
};
