/*
 * memtrace limit agent (Darwin / iOS only), loaded into the target process itself.
 *
 * DEVICE-UNVERIFIED: offsets and constants are written from xnu's public headers
 * (osfmk/mach/task_info.h, bsd/sys/kern_memorystatus.h) and libdispatch's source (source.c,
 * private/source_private.h); exercised on Linux against the stand-in (demo/darwin/), which
 * models libdispatch's memory-pressure sources and os_proc_available_memory. Frida 17 API only.
 *
 * rpc.exports:
 *   sample()      -> {t, footprint, footprint_peak, available, limit_bytes_remaining, errors}
 *                    `available` is os_proc_available_memory() as returned: 0 also means "not a
 *                    managed process" or "over its limit" (xnu); the host decides with the limit
 *                    it reads as root (memorystatus_control refuses apps: EPERM), not here.
 *   watch()       -> the pressure sources in place; each notification is sent as
 *                    {type: 'limit:pressure', t, via, event, bits, footprint, available}
 *   unwatch()     -> the agent's dispatch source cancelled (before unload: its handler is ours)
 *
 * task_vm_info's offsets are layout.js's (memtrace/layout.py), read by runtime/taskinfo.js.
 */

import { fridaThreadsAmong } from './runtime/platform.js';
import { selfTaskVmInfo } from './runtime/taskinfo.js';

function fn(name, ret, args) {
  const address = Module.findGlobalExportByName(name);
  return address === null ? null : new NativeFunction(address, ret, args);
}

// iOS 13+: bytes the process may still allocate before hitting its jetsam limit.
const os_proc_available_memory = fn('os_proc_available_memory', 'size_t', []);

// DISPATCH_MEMORYPRESSURE_* (libdispatch source.h / source_private.h), the event bits delivered.
const PRESSURE_BITS = {
  0x01: 'normal', 0x02: 'warn', 0x04: 'critical', 0x10: 'proc-limit-warn', 0x20: 'proc-limit-critical',
};
// libdispatch registers libmalloc's handler with libmalloc's mask, which on iOS 17/18 is MSL
// status only: WARN/CRITICAL/PROC_LIMIT never reach malloc_memory_event_handler there.  The
// agent therefore creates a source of its own for what it wants to see.
const WATCH_MASK = 0x02 | 0x04 | 0x10 | 0x20;

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

function sample() {
  const errors = {};
  const vm = vmInfo();
  if (vm === null)
    errors.task_info = 'TASK_VM_INFO failed';
  const avail = available();
  if (avail === null)
    errors.os_proc_available_memory = 'not exported (iOS < 13?)';
  return {
    t: Date.now() / 1000,
    footprint: vm === null ? null : vm.footprint,
    footprint_peak: vm === null ? null : vm.footprint_peak,
    available: avail,
    limit_bytes_remaining: vm === null ? null : vm.limit_bytes_remaining,
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

const watching = {
  hooked: null,
  source: null,
  handler: null,
  cancel: null,
};

/* DISPATCH_SOURCE_TYPE_MEMORYPRESSURE (&_dispatch_source_type_memorypressure) with WATCH_MASK on
 * a global queue; its handler reads the event bits with dispatch_source_get_data. */
function createPressureSource() {
  const type = Module.findGlobalExportByName('_dispatch_source_type_memorypressure');
  const create = fn('dispatch_source_create', 'pointer', ['pointer', 'pointer', 'ulong', 'pointer']);
  const globalQueue = fn('dispatch_get_global_queue', 'pointer', ['long', 'ulong']);
  const setContext = fn('dispatch_set_context', 'void', ['pointer', 'pointer']);
  const setHandler = fn('dispatch_source_set_event_handler_f', 'void', ['pointer', 'pointer']);
  const getData = fn('dispatch_source_get_data', 'ulong', ['pointer']);
  const activate = fn('dispatch_activate', 'void', ['pointer']) || fn('dispatch_resume', 'void', ['pointer']);
  const cancel = fn('dispatch_source_cancel', 'void', ['pointer']);
  if ([type, create, globalQueue, setContext, setHandler, getData, activate, cancel].some(x => x === null))
    return null;
  const source = create(type, NULL, WATCH_MASK, globalQueue(0, 0));
  if (source.isNull())
    return null;
  const handler = new NativeCallback(context => {
    report('dispatch_source', Number(getData(context)));
  }, 'void', ['pointer']);
  setContext(source, source);
  setHandler(source, handler);
  activate(source);
  watching.source = source;
  watching.handler = handler;
  watching.cancel = cancel;
  return 'dispatch_source(' + describe(WATCH_MASK) + ')';
}

function installHooks() {
  if (watching.hooked !== null)
    return watching.hooked;
  watching.hooked = [];
  const own = createPressureSource();
  if (own !== null)
    watching.hooked.push(own);
  // libmalloc's handler still shows what libdispatch forwards to it (MSL status on iOS 17/18;
  // every pressure level on older systems).
  const mallocHandler = Module.findGlobalExportByName('malloc_memory_event_handler');
  if (mallocHandler !== null) {
    Interceptor.attach(mallocHandler, {
      onEnter(args) { report('malloc_memory_event_handler', args[0].toUInt32()); },
    });
    watching.hooked.push('malloc_memory_event_handler');
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
        watching.hooked.push('UIApplication._receivedMemoryNotification');
      }
    }
  }
  return watching.hooked;
}

/* The source's handler is this script's code: cancelled before the script goes. */
function uninstallSource() {
  if (watching.source === null)
    return false;
  watching.cancel(watching.source);
  watching.source = null;
  // A handler already running finishes on its queue; give it its moment before unload.
  Thread.sleep(0.05);
  return true;
}

rpc.exports = {
  sample: sample,
  watch: installHooks,
  unwatch: uninstallSource,
  dispose: uninstallSource,
  fridaThreadsAmong: fridaThreadsAmong,
};
