/*
 * The target process's lifecycle, as it touches the agent: leaked stubs for every function
 * pointer handed to the C library, fork children (cmodule/process.c), exec, and teardown.
 *
 * Why stubs: the C library keeps a pthread key's destructor and an atfork handler for the
 * process's lifetime, but Frida unloads our code when the host goes away (SIGKILLed memtrace,
 * unplugged cable).  A thread exiting afterwards would jump into unmapped memory.  So the C
 * library is given a 16-byte stub in a page that is never freed, which jumps to our function
 * while the agent lives and to a `ret` once it is torn down (the key's whole life: core.js,
 * retireThreadKey).
 *
 * Linux only for stubs, fork and exec (an iOS app cannot fork, and execs by replacing itself with
 * posix_spawn's SETEXEC only; DEVICE-UNVERIFIED there: nothing is installed on Darwin but the
 * key's destructor, which is retired by deleting the key, see core.js).
 */

import { AGENT_MEMORY, AGENT_MEMORY_RANGES, AGENT_MEMORY_TABLE, FD_DUP_REFUSED, FD_GUARD_MAX, FD_RANGES, FORK_ORIGINS, MAX_PATCHES, PATCH_BYTES,
  PROC } from '../layout.js';
import { IS_DARWIN, findExport, libcExport, libcModule, moduleSymbol, now } from './platform.js';
import { readStruct, writeField, writeStruct } from './structs.js';
import {
  applyPatches, buildWorld, deferPatch, fridaThreads, moduleCode, notePatched, quiesce, revertWhenStopped, world,
  SIGSTOP_BYTES, signalStopSymbols, TEXT_LEAD_C, uninstallSignalStop, WORLD_MACH_SYMBOLS, writeWhenStopped,
} from './world.js';

const STUB_PAGE = 4096;
const STUB_SIZE = 16;
const ACK_TIMEOUT_MS = 2000;        // an exec or a crash waits this long at most for the host to have its data
const FD_GUARD_SCAN = 4096;           // descriptors asked of Cloak at each refresh
const FD_GUARD_REFRESH_MS = 1000;
const FORK_PAGE_BYTES = 64 * 1024;   // the MAP_SHARED page fork children post in (process.c mt_forks)
const MADV_REMOVE = 9;                // frees a shared mapping's pages (releaseForkPage)
const FORK_MASKS_BYTES = 64 * 1024;  // process.c's MtForkMask table (64 entries of 152 bytes fit)
const MASK_HELPER_STACK = 64 * 1024;  // process.c's mt_mask_threads helper
const MASK_MAX_THREADS = 1024;        // Frida's threads masked per call
const MASK_LIST_THREADS = 8192;       // world.js's MAX_THREADS: the listing's buffer
// Signals Frida's threads block (process.c, mt_mask_threads): every one but the faults a thread
// raises on itself (4 SIGILL, 5 SIGTRAP, 6 SIGABRT, 7 SIGBUS, 8 SIGFPE, 11 SIGSEGV, 13 SIGPIPE,
// 25 SIGXFSZ, 31 SIGSYS), SIGKILL and SIGSTOP (9, 19) and glibc's own (32, 33).
const SIGNALS_KEPT = [4, 5, 6, 7, 8, 9, 11, 13, 19, 25, 31, 32, 33];
const BUSY_WAIT_MS = 200;           // teardown waits this long at most for threads inside a hook
// After the hooks are out, a thread may still be inside a replacement that was called just
// before (in the real allocator, waiting on its lock, say), and will return into our code:
// when Frida is about to free that code (the process lives on), give such threads this long.
const UNLOAD_GRACE_MS = 150;

const ORIGIN_NAMES = Object.fromEntries(Object.entries(FORK_ORIGINS).map(([k, v]) => [v, k]));

export const proc = {
  cm: null,
  worldCm: null,      // cmodule/world.c built with MT_DARWIN (buildMachWorld): run by this thread only
  mem: null,
  stubPage: null,
  execJump: null,     // the execve jump's write, for applyPatches to make with the world stopped
  fdGuard: null,      // {hooked: [targets], timer}: close/close_range/closefrom redirected
  signalsOff: null,   // {masked: Set of Frida's thread ids whose mask holds the program's signals, ...}
  maskPrepare: null,  // the atfork prepare stub that blocks signals across fork
  stubsUsed: 0,
  stubs: [],          // {stub, slot, target}: armed stubs
  execTarget: null,
  execHooked: false,
  execSlow: false,    // execve redirected by Interceptor.replace (too short for replaceFast)
  execSaved: null,    // execve's first bytes, where our own jump replaced them (hookExec)
  spawnHooks: [],     // posix_spawn/posix_spawnp listeners (with a slow execve hook)
  acks: 0,
  forksReported: 0,
  torn: false,
  forkPageReleased: false,   // the fork page's memory given back at unload (releaseForkPage)
  pristine: null,     // libc's executable segments from its file (readPristine)
  busyProbe: null,    // () => threads inside a hook (set by the core when it has one)
  onExec: null,       // (path, argv) before the traced process execs (rpc.js)
  mark: null,         // our session's mark (claimProcess), or null
  staleMarks: 0,      // marks of sessions gone without taking theirs off, taken off (marksOfThisProcess)
  quiesce: null,      // how the wait for threads inside process.c's code ended (unhookExec)
  agentMemory: null,  // the tables a fork child finds the agent's memory in (agentMemoryTables), or null
  inherited: null,    // in a followed fork child: the parent agent's memory, {ranges: sorted {lo, hi}, truncated, age_ms}
  lastLook: undefined,   // the agent's memory at the last look (refreshAgentMemory), sorted {lo, hi}
  stableLook: [],     // ... what of it the look before held too: what the tables say (writeAgentMemory)
};

function nf(name, ret, args) {
  const p = libcExport(name);
  return p === null ? null : new NativeFunction(p, ret, args);
}

/* fn() -- a CModule built by Frida's external toolchain, whose compiler runs as a child of the
 * target with the target's environment.  In a program at the hold point (config.programHeld,
 * FridaHost.program_held: before its first constructor, so no thread of its own exists) that
 * environment is the compiler's for fn's time: the hold's children variable out (under
 * --follow-children's hold the compiler would wait to be followed like any process the target
 * starts) and config.cmoduleGccDir first on PATH (the host's stand-in for gcc, which hands back a
 * module built before from the same source: frida_host.py gcc_cache_shim).  In a running program
 * nothing is written: setenv there races its threads' getenv and setenv, and would show them what
 * only the compiler was to see (tests/integration/test_environ_untouched.py). */
const HOLD_CHILDREN_ENV = 'MEMTRACE_HOLD_CHILDREN';

export function withCompilerEnv(config, fn) {
  restoreEnviron();
  if (!config.programHeld)
    return fn();
  const gccDir = config.cmoduleGccDir;
  const withPath = gccDir
    ? () => withEnv('PATH', old => `${gccDir}:${old === null ? '/usr/local/bin:/usr/bin:/bin' : old}`, fn)
    : fn;
  return withEnv(HOLD_CHILDREN_ENV, old => (old === null ? undefined : null), withPath);
}

/* fn() with environment variable `name` set to change(its value, or null) -- null unsets it,
 * undefined leaves it as it is -- and put back as it was afterwards. */
function withEnv(name, change, fn) {
  const getenv = nf('getenv', 'pointer', ['pointer']);
  const setenv = nf('setenv', 'int', ['pointer', 'pointer', 'int']);
  const unsetenv = nf('unsetenv', 'int', ['pointer']);
  if (getenv === null || setenv === null || unsetenv === null)
    return fn();
  const cname = Memory.allocUtf8String(name);
  const value = getenv(cname);
  const saved = value.isNull() ? null : Memory.allocUtf8String(value.readUtf8String());
  const wanted = change(saved === null ? null : saved.readUtf8String());
  if (wanted === undefined)
    return fn();
  if (wanted === null)
    unsetenv(cname);
  else
    setenv(cname, Memory.allocUtf8String(wanted), 1);
  try {
    return fn();
  } finally {
    if (saved === null)
      unsetenv(cname);
    else
      setenv(cname, saved, 1);
  }
}

/* A program held before its constructors (memtrace.hold) had libc's initializer run on Frida's
 * injecting thread with no environment: until the program goes on, `environ` is NULL, and the
 * compiler the external toolchain starts from here would get none (gcc then cannot find cc1).
 * The program's own is on its initial stack: proc(5)'s startstack points at argc, then argv,
 * NULL, envp.  (Once released, the hold library sets libc's state again on the main thread.) */
function restoreEnviron() {
  const environ = libcExport('__environ') || libcExport('environ');
  if (environ === null || !environ.readPointer().isNull())
    return;
  try {
    const stat = File.readAllText('/proc/self/stat');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const sp = ptr(fields[28 - 3]);
    const argc = sp.readU64().toNumber();
    environ.writePointer(sp.add((argc + 2) * Process.pointerSize));
  } catch (e) {
    // left as it is: the external toolchain fails and TinyCC compiles instead
  }
}

/* ---- stubs in leaked memory ------------------------------------------------------------ */

function stubArch() {
  return (Process.arch === 'x64' || Process.arch === 'arm64') && !IS_DARWIN;
}

function stubPage() {
  if (proc.stubPage !== null)
    return proc.stubPage;
  const mmap = nf('mmap', 'pointer', ['pointer', 'size_t', 'int', 'int', 'int', 'long']);
  if (mmap === null)
    return null;
  // PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS: never unmapped, on purpose.
  const page = mmap(NULL, STUB_PAGE, 5, 0x22, -1, 0);
  if (page.equals(ptr('-1')))
    return null;
  Memory.patchCode(page, STUB_SIZE, code => {
    if (Process.arch === 'x64')
      code.writeU8(0xc3);                      // ret
    else
      code.writeU32(0xd65f03c0);               // ret
  });
  proc.stubPage = page;
  proc.stubsUsed = 1;                          // stub 0 is the ret
  return page;
}

/* A stub jumping to `target`, or `target` itself where stubs are not made (then teardown
 * relies on pthread_key_delete alone). */
export function leakedStub(target) {
  if (!stubArch())
    return target;
  const page = stubPage();
  if (page === null || proc.stubsUsed * STUB_SIZE >= STUB_PAGE)
    return target;
  const stub = page.add(proc.stubsUsed++ * STUB_SIZE);
  Memory.patchCode(stub, STUB_SIZE, code => {
    if (Process.arch === 'x64') {
      code.writeByteArray([0xff, 0x25, 0x02, 0x00, 0x00, 0x00, 0x90, 0x90]);   // jmp [rip+2]
      code.add(8).writePointer(target);
    } else {
      // ARCH-UNVERIFIED: arm64 Linux stubs have never run (the tests run on x86-64).
      code.writeU32(0x58000050);                 // ldr x16, #8
      code.add(4).writeU32(0xd61f0200);          // br x16
      code.add(8).writePointer(target);
    }
  });
  proc.stubs.push({ stub, slot: stub.add(8), target });
  return stub;
}

/* `stub` (from leakedStub) returns at once from now on; false when it is no armed stub. */
export function disarmStub(stub) {
  const i = proc.stubs.findIndex(s => s.stub.equals(stub));
  if (i < 0)
    return false;
  Memory.patchCode(proc.stubs[i].slot, 8, code => code.writePointer(proc.stubPage));
  proc.stubs.splice(i, 1);
  return true;
}

/* Every stub now returns at once: called before Frida frees the code they pointed at. */
function disarmStubs() {
  while (proc.stubs.length > 0)
    disarmStub(proc.stubs[0].stub);
}

/* ---- the process CModule (fork, exec) ------------------------------------------------- */

/*
 * cmodule/world.c alone, built with MT_DARWIN: the world stopped by Mach thread suspension
 * (task_threads, thread_suspend, thread_get_state) around every patch.  On Darwin it is the whole
 * process CModule (iOS apps cannot fork: no process.c).  On Linux only when the host asks
 * (config.worldMach, from MEMTRACE_WORLD_MACH: the path of the Darwin stand-in library,
 * demo/darwin/mtmach.c, whose calls behave as xnu's), so that the Darwin stop runs for real here:
 * the storms patch every tracer's hooks under it (tests/stress/hook_storm.py --world mach).  Its
 * code runs on this thread only, never on a target thread: nothing to quiesce before it is freed.
 * DEVICE-UNVERIFIED on a device.
 */
// The Mach stop's calls that are the C library's, not the Mach stand-in's.
const MACH_LIBC_NAMES = new Set(['usleep']);


function buildMachWorld(config, sources) {
  let lib = null;
  if (!IS_DARWIN) {
    lib = Process.enumerateModules().find(m => m.path === config.worldMach) || null;
    if (lib === null && config.programHeld) {
      // Loading it now would wait for the loader's lock, which the held main thread has.
      world.why = `the Mach stand-in ${config.worldMach} is not preloaded (LD_PRELOAD) into the held program`;
      return;
    }
    try {
      lib = lib || Module.load(config.worldMach);
    } catch (e) {
      world.why = `the Mach stand-in ${config.worldMach} could not be loaded: ${e.message}`;
      return;
    }
  }
  const symbols = {};
  for (const name of WORLD_MACH_SYMBOLS) {
    // The stand-in hides the two names its sibling libmtdarwin.so also defines (demo/darwin/mtmach.c);
    // the C library's (usleep) are the process's own.
    const p = lib !== null && !MACH_LIBC_NAMES.has(name) ? moduleSymbol(lib, name) : findExport(name);
    if (p === null) {
      world.why = `the Mach stop cannot be built: ${name} not found`;
      return;
    }
    symbols[name] = p;
  }
  if (lib !== null) {
    // Frida's thread ids here are Linux's: the stand-in names threads by them from now on, as
    // task_threads' names are Frida's ids on Darwin (Cloak.hasThread, getCurrentThreadId).
    const byId = lib.findExportByName('mtmach_name_threads_by_id');
    if (byId === null) {
      world.why = `${config.worldMach} is not the Mach stand-in (no mtmach_name_threads_by_id)`;
      return;
    }
    new NativeFunction(byId, 'void', [])();
  }
  const defines = '#define MT_DARWIN 1\n' + (Process.arch === 'arm64' ? '#define MT_ARM64 1\n' : '');
  // The layout header and world.c: everything before process.c (the host may send the files
  // joined in one text).
  const text = Array.isArray(sources) ? sources.join('\n') : String(sources);
  const processC = text.indexOf('#line 1 "process.c"');
  try {
    proc.worldCm = new CModule(defines + (processC < 0 ? text : text.slice(0, processC)), symbols);
  } catch (e) {
    world.why = `cmodule/world.c (Mach) did not compile: ${String(e.message || e).split('\n')[0]}`;
    return;
  }
  buildWorld(proc.worldCm, true);
}

/* Compiles cmodule/world.c and process.c (sources: the layout header, then both) -- stopping the
 * world around every patch (world.js) -- and registers the fork handler.  Returns what the host records (or why fork children are not guarded). */
export function buildProcess(config, sources) {
  if (IS_DARWIN) {
    buildMachWorld(config, sources || '');
    return { guard: false, why: 'not on Darwin (iOS apps cannot fork)' };
  }
  if (!sources || sources.length === 0)
    return { guard: false, why: 'no sources' };
  const mmap = nf('mmap', 'pointer', ['pointer', 'size_t', 'int', 'int', 'int', 'long']);
  const registerAtfork = nf('__register_atfork', 'int', ['pointer', 'pointer', 'pointer', 'pointer']);
  if (mmap === null || registerAtfork === null)
    return { guard: false, why: 'mmap or __register_atfork not found' };

  const sharedBytes = FORK_PAGE_BYTES;
  // PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS: the page the fork children post in.
  const forks = mmap(NULL, sharedBytes, 3, 0x21, -1, 0);
  if (forks.equals(ptr('-1')))
    return { guard: false, why: 'mmap of the shared page failed' };
  const mem = {
    proc: Memory.alloc(PROC.size),
    patchAddress: Memory.alloc(MAX_PATCHES * 8),
    patchLength: Memory.alloc(MAX_PATCHES * 8),
    patchBytes: Memory.alloc(MAX_PATCHES * PATCH_BYTES),
    realExecve: Memory.alloc(Process.pointerSize),
    forkMasks: Memory.alloc(FORK_MASKS_BYTES),
    fdGuard: Memory.alloc(FD_GUARD_MAX / 8),
    fdState: Memory.alloc(16 * 8),
    realClose: Memory.alloc(Process.pointerSize),
    realCloseRange: Memory.alloc(Process.pointerSize),
    realDup2: Memory.alloc(Process.pointerSize),
    realDup3: Memory.alloc(Process.pointerSize),
    maskStack: Memory.alloc(MASK_HELPER_STACK),
    maskTids: Memory.alloc(MASK_MAX_THREADS * 8),
    maskList: Memory.alloc(MASK_LIST_THREADS * 8),
    takeOut: Memory.alloc(16),
    takePath: Memory.alloc(256),
    diffOut: Memory.alloc((MAX_PATCHES + 1) * 16),
    forks,
  };
  // --follow-children --leaks: the tables a fork child's scan finds the agent's memory in.
  proc.agentMemory = (config.followChildren && config.leaks) ? agentMemoryTables() : null;
  mem.onExec = new NativeCallback((path, argv) => {
    try {
      if (proc.onExec !== null)
        proc.onExec(readCString(path), readArgv(argv));
    } catch (e) {
      // never stand between the target and its exec
    }
  }, 'void', ['pointer', 'pointer']);
  mem.onExecFailed = new NativeCallback(error => {
    try {
      send({ type: 'process:exec-failed', t: now(), errno: error });
    } catch (e) {
      // nothing to do
    }
  }, 'void', ['int']);

  const symbols = {
    mt_fork_masks: mem.forkMasks,
    mt_fd_guard: mem.fdGuard,
    mt_fd_state: mem.fdState,
    mt_real_close: mem.realClose,
    mt_real_close_range: mem.realCloseRange,
    mt_real_dup2: mem.realDup2,
    mt_real_dup3: mem.realDup3,
    pthread_sigmask: libcExport('pthread_sigmask'),
    pthread_self: libcExport('pthread_self'),
    mt_proc: mem.proc,
    mt_patch_address: mem.patchAddress,
    mt_patch_length: mem.patchLength,
    mt_patch_bytes: mem.patchBytes,
    mt_forks: forks,
    mt_real_execve: mem.realExecve,
    mt_on_exec: mem.onExec,
    mt_on_exec_failed: mem.onExecFailed,
    mprotect: libcExport('mprotect'),
    getpid: libcExport('getpid'),
    getppid: libcExport('getppid'),
    usleep: libcExport('usleep'),
    __errno_location: libcExport('__errno_location'),
    // cmodule/world.c
    clone: libcExport('clone'),
    ptrace: libcExport('ptrace'),
    waitpid: libcExport('waitpid'),
    prctl: libcExport('prctl'),
    open: libcExport('open'),
    close: libcExport('close'),
    read: libcExport('read'),
    syscall: libcExport('syscall'),
    process_vm_readv: libcExport('process_vm_readv'),
  };
  for (const [k, v] of Object.entries(symbols)) {
    if (v === null)
      return { guard: false, why: `${k} not found` };
  }
  // The signal stop for seccomp'd processes (cmodule/world.c MT_WORLD_SIGSTOP): x86-64's
  // ucontext only (ARCH-UNVERIFIED elsewhere: arm64 keeps the world running there).
  let defines = Process.arch === 'arm64' ? '#define MT_ARM64 1\n' : '';
  const sigstop = signalStopSymbols();
  if (sigstop !== null) {
    defines += '#define MT_WORLD_SIGSTOP 1\n';
    Object.assign(symbols, sigstop);
  }
  const cm = new CModule(defines + TEXT_LEAD_C + sources.join('\n'), symbols);
  if (cm.mt_sigstop_size !== undefined &&
      Number(new NativeFunction(cm.mt_sigstop_size, 'uint64', [])()) > SIGSTOP_BYTES)
    throw new Error('memtrace agent: MtSigStop outgrew its allocation');
  if (Number(new NativeFunction(cm.mt_forks_size, 'uint64', [])()) > sharedBytes)
    throw new Error('memtrace agent: the fork page outgrew its mapping');
  if (Number(new NativeFunction(cm.mt_proc_size, 'uint64', [])()) !== PROC.size)
    throw new Error('memtrace agent: MtProc in C and layout.js disagree');
  writeStruct(mem.proc, PROC, {
    agent_pid: Process.id,
    follow: config.followChildren ? 1 : 0,
    wait_ms: Math.max(0, Math.round(config.childWaitMs || 0)),
    n_patches: 0,
    page_size: Process.pageSize,
    exec_notify: 0,
    forks: 0,
    reserved: 0,
    agent_memory: proc.agentMemory === null ? 0 : uint64(proc.agentMemory.toString()),
  });
  proc.cm = cm;
  proc.mem = mem;
  if (typeof config.worldMach === 'string')
    buildMachWorld(config, sources);
  else
    buildWorld(cm);
  proc.pristine = readPristine();
  mem.take = new NativeFunction(cm.mt_fork_take, 'int', ['pointer', 'pointer', 'int']);
  mem.entry = new NativeFunction(cm.mt_fork_entry, 'pointer', ['int']);
  mem.lost = new NativeFunction(cm.mt_fork_lost, 'int', []);
  mem.agentMemoryOf = new NativeFunction(cm.mt_fork_agent_memory, 'uint64', ['pointer', 'int']);
  const child = leakedStub(cm.mt_fork_child);
  if (child.equals(cm.mt_fork_child))
    return { guard: false, why: 'no leaked stub for the fork handler on this architecture' };
  if (registerAtfork(NULL, NULL, child, NULL) !== 0)
    return { guard: false, why: '__register_atfork failed' };
  // Signals held across fork's arena-locked window (process.c): registered after the child
  // handler above, so in a child the mask comes back once that handler is done.
  if (new NativeFunction(cm.mt_fork_masks_size, 'int', [])() > FORK_MASKS_BYTES)
    return { guard: false, why: 'the fork signal-mask table outgrew its allocation' };
  proc.maskPrepare = leakedStub(cm.mt_fork_prepare);
  mem.masksBusy = new NativeFunction(cm.mt_fork_masks_busy, 'int', []);
  if (registerAtfork(proc.maskPrepare, leakedStub(cm.mt_fork_parent), leakedStub(cm.mt_fork_child_unmask),
                     NULL) !== 0)
    return { guard: false, why: '__register_atfork failed (signal masks)' };
  return { guard: true, follow: !!config.followChildren, waitMs: config.childWaitMs || 0 };
}

function readCString(p) {
  try {
    return p.isNull() ? null : p.readUtf8String();
  } catch (e) {
    return null;
  }
}

function readArgv(argv) {
  const out = [];
  try {
    for (let i = 0; i < 256 && !argv.isNull(); i++) {
      const a = argv.add(i * Process.pointerSize).readPointer();
      if (a.isNull())
        break;
      out.push(readCString(a));
    }
  } catch (e) {
    // a partial argv is still worth reporting
  }
  return out;
}

/* execve goes through cmodule/process.c's mt_execve while the window is open. */
export function hookExec() {
  if (proc.cm === null || proc.execHooked)
    return;
  const target = libcExport('execve');
  if (target === null)
    return;
  // The jump is prepared first (its symbol lookup would end Interceptor's transaction); the
  // redirect itself is made by applyPatches once the world is stopped (deferPatch), so a refused
  // patch leaves execve untouched.
  const jump = jumpExecve(target) ? proc.execJump : null;
  proc.execJump = null;
  let made = false;
  notePatched(target, false, true);
  deferPatch(() => {
    made = true;
    try {
      const original = Interceptor.replaceFast(target, proc.cm.mt_execve);
      proc.mem.realExecve.writePointer(original);
      proc.execSaved = null;
    } catch (e) {
      if (jump !== null) {
        proc.mem.realExecve.writePointer(proc.cm.mt_execve_raw);
        writeWhenStopped(jump);
      } else {
        // The replacement calling `target` reaches the original.  ARCH-UNVERIFIED: where the
        // x86-64 jump is not made (arm64 Linux) this path, with hookSpawn, has not been run.
        proc.mem.realExecve.writePointer(target);
        Interceptor.replace(target, proc.cm.mt_execve);
        proc.execSlow = true;
      }
    }
  });
  applyPatches('execve hook in');
  if (made) {
    proc.execTarget = target;
    proc.execHooked = true;
    writeField(proc.mem.proc, PROC, 'exec_notify', 1);
    if (proc.execSlow)
      hookSpawn();
  } else {
    proc.execSaved = null;    // refused: nothing of it was written (world.js refuse says so)
  }
  hookFdGuard();
  holdSignalsOffFrida();
}

/* ---- Frida's threads never run the program's signal handlers (process.c) ---------------- */

function asyncSignalMask() {
  let mask = 0n;
  for (let sig = 1; sig <= 64; sig++) {
    if (!SIGNALS_KEPT.includes(sig))
      mask |= 1n << BigInt(sig - 1);
  }
  return mask;
}

/* Masks Frida's threads not masked yet (called again on each descriptor-guard refresh: Frida
 * starts threads later too).  This thread masks itself; the helper does the others. */
function holdSignalsOffFrida() {
  if (proc.cm === null || IS_DARWIN || world.fns === null)
    return;
  const mem = proc.mem;
  if (proc.signalsOff === null) {
    const mask = asyncSignalMask();
    const set = Memory.alloc(128);
    set.writeU64(uint64(mask.toString()));
    const sigmask = nf('pthread_sigmask', 'int', ['int', 'pointer', 'pointer']);
    if (sigmask !== null)
      sigmask(0 /* SIG_BLOCK */, set, NULL);
    proc.signalsOff = {
      mask: uint64(mask.toString()),
      masked: new Set([Process.getCurrentThreadId()]),
      changed: 0,
      failed: null,
      fn: new NativeFunction(proc.cm.mt_mask_threads, 'int', ['pointer', 'uint64', 'uint64', 'pointer', 'uint64'],
        { scheduling: 'exclusive' }),
    };
  }
  const off = proc.signalsOff;
  if (off.failed !== null)
    return;
  const fresh = fridaThreads(world.fns.listTasks, mem.maskList).filter(tid => !off.masked.has(tid)).slice(0, MASK_MAX_THREADS);
  if (fresh.length === 0)
    return;
  fresh.forEach((tid, i) => mem.maskTids.add(i * 8).writeU64(tid));
  const r = off.fn(mem.maskTids, fresh.length, off.mask, mem.maskStack, MASK_HELPER_STACK);
  if (r < 0) {
    off.failed = r === -2 ? 'a seccomp filter' : 'no helper could be started';
    try {
      send({ type: 'agent:warning', message: `Frida's threads may run the program's signal handlers (${off.failed}): ` +
        'a handler that allocates can then interrupt them inside the allocator' });
    } catch (e) {
      // said or not, the capture goes on
    }
    return;
  }
  off.changed += r;
  fresh.forEach(tid => off.masked.add(tid));
}


/* ---- Frida's descriptors kept open (cmodule/process.c, mt_close) ------------------------ */

function refreshFdGuard() {
  const bits = proc.mem.fdGuard;
  const words = new Array(FD_GUARD_SCAN / 64).fill(0n);
  for (let fd = 0; fd < FD_GUARD_SCAN; fd++) {
    if (Cloak.hasFileDescriptor(fd))
      words[fd >> 6] |= 1n << BigInt(fd & 63);
  }
  words.forEach((w, i) => bits.add(i * 8).writeU64(uint64(w.toString())));
}

/* Where Frida's agent code is mapped: its own close() of its own descriptors goes through. */
function fridaCodeRanges() {
  const spans = new Map();
  let text = '';
  try {
    text = File.readAllText('/proc/self/maps');
  } catch (e) {
    return [];
  }
  for (const line of text.split('\n')) {
    if (!line.includes('frida-'))
      continue;
    const fields = line.split(/\s+/);
    const [lo, hi] = fields[0].split('-').map(h => uint64('0x' + h));
    const name = fields.slice(5).join(' ');
    const span = spans.get(name);
    if (span === undefined)
      spans.set(name, [lo, hi]);
    else
      spans.set(name, [lo.compare(span[0]) < 0 ? lo : span[0], hi.compare(span[1]) > 0 ? hi : span[1]]);
  }
  return [...spans.values()].slice(0, FD_RANGES);
}

function hookFdGuard() {
  if (proc.cm === null || proc.fdGuard !== null || IS_DARWIN)
    return;
  const state = proc.mem.fdState;
  const ranges = fridaCodeRanges();
  state.writeByteArray(new Array(16 * 8).fill(0));
  state.add(8).writeU64(ranges.length);
  ranges.forEach(([lo, hi], i) => {
    state.add(16 + 16 * i).writeU64(lo);
    state.add(24 + 16 * i).writeU64(hi);
  });
  refreshFdGuard();
  const hooked = [];
  // Every address looked up first: a symbol lookup ends Frida's Interceptor transaction, and the
  // redirects must be queued back to back for applyPatches to write them with the world stopped.
  const targets = { close: libcExport('close'), close_range: libcExport('close_range'),
    closefrom: libcExport('closefrom'), dup2: libcExport('dup2'), dup3: libcExport('dup3') };
  const redirect = (name, replacement, realSlot) => {
    const target = targets[name];
    if (target === null)
      return;
    notePatched(target, false, true);
    // Interceptor.replace, not replaceFast: the fds tracer's listeners go on close after this
    // (rpc.js: ours first), and only a replace shares a function with listeners.  The
    // replacement calling `target` reaches the original.  Made by applyPatches once the world
    // is stopped (deferPatch): a refused patch leaves the target untouched.
    deferPatch(() => {
      if (realSlot !== null)
        realSlot.writePointer(target);
      Interceptor.replace(target, replacement);
      hooked.push(target);
    });
  };
  redirect('close', proc.cm.mt_close, proc.mem.realClose);
  if (targets.close_range !== null) {
    redirect('close_range', proc.cm.mt_close_range, proc.mem.realCloseRange);
    // closefrom closes through close_range in glibc: ours calls the real one, run by run.
    redirect('closefrom', proc.cm.mt_closefrom, null);
  }
  // dup2/dup3 onto one of Frida's descriptors would close it too: refused with EBUSY (process.c).
  redirect('dup2', proc.cm.mt_dup2, proc.mem.realDup2);
  redirect('dup3', proc.cm.mt_dup3, proc.mem.realDup3);
  applyPatches('descriptor guard in');
  proc.fdGuard = { hooked, timer: setInterval(() => {
    refreshFdGuard();
    holdSignalsOffFrida();
  }, FD_GUARD_REFRESH_MS) };
}

function unhookFdGuard() {
  const guard = proc.fdGuard;
  if (guard === null)
    return;
  proc.fdGuard = null;
  clearInterval(guard.timer);
  for (const target of guard.hooked)
    revertWhenStopped(target);
  applyPatches('descriptor guard out');
  const kept = Number(proc.mem.fdState.readU64());
  const refused = Number(proc.mem.fdState.add(FD_DUP_REFUSED * 8).readU64());
  try {
    if (kept > 0) {
      send({ type: 'agent:warning', message: `the target closed memtrace's own descriptors ${kept} time(s) ` +
        '(closing every descriptor, as daemons do): they were kept open so the capture goes on, and the ' +
        "target's close reported success" });
    }
    if (refused > 0) {
      send({ type: 'agent:warning', message: `the target's dup2/dup3 onto memtrace's own descriptors failed ` +
        `${refused} time(s) with EBUSY: the descriptor was kept so the capture goes on (a success would have ` +
        "sent the target's own data into memtrace's channel)" });
    }
  } catch (e) {
    // going away
  }
}

/* glibc's execve (x86-64) is 33 bytes whose error branch jumps back into its first 16: Frida's
 * replaceFast cannot move them.  Its first 14 bytes become `jmp [rip]; .quad mt_execve` and the
 * real call is mt_execve_raw (process.c), with no trampoline: Interceptor.replace's keeps
 * per-thread state that a posix_spawn or vfork child -- the parent's memory and thread-local
 * storage, an exec that never returns -- leaves behind (see hookSpawn).  Fork children get the
 * bytes back with every other patch (recordPatches). */
const JUMP_BYTES = 14;

function jumpExecve(target) {
  if (Process.arch !== 'x64' || proc.cm.mt_execve_raw === undefined)
    return false;
  const m = libcModule();
  let size = 0;
  try {
    const sym = m.enumerateSymbols().find(s => s.name === 'execve' && s.address.equals(target));
    size = sym && sym.size ? sym.size : 0;
  } catch (e) {
    size = 0;
  }
  if (size < JUMP_BYTES)
    return false;
  proc.execSaved = target.readByteArray(JUMP_BYTES);
  proc.mem.realExecve.writePointer(proc.cm.mt_execve_raw);
  // Written by applyPatches while the world is stopped (hookExec), as every other patch.
  proc.execJump = () => Memory.patchCode(target, JUMP_BYTES, code => {
    code.writeByteArray([0xff, 0x25, 0x00, 0x00, 0x00, 0x00]);
    code.add(6).writePointer(proc.cm.mt_execve);
  });
  return true;
}

/* With execve behind Interceptor.replace, a posix_spawn child (clone(CLONE_VM | CLONE_VFORK):
 * the parent's memory and its thread-local storage) entering that redirect marks the parent's
 * thread as inside it for good -- it execs and never returns -- and every later execve from
 * that thread skipped the hook: only the first posix_spawn was ever seen.  So around
 * posix_spawn the redirect is taken out, and the parent reports the child itself when the
 * call returns (its pid and path).  (glibc's system() and popen() go through posix_spawn.) */
function hookSpawn() {
  for (const name of ['posix_spawn', 'posix_spawnp']) {
    const f = libcExport(name);
    if (f === null)
      continue;
    proc.spawnHooks.push(Interceptor.attach(f, {
      onEnter(args) {
        this.pidOut = args[0];
        this.path = readCString(args[1]);
        this.rehook = proc.execHooked;
        if (this.rehook) {
          Interceptor.revert(proc.execTarget);
          Interceptor.flush();
        }
      },
      onLeave(retval) {
        if (this.rehook && proc.execHooked && !proc.torn) {
          Interceptor.replace(proc.execTarget, proc.cm.mt_execve);
          Interceptor.flush();
        }
        if (retval.toInt32() !== 0 || this.pidOut.isNull())
          return;
        try {
          send({ type: 'process:child', t: now(), pid: this.pidOut.readS32(), ppid: Process.id, origin: 'spawn',
            path: this.path, entry: null, lost: 0 });
        } catch (e) {
          // never stand in the target's way
        }
      },
    }));
  }
}

export function unhookExec() {
  const guarded = proc.fdGuard !== null;
  unhookFdGuard();
  for (const h of proc.spawnHooks.splice(0))
    h.detach();
  const execHooked = proc.execHooked;
  if (execHooked) {
    writeField(proc.mem.proc, PROC, 'exec_notify', 0);
    if (proc.execSaved !== null) {
      const saved = proc.execSaved;
      const target = proc.execTarget;
      applyPatches('execve hook out', () => Memory.patchCode(target, JUMP_BYTES, code => code.writeByteArray(saved)));
      proc.execSaved = null;
    } else {
      revertWhenStopped(proc.execTarget);
      applyPatches('execve hook out');
    }
    proc.execHooked = false;
  }
  if (guarded || execHooked)
    quiesceProcessCode();
}

/* The hooks are out, but a thread that entered one just before -- mt_close, which a program that
 * opens and closes descriptors in a loop is nearly always in, or mt_execve -- may still run in
 * process.c's code or be about to return into it (from the close system call, say), and Frida
 * frees that code when the agent unloads: the fds storm's SIGSEGVs (docs/hook-storm.md).  So wait
 * (bounded, world.js quiesce) until no thread's pc, register or stack word points into it. */
function quiesceProcessCode() {
  if (proc.cm === null)
    return;
  // Return addresses only (below any signal frame): nothing calls process.c's functions through a
  // pointer a program thread keeps -- Interceptor's redirects jump to them, the fork handlers go
  // through the stub page, the kernel holds the signal stop's handler -- and a pointer to one of
  // them sat 4.5 KB up a storm thread's stack, stale, in 4 of 240 runs (docs/hook-storm.md, round 25).
  const code = moduleCode(proc.cm);
  proc.quiesce = quiesce(code, code.length, true);
  if (!proc.quiesce.clear && proc.quiesce.threads !== null) {
    try {
      send({ type: 'agent:warning', message: `${proc.quiesce.threads} thread(s) still inside memtrace's ` +
        `descriptor guard or execve hook after ${proc.quiesce.tries} looks` +
        `${proc.quiesce.first ? ` (the first: ${proc.quiesce.first})` : ''}; the agent unloads regardless` });
    } catch (e) {
      // going away
    }
  }
}

/* The process is about to lose its image (exec) or its life (a crash): the thread waits here
 * until the host says it has what was sent (messages still queued when the process goes are
 * lost), or ACK_TIMEOUT_MS, whichever comes first. */
export function awaitAck(before) {
  const deadline = Date.now() + ACK_TIMEOUT_MS;
  while (proc.acks <= before && Date.now() < deadline)
    Thread.sleep(0.005);
  return proc.acks > before;
}

export function listenForAcks() {
  recv('memtrace:ack', () => {
    proc.acks++;
    listenForAcks();
  });
}

/* ---- what a fork child must have back: libc's patched bytes -------------------------- */

/* libc's executable segments as its file has them, read before any hook is in (reading a file
 * from here makes the C library allocate, which the window must not count). */
function readPristine() {
  const m = libcModule();
  if (m === null)
    return { why: 'no libc module' };
  let file;
  try {
    file = File.readAllBytes(m.path);
  } catch (e) {
    return { why: `cannot read ${m.path}: ${e.message}` };
  }
  const segs = execSegments(m);
  for (const s of segs) {
    if (s.offset + s.size > file.byteLength)
      return { why: `${m.path} on disk is shorter than the mapped library` };
    s.copy = Memory.alloc(s.size);
    s.copy.writeByteArray(file.slice(s.offset, s.offset + s.size));
  }
  return { segs };
}

/* Every range of libc's executable code that differs from libc's file: the hooks of Frida
 * (exit, _exit, abort, signal, sigaction) and ours.  A fork child gets the file's bytes back.
 * Only C runs here (the hooks are in). */
export function recordPatches() {
  if (proc.cm === null)
    return { patches: 0 };
  if (proc.pristine.why)
    return { patches: 0, why: proc.pristine.why };
  const out = proc.mem.diffOut;
  const diff = new NativeFunction(proc.cm.mt_diff, 'int', ['pointer', 'pointer', 'uint64', 'pointer', 'int']);
  const patches = [];
  for (const s of proc.pristine.segs) {
    const copy = s.copy;
    const n = diff(s.address, copy, s.size, out, MAX_PATCHES);
    if (n > MAX_PATCHES)
      return { patches: 0, why: 'libc on disk does not match the mapped library' };
    for (let i = 0; i < n; i++) {
      let start = Number(out.add(i * 16).readU64());
      let len = Number(out.add(i * 16 + 8).readU64());
      while (len > 0) {
        const take = Math.min(len, PATCH_BYTES);
        patches.push({ address: s.address.add(start), bytes: copy.add(start).readByteArray(take), length: take });
        start += take;
        len -= take;
      }
    }
  }
  if (patches.length > MAX_PATCHES)
    return { patches: 0, why: 'too many patched ranges' };
  const mem = proc.mem;
  patches.forEach((p, i) => {
    mem.patchAddress.add(i * 8).writePointer(p.address);
    mem.patchLength.add(i * 8).writeU64(p.length);
    mem.patchBytes.add(i * PATCH_BYTES).writeByteArray(p.bytes);
  });
  writeField(mem.proc, PROC, 'n_patches', patches.length);
  return { patches: patches.length, at: patches.map(p => p.address.toString()) };
}

/* The module's executable PT_LOAD segments, read from its ELF header in memory. */
function execSegments(m) {
  const base = m.base;
  const phoff = base.add(0x20).readU64().toNumber();
  const phentsize = base.add(0x36).readU16();
  const phnum = base.add(0x38).readU16();
  const loads = [];
  for (let i = 0; i < phnum; i++) {
    const ph = base.add(phoff + i * phentsize);
    if (ph.readU32() !== 1)          // PT_LOAD
      continue;
    loads.push({ flags: ph.add(4).readU32(), offset: ph.add(8).readU64().toNumber(),
      vaddr: ph.add(16).readU64().toNumber(), filesz: ph.add(32).readU64().toNumber() });
  }
  const bias = base.sub(Math.min(...loads.map(l => l.vaddr)) & ~(Process.pageSize - 1));
  return loads.filter(l => (l.flags & 1) !== 0)
    .map(l => ({ address: bias.add(l.vaddr), offset: l.offset, size: l.filesz }));
}

/* ---- children the parent learns of (called on every flush) --------------------------- */

export function reportChildren() {
  if (proc.cm === null)
    return;
  const mem = proc.mem;
  for (;;) {
    const idx = mem.take(mem.takeOut, mem.takePath, 256);
    if (idx < 0)
      break;
    proc.forksReported++;
    const path = mem.takePath.readUtf8String();
    send({
      type: 'process:child', t: now(),
      pid: mem.takeOut.readS32(), ppid: mem.takeOut.add(4).readS32(),
      origin: ORIGIN_NAMES[mem.takeOut.add(8).readS32()] || 'unknown',
      path: path === '' ? null : path,
      entry: mem.entry(idx).toString(),
      lost: mem.lost(),
    });
  }
}

/* The host followed this (forked) process: let it run on.  Called on the child's new agent. */
export function releaseFork(entry, pid) {
  if (proc.cm === null)
    return false;
  // Before the child runs on: its copy of the parent agent's tables is as the fork left it.
  try {
    proc.inherited = inheritedAgentMemory(ptr(proc.mem.agentMemoryOf(ptr(entry), pid).toString()));
    // Its own tables say it too, before the child runs on: a grandchild forked at once leaves
    // out its grandparent's copy as well.
    if (proc.inherited !== null && proc.agentMemory !== null && !proc.torn)
      writeAgentMemory();
  } catch (e) {
    proc.inherited = null;
  }
  const release = new NativeFunction(proc.cm.mt_fork_release, 'int', ['pointer', 'int']);
  return release(ptr(entry), pid) === 1;
}

/* ---- the agent's memory, as a fork child inherits it ------------------------------------
 *
 * A fork child inherits the whole agent -- Frida's heap, data and threads' stacks, memtrace's
 * tables -- as a copy nobody serves (process.c).  Its words are the parent's: the live table holds
 * every block the parent tracked, and Frida's heap holds pointers into arena memory the parent
 * freed and the child hands out again.  A leak scan in the child that took them for the
 * program's roots called the parent's lost blocks reachable (every one) and, now and then, one of
 * the child's own lost blocks possibly lost (CI: 2 of 3).  Frida cloaks its memory from the
 * parent's Gum only, and the child's agent has a Gum of its own; so the parent writes down what is
 * the agent's -- the cloaked parts of every writable mapping and memtrace's own tables -- every
 * second (refreshAgentMemory, from the flush), into the one of two tables not current, then names
 * it current.  The child posts the tables' address with its pid (process.c mt_post), and its new
 * agent reads its own copy before the child runs on (releaseFork): the agent's memory as it was up
 * to a second before the fork.  Memory the agent took since stays a root, as before. */

const TABLE_BYTES = AGENT_MEMORY_TABLE.size + AGENT_MEMORY_RANGES * 16;

function agentMemoryTables() {
  const t = Memory.alloc(AGENT_MEMORY.size + 2 * TABLE_BYTES);
  writeStruct(t, AGENT_MEMORY, { current: 0, cap: AGENT_MEMORY_RANGES, refreshes: 0, reserved: 0 });
  return t;
}

function agentMemoryTable(t, which) {
  return t.add(AGENT_MEMORY.size + which * TABLE_BYTES);
}

/* Ranges ({base, size}) as {lo, hi} Numbers (addresses are below 2^48: exact), sorted by lo: the
 * form the agent-memory tables and the leak scan's holes (leaks.js outside) use. */
export function numberRanges(ranges) {
  return ranges.map(r => ({ lo: Number(r.base.toString()), hi: Number(r.base.toString()) + Number(r.size) }))
    .sort((x, y) => x.lo - y.lo);
}

/* Every writable range that is the agent's now, sorted as {lo, hi} Numbers: Frida's cloaked parts
 * of each mapping, and `owned` (memtrace's tables, [{base, size}]). */
function agentRanges(owned) {
  const out = numberRanges(owned);
  const maps = File.readAllText('/proc/self/maps');
  for (const line of maps.split('\n')) {
    const f = line.split(' ', 2);
    if (f.length < 2 || f[1][1] !== 'w')
      continue;
    const [lo, hi] = f[0].split('-');
    const base = ptr('0x' + lo);
    const size = Number(ptr('0x' + hi).sub(base).toString());
    const visible = Cloak.clipRange({ base, size });
    if (visible === null)
      continue;                      // none of it is Frida's
    let at = parseInt(lo, 16);
    const end = parseInt(hi, 16);
    const shown = visible.map(r => [Number(r.base.toString()), Number(r.base.toString()) + r.size])
      .sort((x, y) => x[0] - y[0]);
    for (const [vlo, vhi] of shown) {
      if (vlo > at)
        out.push({ lo: at, hi: vlo });
      at = Math.max(at, vhi);
    }
    if (end > at)
      out.push({ lo: at, hi: end });
  }
  return out.sort((x, y) => x.lo - y.lo);
}

/* The parts of sorted ranges `a` that sorted ranges `b` also hold. */
function intersect(a, b) {
  const out = [];
  let j = 0;
  for (const r of a) {
    while (j < b.length && b[j].hi <= r.lo)
      j++;
    for (let k = j; k < b.length && b[k].lo < r.hi; k++) {
      const lo = Math.max(r.lo, b[k].lo), hi = Math.min(r.hi, b[k].hi);
      if (hi > lo)
        out.push({ lo, hi });
    }
  }
  return out;
}

/* The parent (called once at the start, then from the flush every second): the table not current
 * rewritten whole, its head with it, then named current -- a fork at any instant copies one
 * complete table.  Only what was the agent's at this look and the one before goes in: memory the
 * agent takes and lets go of between two looks (the very text of /proc/self/maps this reads, in a
 * process of many mappings) may be the program's again by the fork, and must stay a root.  A
 * followed child's agent adds what it inherited itself (its grandchildren's scans leave that out
 * too).  `twice`: look again at once (the start: a program may fork at its first line). */
export function refreshAgentMemory(owned, twice = false) {
  const t = proc.agentMemory;
  if (t === null || proc.torn)
    return;
  let fresh;
  try {
    fresh = agentRanges(owned || []);
    if (twice) {
      proc.lastLook = fresh;
      fresh = agentRanges(owned || []);
    }
  } catch (e) {
    return;        // /proc unreadable now: the tables stay as last written (a child's scan reads more roots)
  }
  proc.stableLook = proc.lastLook === undefined ? [] : intersect(fresh, proc.lastLook);
  proc.lastLook = fresh;
  writeAgentMemory();
}

/* The table not current written whole with the last stable look and what this agent inherited. */
function writeAgentMemory() {
  const t = proc.agentMemory;
  const stable = proc.stableLook.slice();
  if (proc.inherited !== null) {
    stable.push(...proc.inherited.ranges);
    stable.sort((x, y) => x.lo - y.lo);
  }
  const head = readStruct(t, AGENT_MEMORY);
  const next = 1 - Number(head.current);
  const n = Math.min(stable.length, AGENT_MEMORY_RANGES);
  const table = agentMemoryTable(t, next);
  const pairs = table.add(AGENT_MEMORY_TABLE.size);
  for (let i = 0; i !== n; i++) {
    pairs.add(i * 16).writeU64(stable[i].lo);
    pairs.add(i * 16 + 8).writeU64(stable[i].hi - stable[i].lo);
  }
  // wall time: the child's agent has a clock of its own
  writeStruct(table, AGENT_MEMORY_TABLE, { n, truncated: stable.length > n ? 1 : 0, t_ms: Date.now() });
  writeField(t, AGENT_MEMORY, 'refreshes', Number(head.refreshes) + 1);
  writeField(t, AGENT_MEMORY, 'current', next);
}

/* The child's new agent: its inherited copy of the parent's tables at `t` (null: none). */
function inheritedAgentMemory(t) {
  if (t.isNull())
    return null;
  const head = readStruct(t, AGENT_MEMORY);
  if (Number(head.cap) !== AGENT_MEMORY_RANGES || Number(head.refreshes) === 0)
    return null;
  const table = agentMemoryTable(t, Number(head.current) & 1);
  const th = readStruct(table, AGENT_MEMORY_TABLE);
  const n = Math.min(Number(th.n), AGENT_MEMORY_RANGES);
  const pairs = table.add(AGENT_MEMORY_TABLE.size);
  const ranges = [];        // written sorted (writeAgentMemory)
  for (let i = 0; i !== n; i++) {
    const lo = pairs.add(i * 16).readU64().toNumber();
    ranges.push({ lo, hi: lo + pairs.add(i * 16 + 8).readU64().toNumber() });
  }
  return { ranges, truncated: Number(th.truncated) === 1, age_ms: Math.max(0, Date.now() - th.t_ms.toNumber()) };
}

/* In a followed fork child: the parent agent's memory it inherited ({ranges: sorted {lo, hi} Numbers,
 * truncated, age_ms}),
 * or null (not a fork child, or its parent kept no tables). */
export function inheritedAgent() {
  return proc.inherited;
}

/* ---- one memtrace session per process --------------------------------------------------
 *
 * Two sessions on one process patch the same functions from two agents: the one that leaves
 * first restores bytes the other's hooks were written over, and the other's own restore then
 * writes back a jump into code already freed.  So a session marks the process -- a page of a
 * memfd named MARK, holding the marking process's pid, visible in /proc/self/maps to every agent
 * however it was injected -- and a second session finds the mark and is refused with one line.
 * The pid tells a fork child's inherited mark (its parent's) from a live one; an exec drops it.
 * DEVICE-UNVERIFIED on Darwin: no memfd, no mark (one session at a time is the user's care).
 */
const MARK = 'memtrace-session';
// The mark's page: the marking process's pid (u32), then the marking agent's JavaScript thread (u32):
// a mark whose agent thread is gone is stale -- its session ended without taking it off (an
// exception in its teardown, say) -- and must not lock the process out for good.
const MARK_TID = 4;
// Then 1 once the session has stopped (the stop rpc: markEnding) and its agent is about to unload: a
// next session is not refused for it but waits (bounded) until the mark is gone (launchers.py).
const MARK_ENDING = 8;

/* A mark whose session's agent thread no longer exists (launchers.refuse_a_second_session reads it
 * the same way).  A mark without a thread id (an older agent's) is never stale. */
function markIsStale(at) {
  const tid = at.add(MARK_TID).readU32();
  if (tid === 0)
    return false;
  try {
    File.readAllText(`/proc/self/task/${tid}/comm`);
    return false;
  } catch (e) {
    return true;
  }
}

function marksOfThisProcess() {
  const out = [];
  let maps;
  try {
    maps = File.readAllText('/proc/self/maps');
  } catch (e) {
    return out;
  }
  for (const line of maps.split('\n')) {
    if (!line.includes('/memfd:' + MARK))
      continue;
    const at = ptr('0x' + line.split('-')[0]);
    try {
      if (at.readU32() !== Process.id)
        continue;
      if (markIsStale(at)) {
        // Taken off for the session that left it: nothing else maps a page of ours by that name.
        at.writeU32(0);
        const munmap = nf('munmap', 'int', ['pointer', 'size_t']);
        if (munmap !== null)
          munmap(at, Process.pageSize);
        proc.staleMarks++;
        continue;
      }
      out.push(at);
    } catch (e) {
      // unreadable: not a mark we can trust
    }
  }
  return out;
}

/* Marks the process as traced; throws (one line) when another session has. */
export function claimProcess() {
  if (IS_DARWIN)
    return;
  const refuse = () => new Error(`another memtrace session is tracing process ${Process.id}; ` +
    'one at a time (end the other, or wait for it)');
  if (marksOfThisProcess().length > 0)
    throw refuse();
  const memfdCreate = nf('memfd_create', 'int', ['pointer', 'uint']);
  const ftruncate = nf('ftruncate', 'int', ['int', 'long']);
  const mmap = nf('mmap', 'pointer', ['pointer', 'size_t', 'int', 'int', 'int', 'long']);
  const close = nf('close', 'int', ['int']);
  if (memfdCreate === null || ftruncate === null || mmap === null || close === null)
    return;
  const fd = memfdCreate(Memory.allocUtf8String(MARK), 1);     // MFD_CLOEXEC
  if (fd < 0)
    return;
  let page = null;
  if (ftruncate(fd, Process.pageSize) === 0) {
    page = mmap(NULL, Process.pageSize, 3, 1, fd, 0);          // PROT_READ | PROT_WRITE, MAP_SHARED
    if (page.equals(ptr('-1')))
      page = null;
  }
  close(fd);
  if (page === null)
    return;
  page.add(MARK_TID).writeU32(Process.getCurrentThreadId());
  page.writeU32(Process.id);
  proc.mark = page;
  // Two sessions starting at once both see two marks: both refuse, neither harms the target.
  if (marksOfThisProcess().length > 1) {
    releaseProcess();
    throw refuse();
  }
}

/* The session has stopped: what is left is its teardown and unload (the mark comes off then). */
export function markEnding() {
  if (proc.mark !== null)
    proc.mark.add(MARK_ENDING).writeU32(1);
}

/* Takes our mark off (only ours: a refused session has none). */
export function releaseProcess() {
  if (proc.mark === null)
    return;
  const munmap = nf('munmap', 'int', ['pointer', 'size_t']);
  proc.mark.writeU32(0);
  if (munmap !== null)
    munmap(proc.mark, Process.pageSize);
  proc.mark = null;
}

/* ---- teardown ------------------------------------------------------------------------- */

/* Before Frida frees our code: exec unhooked, every stub returns at once, fork children no
 * longer wait, and threads still inside a hook get a moment to leave it.  unloading: Frida
 * frees our code next while the process lives on (not so at process exit). */
export function tearDownProcess(unloading) {
  if (proc.torn)
    return;
  proc.torn = true;
  try {
    try {
      unhookExec();
    } catch (e) {
      // keep going: the stubs matter more
    }
    if (proc.mem !== null) {
      writeField(proc.mem.proc, PROC, 'follow', 0);
      writeField(proc.mem.proc, PROC, 'n_patches', 0);
    }
    if (proc.maskPrepare !== null && proc.mem !== null && proc.mem.masksBusy) {
      // No new fork blocks its signals; one already past prepare gets its mask back before the
      // parent and child handlers go quiet.
      disarmStub(proc.maskPrepare);
      const deadline = Date.now() + BUSY_WAIT_MS;
      while (proc.mem.masksBusy() > 0 && Date.now() < deadline)
        Thread.sleep(0.001);
    }
    disarmStubs();
    if (unloading)
      Thread.sleep(UNLOAD_GRACE_MS / 1000);
    if (proc.busyProbe !== null) {
      const deadline = Date.now() + BUSY_WAIT_MS;
      while (proc.busyProbe() > 0 && Date.now() < deadline)
        Thread.sleep(0.002);
    }
    if (unloading)
      releaseForkPage();
    uninstallSignalStop();
  } finally {
    // Whatever failed above, the mark comes off: a mark left behind refused every later session
    // of that process (a storm's --pid target, after one teardown threw).
    releaseProcess();
  }
}

/* The fork page's memory goes back to the system when the agent unloads; the mapping stays.  A
 * --pid target attached again and again (a lab's daemon) kept ~20 KB of it resident per session
 * (64 KB mapped).  Not unmapped: a vfork child still between its exec attempts (execvp trying
 * each PATH entry in our memory) may post there once more -- after MADV_REMOVE that write finds a
 * fresh zero page, never an unmapped one. */
function releaseForkPage() {
  if (proc.mem === null || !proc.mem.forks)
    return;
  const madvise = nf('madvise', 'int', ['pointer', 'size_t', 'int']);
  if (madvise !== null && madvise(proc.mem.forks, FORK_PAGE_BYTES, MADV_REMOVE) === 0)
    proc.forkPageReleased = true;
}
