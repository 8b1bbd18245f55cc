/*
 * malloc tracer.  Hot paths live in cmodule/core.c + cmodule/malloc.c; this
 * file only finds the hook points and wires them up.
 *
 * Linux:  Interceptor.replaceFast on the glibc malloc family.
 * Darwin: libmalloc's `malloc_logger` (every zone, nano included) and
 *         libsyscall's `__syscall_logger` (VM operations with their tag);
 *         the public malloc family through replaceFast where the logger
 *         cannot be set.  DEVICE-UNVERIFIED: written from libmalloc's
 *         stack_logging.h and malloc.c, exercised on Linux only through
 *         mt_logger_decode (see tests/integration/test_malloc_logger.py).
 */

import { KINDS, LOGGER_EVENT } from './layout.js';
import { leakSymbols, scanLeaks } from './leaks.js';
import { buildCore, core, releaseThreadKey, setEnabled } from './runtime/core.js';
import { warn } from './runtime/flush.js';
import { IS_DARWIN, libcModule } from './runtime/platform.js';
import { readStruct } from './runtime/structs.js';

/* The replaced entries; each one's call kind is KINDS[name] (layout.js), its C replacement mt_<name>. */
const FAMILY = ['malloc', 'calloc', 'realloc', 'free', 'posix_memalign', 'memalign',
  'aligned_alloc', 'valloc', 'pvalloc'];

const LOGGER_MODULE = 'libsystem_malloc.dylib';
const SYSCALL_LOGGER_MODULE = 'libsystem_kernel.dylib';

const mallocState = {
  replaced: [],
  loggerSlots: [],
  realSlots: {},
  aliases: {},
  failed: {},
  slow: [],
  backend: null,
  leaksDone: false,
};

/* doctor's self-test (extraExports.selfTest): compiled on first use, kept while the agent lives. */
let selfTestModule = null;

function allocatorModule() {
  return IS_DARWIN ? Process.findModuleByName(LOGGER_MODULE) : libcModule();
}

/* The allocator's own export, not a same-named one from another module (the agent's). */
function familyAddress(name) {
  const m = allocatorModule();
  if (m !== null) {
    const p = m.findExportByName(name);
    if (p !== null)
      return p;
  }
  return Module.findGlobalExportByName(name);
}

function loggerVariable(name, moduleName) {
  const m = Process.findModuleByName(moduleName);
  if (m !== null) {
    const p = m.findExportByName(name);
    if (p !== null)
      return p;
    const s = m.enumerateSymbols().find(x => x.name === name);
    if (s !== undefined)
      return s.address;
  }
  return null;
}

function chooseBackend(config) {
  if (config.backend === 'symbols' || !IS_DARWIN)
    return 'symbols';
  return loggerVariable('malloc_logger', LOGGER_MODULE) !== null ? 'logger' : 'symbols';
}

export const tracer = {
  name: 'malloc',

  symbols(config) {
    const wanted = FAMILY.map(name => ({ name, resolve: () => familyAddress(name), role: 'hook' }));
    if (IS_DARWIN) {
      wanted.push({ name: 'malloc_logger', module: LOGGER_MODULE, role: 'logger',
        resolve: () => loggerVariable('malloc_logger', LOGGER_MODULE) });
      wanted.push({ name: '__syscall_logger', module: SYSCALL_LOGGER_MODULE, role: 'logger',
        resolve: () => loggerVariable('__syscall_logger', SYSCALL_LOGGER_MODULE) });
      wanted.push({ name: 'malloc_zone_statistics', role: 'calibration' });
      wanted.push({ name: 'task_info', role: 'calibration' });
    } else {
      wanted.push({ name: 'mallinfo2', role: 'calibration' });
    }
    return wanted;
  },

  init(config, sources) {
    if (config.leaks) {
      // A leak is reported with its stack: every tracked block needs one.
      config.stackThreshold = Math.min(config.stackThreshold, config.liveThreshold);
    }
    const extra = {};
    for (const name of FAMILY) {
      const slot = Memory.alloc(Process.pointerSize);
      mallocState.realSlots[name] = slot;
      extra['real_' + name] = slot;
    }
    Object.assign(extra, leakSymbols());
    const info = buildCore(config, sources, extra);
    mallocState.backend = chooseBackend(config);
    info.backend = mallocState.backend;
    info.stackThreshold = config.stackThreshold;
    return info;
  },

  install(config) {
    const cm = core.cm;
    if (mallocState.backend === 'logger') {
      for (const [name, mod] of [['malloc_logger', LOGGER_MODULE], ['__syscall_logger', SYSCALL_LOGGER_MODULE]]) {
        const v = loggerVariable(name, mod);
        if (v === null)
          continue;
        const previous = v.readPointer();
        if (!previous.isNull())
          warn(`${name} was already set (${previous}); memtrace replaces it for the window`);
        mallocState.loggerSlots.push({ name, address: v, previous });
      }
      setEnabled(true);
      for (const s of mallocState.loggerSlots)
        s.address.writePointer(cm.mt_malloc_logger);
      return;
    }
    const seen = new Map();
    for (const name of FAMILY) {
      const target = familyAddress(name);
      if (target === null)
        continue;
      const key = target.toString();
      // glibc aliases some of the family (aligned_alloc = memalign): one hook per address.
      if (seen.has(key)) {
        mallocState.aliases[name] = seen.get(key);
        continue;
      }
      seen.set(key, name);
      try {
        const original = Interceptor.replaceFast(target, cm['mt_' + name]);
        mallocState.realSlots[name].writePointer(original);
        mallocState.replaced.push(target);
      } catch (fastError) {
        // Some entries are too short or too branchy for a fast redirect; plain
        // replace still works, and calling `target` from the replacement reaches
        // the original implementation.
        try {
          mallocState.realSlots[name].writePointer(target);
          Interceptor.replace(target, cm['mt_' + name]);
          mallocState.replaced.push(target);
          mallocState.slow.push(name);
          core.slowKinds.writeU64(core.slowKinds.readU64().or(uint64(1).shl(KINDS[name])));
        } catch (e) {
          mallocState.realSlots[name].writePointer(NULL);
          mallocState.failed[name] = String(e.message || e);
          warn(`cannot hook ${name} at ${target}: ${e.message || e}`);
        }
      }
    }
    Interceptor.flush();
    setEnabled(true);
  },

  uninstall() {
    for (const s of mallocState.loggerSlots)
      s.address.writePointer(s.previous);
    mallocState.loggerSlots = [];
    // Replacements stay callable after revert (the CModule lives on), so a
    // thread still inside one returns normally.
    for (const target of mallocState.replaced)
      Interceptor.revert(target);
    mallocState.replaced = [];
    Interceptor.flush();
    releaseThreadKey();
  },

  /* --leaks: the scan as the process exits (rpc.js dispose), while its hooks are still in. */
  beforeExit(config) {
    if (config.leaks && !mallocState.leaksDone) {
      mallocState.leaksDone = true;
      scanLeaks(config, 'exit');
    }
  },

  extraExports: {
    /* --leaks at the end of the window, before the hooks come out (the host calls it). */
    leaks(config) {
      mallocState.leaksDone = true;
      return scanLeaks(config, 'window-end');
    },
    /* libmalloc's logger argument patterns through the real C decoder. */
    decodeLoggerEvent(type, arg1, arg2, arg3, result) {
      const ev = Memory.alloc(LOGGER_EVENT.size);
      const f = new NativeFunction(core.cm.mt_logger_decode, 'void',
        ['uint32', 'uint64', 'uint64', 'uint64', 'uint64', 'pointer']);
      f(type, uint64(arg1), uint64(arg2), uint64(arg3), uint64(result), ev);
      const r = readStruct(ev, LOGGER_EVENT);
      return { op: r.op.toNumber(), kind: r.kind.toNumber(), ptr: r.ptr.toString(), size: r.size.toString(),
        old_ptr: r.old_ptr.toString(), tag: r.tag.toNumber() };
    },
    /* Drive the real logger callback with a synthetic libmalloc event (tests). */
    feedLogger(type, arg1, arg2, arg3, result) {
      const f = new NativeFunction(core.cm.mt_malloc_logger, 'void',
        ['uint32', 'uint64', 'uint64', 'uint64', 'uint64', 'uint32']);
      f(type, uint64(arg1), uint64(arg2), uint64(arg3), uint64(result), 0);
      return true;
    },
    /* memtrace doctor's self-test: n malloc(size)/free pairs through the allocator's own entry
     * (so through whatever memtrace hooked there), from one named C function (cmodule/selftest.c,
     * sent by the host) on a new thread of the target; returns that function's address so the
     * host can find it in the recorded stack. */
    selfTest(n, size, source) {
      selfTestModule = selfTestModule || new CModule(source, {
        malloc: familyAddress('malloc'), free: familyAddress('free'),
        pthread_create: Module.getGlobalExportByName('pthread_create'),
        pthread_join: Module.getGlobalExportByName('pthread_join'),
      });
      const run = new NativeFunction(selfTestModule.memtrace_doctor_run, 'int', ['int', 'uint64']);
      const rc = run(n, uint64(size));
      return { function: selfTestModule.memtrace_doctor_selftest.toString(), rc };
    },
  },
};
