/*
 * The rpc table every tracer agent serves, and its lifecycle.  The build's entry module is
 *   import { tracer } from './<tracer>.js'; serve(tracer);
 * where a tracer is { name, symbols(config), init?(config, cSources), install?(config),
 * uninstall?(config), extraExports? }.  docs/agents.md has the whole host <-> agent protocol.
 */

import { calibrate } from './calibrate.js';
import { darwinFacts } from './facts.js';
import { core, retireThreadKey, setEnabled } from './core.js';
import { flush } from './flush.js';
import { announceModules, describeModule, symbolize, unwatchModules, watchModules } from './modules.js';
import { NATIVE_PLATFORM, fridaThreadsAmong, moduleOf, now } from './platform.js';
import {
  awaitAck, buildProcess, claimProcess, hookExec, listenForAcks, proc, recordPatches, refreshAgentMemory, releaseFork,
  reportChildren, markEnding, tearDownProcess, unhookExec,
} from './process.js';
import { recon } from './recon.js';
import { walkFrames } from './stacks.js';
import { unwindLoad, unwindModules } from './unwind.js';
import {
  applyPatches, configureWorld, retireFridaKeyDestructors, skipParkedAtExit, world, worldReport,
} from './world.js';

const DRAIN_INTERVAL_MS = 100;
const MODULE_SCAN_TICKS = 10;     // modules rescanned every 10th flush
const EXIT_MESSAGE_GRACE_MS = 25;  // the goodbye's time to reach Frida's transmitter (dispose)

const life = {
  config: null,
  timer: null,
  finished: false,
  tick: 0,
  process: null,
};

const CRASH_FRAMES = 48;

// Frida's exception types and the signal each comes from on Linux and Darwin.
const SIGNALS = {
  'access-violation': 'SIGSEGV', 'guard-page': 'SIGSEGV', 'abort': 'SIGABRT', 'illegal-instruction': 'SIGILL',
  'arithmetic': 'SIGFPE', 'breakpoint': 'SIGTRAP', 'system': 'SIGSYS',
};

/* The crashing thread's stack from the exception context: the faulting pc, then its callers
 * (DWARF unwinding, which gets through a frameless leaf function; the frame-pointer chain when
 * that finds nothing).  The host symbolizes it. */
function crashStack(context) {
  const pc = context.pc.strip().toString();
  try {
    const accurate = Thread.backtrace(context, Backtracer.ACCURATE).slice(0, CRASH_FRAMES - 1)
      .map(p => p.strip().toString());
    // Unwinding from a signal context repeats the first caller once.
    if (accurate.length > 1 && accurate[0] === accurate[1])
      accurate.shift();
    if (accurate.length > 1)
      return [pc].concat(accurate);
  } catch (e) {
    // fall back to the frame pointers
  }
  try {
    if (Process.arch === 'x64')
      return walkFrames(context.pc, context.rbp, CRASH_FRAMES, context.sp);
    if (Process.arch === 'arm64')
      return walkFrames(context.pc, context.fp, CRASH_FRAMES, context.sp);
    return [pc].concat(Thread.backtrace(context, Backtracer.FUZZY).slice(0, CRASH_FRAMES - 1).map(p => p.toString()));
  } catch (e) {
    return [pc];
  }
}

/* Crashes come through the exception handler: what was recorded is flushed first, then the
 * signal, the faulting address and the crashing thread's stack.  The target's own handler (if
 * any) still runs: a recovered exception is not a death, the host only uses this when the
 * process then dies. */
function watchCrash() {
  Process.setExceptionHandler(details => {
    if (!life.finished) {
      const before = proc.acks;
      try {
        flush();
      } catch (e) {
        // keep going: reporting the crash matters more
      }
      const memory = details.memory || null;
      send({
        type: 'agent:crash', t: now(), kind: details.type, signal: SIGNALS[details.type] || null,
        address: details.address.toString(), module: moduleOf(details.address),
        memory: memory === null ? null : { operation: memory.operation, address: memory.address.toString() },
        thread: Process.getCurrentThreadId(),
        stack: crashStack(details.context),
      });
      awaitAck(before);
    }
    return false;
  });
}

/* A module was loaded (modules.js watchModules, on the loading thread, before its code runs):
 * what was recorded so far goes first, then the module; the thread waits until the host has it
 * (and its unwind table), so its frames are named and walked through from its first call. */
function moduleLoaded(desc) {
  if (life.finished)
    return;
  const before = proc.acks;
  send({ type: 'modules:update', t: now(), modules: [desc], loaded: true });
  awaitAck(before);
}

/* The traced process is about to exec (called on the exec'ing thread): flush, tell the host,
 * and wait (bounded) until it has everything, for the process image and our agent with it are
 * gone the moment execve succeeds. */
function beforeExec(path, argv) {
  if (life.finished)
    return;
  const before = proc.acks;
  flush();
  send({ type: 'process:exec', t: now(), path, argv });
  awaitAck(before);
}

/* A text the host sent, or { file, length } naming one of its cache's files (UNREADABLE: unreadable,
 * or not that length).  Anything else (a string, null for nothing) is the text itself. */
const UNREADABLE = Symbol('unreadable');

function hostText(t) {
  if (t === null || t === undefined || typeof t !== 'object' || Array.isArray(t))
    return t;
  try {
    const text = File.readAllText(t.file);
    return text.length === t.length ? text : UNREADABLE;
  } catch (e) {
    return UNREADABLE;
  }
}

/* [sources, processSources] with every file read (config.cmoduleAsm too, in place); null when one
 * cannot be.  (A caller may give no processSources, or no precompiled core: nothing to read.) */
function hostTexts(config, sources, processSources) {
  const lists = [sources, processSources].map(list => (Array.isArray(list) ? list.map(t => hostText(t)) : hostText(list)));
  if (lists.some(list => list === UNREADABLE || (Array.isArray(list) && list.includes(UNREADABLE))))
    return null;
  const asm = hostText(config.cmoduleAsm);
  if (asm === UNREADABLE)
    return null;
  if (asm !== undefined)
    config.cmoduleAsm = asm;
  return lists;
}

export function serve(tracer) {
  rpc.exports = Object.assign({
    hello() {
      return {
        platform: NATIVE_PLATFORM, arch: Process.arch, pid: Process.id,
        pointerSize: Process.pointerSize, pageSize: Process.pageSize,
        fridaVersion: Frida.version, tracer: tracer.name,
        mainModule: describeModule(Process.mainModule),
      };
    },
    fridaThreadsAmong,
    /* processSources: cmodule/process.c behind the layout header (fork and exec handling). */
    init(config, sources, processSources) {
      // The host's large texts (the C sources, the precompiled core) may come as files of its
      // cache for a local target (FridaHost._texts_by_file): read here, before anything is
      // touched; one unreadable and the host sends them inline instead.
      const texts = hostTexts(config, sources, processSources);
      if (texts === null)
        return { needTexts: true };
      [sources, processSources] = texts;
      claimProcess();      // first: a second session is refused before it touches anything
      life.config = config;
      configureWorld(config);
      const found = recon(tracer.symbols(config));
      const info = tracer.init ? tracer.init(config, sources) : {};
      life.process = buildProcess(config, processSources);
      return { recon: found, info, process: life.process };
    },
    /* options.calibrate: the "before" calibration first, returned with the start. */
    start(options) {
      const calibration = (options && options.calibrate) ? calibrate() : undefined;
      announceModules();
      proc.onExec = beforeExec;
      listenForAcks();
      // Ours (execve, the descriptor guard) before the tracer's, out after them: once a tracer's
      // JavaScript listener is live, a flush made with the world stopped may write nothing
      // (runtime/world.js, drain), so every other patch goes in before and out after them.
      hookExec();
      if (tracer.install)
        tracer.install(life.config);
      watchModules(moduleLoaded);
      watchCrash();
      // After every hook is in (Frida's, the tracer's, ours): what a fork child must undo.
      const patches = recordPatches();
      refreshAgentMemory(core.owned, true);
      life.tick = 1;
      life.timer = setInterval(() => {
        flush();
        reportChildren();
        if (life.tick++ % MODULE_SCAN_TICKS === 0) {
          announceModules();
          refreshAgentMemory(core.owned);
        }
      }, DRAIN_INTERVAL_MS);
      return { t: now(), process: patches, calibration };
    },
    flush() {
      flush();
      return { t: now() };
    },
    stop() {
      if (life.finished)
        return { t: now() };
      life.finished = true;
      if (life.timer !== null)
        clearInterval(life.timer);
      setEnabled(false);
      if (tracer.uninstall)
        tracer.uninstall(life.config);
      unhookExec();
      markEnding();
      try {
        retireFridaKeyDestructors();    // hooks out: no thread runs Frida's TSD destructors any more (world.js)
      } catch (e) {
        world.fridaKeys.why = `${e.message || e}`;
      }
      unwatchModules();
      flush();
      reportChildren();
      announceModules();
      return { t: now(), world: worldReport() };
    },
    /* How every patch went: stopped or running, retries, waits for threads inside our code. */
    world() {
      return worldReport();
    },
    /* Frida calls dispose on every way out (frida-core's ScriptEngine, TerminationReason):
     *   'exit'   the process exits (from Frida's exit monitor: a JavaScript listener on exit()
     *            deadlocks against it);
     *   'unload' the script is unloaded: after our own detach, or because the host went away
     *            (memtrace killed, cable unplugged) -- then the process lives on without us;
     *   'exec'   with Frida's child gating only (memtrace does not use it: see process.js).
     * Whatever the reason, nothing of ours may stay reachable from the process afterwards. */
    dispose(reason) {
      const first = !life.finished;
      life.finished = true;
      if (life.timer !== null)
        clearInterval(life.timer);
      if (first && reason !== 'unload') {
        try {
          // A tracer's last look at the exiting process, hooks still in (malloc --leaks scans
          // here); not when the host is gone (nobody would read it) or after our own stop.
          if (tracer.beforeExit)
            tracer.beforeExit(life.config);
        } catch (e) {
          send({ type: 'agent:warning', message: `at exit: ${e.message || e}` });
        }
      }
      if (first) {
        try {
          flush();
        } catch (e) {
          // the process (or the host) is going away; nothing more to save
        }
      }
      // Take our hooks out before Frida tears the agent down: its teardown with replaced
      // allocator entries still in place hangs the exiting process.
      setEnabled(false);
      if (reason === 'exit') {
        try {
          skipParkedAtExit();     // the exiting thread, held by Frida until we return (world.js)
        } catch (e) {
          // the patches below are then made as before
        }
      }
      try {
        if (first && tracer.uninstall)
          tracer.uninstall(life.config);
        unhookExec();
        unwatchModules();
        Interceptor.detachAll();
        applyPatches('teardown');
        if (first) {
          flush();   // what uninstall itself reported (the fd tracer's end census)
          reportChildren();
        }
      } catch (e) {
        // keep going: the goodbye message and the teardown matter more
      }
      if (first && reason !== 'unload') {
        let calibration = null;
        try {
          calibration = calibrate(true);
        } catch (e) {
          calibration = null;
        }
        send({
          type: 'agent:exit', t: now(), exiting: true,
          status: null,
          how: reason === 'exec' ? 'process exec' : 'process exit',
          calibration,
          world: worldReport(),     // how the exit's patches went (tests/integration/test_exit_patches.py)
        });
        // A message sent here reaches Frida's transmitter through the agent's main context (an idle
        // source posted from this, the JavaScript thread); Frida's exit path flushes its connection
        // once dispose has returned, and that can run before the idle does: the message is then
        // lost with the process (frida/frida#3749). A short sleep lets the main context take it
        // first: wall time at the exit, no CPU. Without it, a single-threaded program's exit --
        // whose patches no longer stop the world, so dispose returns sooner -- lost its goodbye
        // 3 times in 160 at load 8 ("detached: lost the channel"); with it 0 in 160.
        if (reason === 'exit')
          Thread.sleep(EXIT_MESSAGE_GRACE_MS / 1000);
      }
      // The key first (its stub turns into a return), then every other stub, and the wait for
      // threads still inside a hook.
      retireThreadKey();
      if (reason === 'unload') {
        try {
          retireFridaKeyDestructors();    // done already after our own stop; not at exit
        } catch (e) {
          // the teardown matters more
        }
      }
      tearDownProcess(reason === 'unload');
    },
    /* A followed fork child waits in its atfork handler until its new agent says go. */
    releaseFork(entry, pid) {
      return releaseFork(entry, pid);
    },
    symbolize(addresses) {
      return symbolize(addresses);
    },
    /* memtrace doctor's runtime facts (runtime/facts.js). */
    darwinFacts() {
      return darwinFacts();
    },
    calibrate() {
      return calibrate();
    },
    /* Unwind tables for modules without frame pointers (runtime/unwind.js). */
    unwindModules() {
      return unwindModules();
    },
    unwindLoad(entries, data) {
      return unwindLoad(entries, data);
    },
  }, tracer.extraExports || {});
}
