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
import { buildCore, core, setEnabled } from './runtime/core.js';
import { warn } from './runtime/flush.js';
import { LOGGER_MODULES, drainLogger, familyFor, ignoreAgentThread, loggerSymbols, loggerVariable,
  releaseThreadKey, selfTask } from './runtime/logger.js';
import { IS_DARWIN, libcModule } from './runtime/platform.js';
import { readStruct } from './runtime/structs.js';

/* The replaced entries; each one's call kind is KINDS[name] (layout.js), its C replacement mt_<name>. */
const FAMILY = ['malloc', 'calloc', 'realloc', 'free', 'posix_memalign', 'memalign',
  'aligned_alloc', 'valloc', 'pvalloc'];

const LOGGER_MODULE = LOGGER_MODULES.malloc_logger;
const SYSCALL_LOGGER_MODULE = LOGGER_MODULES.__syscall_logger;
const DRAIN_TIMEOUT_MS = 1000;

const mallocState = {
  drain: null,
  tlsKey: null,
  agentThreadIgnored: false,
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

/* Darwin: the logger unless told otherwise.  Linux: the logger only when asked for and the
 * stand-in libmtmalloc is loaded (tests of the Darwin path). */
function chooseBackend(config) {
  if (config.backend === 'symbols' || (!IS_DARWIN && config.backend !== 'logger'))
    return 'symbols';
  return loggerVariable('malloc_logger') !== null ? 'logger' : 'symbols';
}

export const tracer = {
  name: 'malloc',

  symbols(config) {
    const wanted = familyFor(FAMILY, IS_DARWIN).map(name => ({ name, resolve: () => familyAddress(name), role: 'hook' }));
    if (IS_DARWIN || config.backend === 'logger') {
      wanted.push({ name: 'malloc_logger', module: LOGGER_MODULE, role: 'logger',
        resolve: () => loggerVariable('malloc_logger') });
      wanted.push({ name: '__syscall_logger', module: SYSCALL_LOGGER_MODULE, role: 'logger',
        resolve: () => loggerVariable('__syscall_logger') });
    }
    if (IS_DARWIN) {
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
    Object.assign(extra, leakSymbols(), loggerSymbols());
    const info = buildCore(config, sources, extra);
    mallocState.backend = chooseBackend(config);
    info.backend = mallocState.backend;
    info.stackThreshold = config.stackThreshold;
    info.self_task = selfTask();
    mallocState.tlsKey = info.tlsKey;
    return info;
  },

  install(config) {
    const cm = core.cm;
    // The agent's JavaScript thread (rpcs, timers, symbolization) allocates for the agent only.
    mallocState.agentThreadIgnored = ignoreAgentThread(cm);
    if (mallocState.backend === 'logger') {
      for (const name of ['malloc_logger', '__syscall_logger']) {
        const v = loggerVariable(name);
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
    const hadLogger = mallocState.loggerSlots.length > 0;
    for (const s of mallocState.loggerSlots)
      s.address.writePointer(s.previous);
    mallocState.loggerSlots = [];
    if (hadLogger) {
      // Unloading the script frees the callback's code: no thread may still be inside it.
      mallocState.drain = drainLogger(core.cm, DRAIN_TIMEOUT_MS);
      if (!mallocState.drain.drained)
        warn(`${mallocState.drain.inflight} malloc_logger call(s) still in flight after ${mallocState.drain.waited_ms} ms`);
    }
    // Replacements stay callable after revert (the CModule lives on), so a
    // thread still inside one returns normally.
    for (const target of mallocState.replaced)
      Interceptor.revert(target);
    mallocState.replaced = [];
    Interceptor.flush();
    if (mallocState.tlsKey !== null && releaseThreadKey(mallocState.tlsKey))
      mallocState.tlsKey = null;
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
    /* libmalloc's logger argument patterns through the real C decoder (selfTask: the task that is
     * ours, '0x0' for unknown). */
    decodeLoggerEvent(type, arg1, arg2, arg3, result, selfTaskPort) {
      const ev = Memory.alloc(LOGGER_EVENT.size);
      const f = new NativeFunction(core.cm.mt_logger_decode, 'void',
        ['uint32', 'uint64', 'uint64', 'uint64', 'uint64', 'uint64', 'pointer']);
      f(type, uint64(arg1), uint64(arg2), uint64(arg3), uint64(result), uint64(selfTaskPort || '0x0'), ev);
      const r = readStruct(ev, LOGGER_EVENT);
      return { op: r.op.toNumber(), kind: r.kind.toNumber(), ptr: r.ptr.toString(), size: r.size.toString(),
        old_ptr: r.old_ptr.toString(), tag: r.tag.toNumber(), skip: r.skip.toNumber() };
    },
    /* How the last uninstall drained the logger: {drained, waited_ms, inflight} (null: no logger). */
    loggerDrain() {
      return mallocState.drain || null;
    },
    /* Calls the target's malloc/free from the agent's own thread (tests: they must not count). */
    mallocOnAgentThread(n, size) {
      const m = new NativeFunction(familyAddress('malloc'), 'pointer', ['size_t']);
      const f = new NativeFunction(familyAddress('free'), 'void', ['pointer']);
      for (let i = 0; i < n; i++)
        f(m(size));
      return { ignored: mallocState.agentThreadIgnored === true };
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
