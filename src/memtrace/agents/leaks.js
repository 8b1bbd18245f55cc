/*
 * malloc --leaks: the conservative reachability scan (cmodule/leaks.c does the work).
 *
 * Before the world stops (Frida's APIs may take locks a stopped thread holds, so they are used
 * only here): the threads not to stop (Frida's own, cloaked), the writable ranges (Frida's
 * cloaked memory is not listed; memtrace's own tables are cut out), which ranges are shaped like
 * thread stacks, and every buffer the C needs.  While it is stopped: the candidates (each with
 * its requested size and stack id, from the core's live table), the scan in slices with a progress
 * message after each, and the result.  Then the world resumes.  Nothing that may take a lock runs
 * while it is stopped: no drain (a drain's timeline sample asks the allocator for its statistics).
 *
 * The result gives the leaked and the still reachable blocks by stack id ([stack id, blocks,
 * bytes]), and the leaked blocks' addresses (the first MAX_LEAKED_LISTED); the host names the
 * stacks from the definitions every drain ships.
 *
 * Its figures are JavaScript Numbers on purpose: each counts blocks, threads or bytes of memory
 * mapped in the process at the scan's instant, bounded by the 48-bit address space (< 2^48), so
 * exact; nothing here accumulates over time (runtime/calibrate.js says the same of its sizes).
 */

import { LEAK_BEFORE_TRACING_KEY, LEAK_BLOCK, LEAK_BLOCK_UNTRACKED, LEAK_GLIBC, LEAK_JOB, LEAK_MARKS, LEAK_RANGE,
  LEAK_RANGE_FRIDA, LEAK_RANGE_STACK, LEAK_REGS, LEAK_SEG, LEAK_STATES, LEAK_THREAD, OWN_CODE, OWN_CODE_RANGES,
  OWN_N_CODE, OWN_N_TIDS, OWN_START_OFFSET, OWN_THREADS_WORDS, OWN_TID, OWN_TIDS, VM_TAG_MALLOC_FIRST,
  VM_MEMORY_STACK, VM_TAG_MALLOC_LAST, WORLD_ERRORS } from './layout.js';
import { core } from './runtime/core.js';
import { IS_DARWIN, findExport, libcExport, libcModule, now } from './runtime/platform.js';
import { inheritedAgent, numberRanges } from './runtime/process.js';
import { readStruct, writeStruct } from './runtime/structs.js';
import { WORLD_MACH_SYMBOLS, fridaThreads } from './runtime/world.js';

const SLICE_BYTES = 64 * 1024 * 1024;    // bytes read between two progress messages
const MAX_THREADS = 4096;
const MAX_LEAKED_LISTED = 200000;         // addresses sent; beyond, only the totals
const TRACER_STACK = 64 * 1024;
const SCRATCH = 64 * 1024;
const LINUX_ARENA_ALIGN = 64 * 1024 * 1024;   // glibc's HEAP_MAX_SIZE: non-main arenas start aligned

// cmodule/world.c (stopping the world) and leaks.c's reads.
const LINUX_SYMBOLS = ['clone', 'ptrace', 'waitpid', 'prctl', 'open', 'close', 'read', 'process_vm_readv',
  'usleep', 'pread'];
const MAX_SEGS = 65536;                   // allocator heaps (and its state) the C may find
const MAX_FREED = 1 << 20;                // tcache and fastbin entries the C may remember
export const LEAKS_LIVE_TABLE = 1 << 22;  // --leaks on Linux: live-table entries (untouched pages until used)
// cmodule/world.c's Mach stop (the same as the process CModule's: WORLD_MACH_SYMBOLS) and leaks.c's own.
const DARWIN_SYMBOLS = [...WORLD_MACH_SYMBOLS, 'mincore', 'malloc_get_all_zones'];
// arm64e signs pointers (PAC): the bits above the address space are a signature, stripped before a
// word is matched against the blocks (DEVICE-UNVERIFIED: the same mask as the core's code addresses).
const PTR_MASK = (IS_DARWIN && Process.arch === 'arm64') ? uint64('0x7fffffffff') : uint64('0xffffffffffffffff');

/* The C library symbols cmodule/leaks.c calls, for the CModule. */
export function leakSymbols() {
  const out = {};
  for (const name of IS_DARWIN ? DARWIN_SYMBOLS : LINUX_SYMBOLS)
    out[name] = findExport(name);
  return out;
}

function fn(name, ret, args) {
  return new NativeFunction(core.cm[name], ret, args);
}

function rangeEnd(r) {
  return r.base.add(r.size);
}

/* Darwin: a region libmalloc made (VM tags MALLOC .. MALLOC_NANO).  DEVICE-UNVERIFIED. */
function isMallocRegion(range) {
  const tag = fn('mt_leak_region_tag', 'int', ['uint64'])(uint64(range.base.toString()));
  return tag >= VM_TAG_MALLOC_FIRST && tag <= VM_TAG_MALLOC_LAST;
}

/* Linux: a pthread stack is a writable mapping right above a guard page.  glibc's non-main
 * arenas also sit above an inaccessible range (the previous arena's reserve), but start on a
 * 64 MB boundary, which a stack after its guard page never does. */
function stackShaped(range, guards) {
  if (IS_DARWIN) {
    const tag = fn('mt_leak_region_tag', 'int', ['uint64'])(uint64(range.base.toString()));
    return tag === VM_MEMORY_STACK;    // DEVICE-UNVERIFIED
  }
  // A module's data can sit above a hole the loader made inaccessible: not a stack.
  if (range.file !== undefined || Process.findModuleByAddress(range.base) !== null)
    return false;
  if (range.base.and(ptr(LINUX_ARENA_ALIGN - 1)).isNull())
    return false;
  if (!guards.has(range.base.toString()))
    return false;
  const tcb = threadControlBlock(range);
  return tcb !== null && tcbAtTheTop(range, tcb);
}

/* glibc puts a thread's struct pthread at the very top of its stack mapping (aligned down to at
 * most 64 bytes): a TCB elsewhere in a range (the main thread's, in the mapping ld.so made for it,
 * which the kernel may have merged with the mappings around it) does not make the range a stack. */
function tcbAtTheTop(range, tcb) {
  const sizeOf = findExport('_thread_db_sizeof_pthread');
  if (sizeOf === null)
    return true;
  const above = Number(rangeEnd(range).sub(tcb).toString());
  const size = sizeOf.readU32();
  return above >= size && above < size + 128;
}

/* glibc puts a thread's struct pthread at the top of its stack mapping, and the TCB header at
 * its start points to itself twice (tcbhead_t.tcb and .self, 16 bytes apart).  Requiring that
 * signature keeps an ordinary anonymous mapping that happens to sit above a guard page (a
 * custom arena, a big buffer) from being taken for a dead thread's stack and left unscanned,
 * which would make what it points to look leaked. */
const TCB_SEARCH_BYTES = 16 * 1024;

function threadControlBlock(range) {
  const span = Math.min(range.size, TCB_SEARCH_BYTES);
  const start = range.base.add(range.size - span);
  try {
    for (let off = span - 24; off >= 0; off -= 8) {
      const at = start.add(off);
      if (at.readPointer().equals(at) && at.add(16).readPointer().equals(at))
        return at;
    }
  } catch (e) {
    // unreadable: not something we can call a stack
  }
  return null;
}

/* Whether a thread runs on the stack `range` (glibc): its struct pthread's tid is not 0.  glibc
 * marks a stack free -- in its cache, for a new thread to take -- by that tid's 0 (in a fork child,
 * every stack but the forking thread's: fork.h reclaim_stacks).  Unknown: true. */
function threadRunsOn(range) {
  const tcb = threadControlBlock(range);
  const tidField = findExport('_thread_db_pthread_tid');     // libthread_db's {bits, count, offset}
  if (tcb === null || tidField === null)
    return true;
  try {
    return tcb.add(tidField.add(8).readU32()).readS32() !== 0;
  } catch (e) {
    return true;
  }
}

/* A stack no stopped thread runs on (an exited thread's, kept in glibc's stack cache) is a root
 * from its static TLS up: the thread control block holds the thread's DTV (a malloc'd block
 * glibc frees only when it reuses the stack), the TLS blocks what its __thread variables held.
 * What lies below is the exited thread's dead frames.  x86-64 (TLS variant II): the TLS sits
 * right below the TCB.  0: unknown (the whole range is then skipped, as before). */
function liveFrom(range) {
  if (IS_DARWIN)
    return 0;
  const tcb = threadControlBlock(range);
  if (tcb === null)
    return 0;
  const tls = Process.arch === 'x64' ? staticTls() : 0;
  const from = tcb.sub(Math.min(tls, Number(tcb.sub(range.base).toString())));
  return uint64(from.toString());
}

/*
 * glibc's malloc as the C walks it (cmodule/leaks.c mt_leak_glibc_walk): struct malloc_state's
 * offsets (glibc >= 2.27, 64-bit: mutex, flags, have_fastchunks, fastbinsY[10], top,
 * last_remainder, bins[254], binmap[4], next, ...), main_arena (found by its self-pointing empty
 * bins in libc's data) and the [heap] mapping.  null: not glibc, or too old; then untracked
 * blocks are not found and the heap is not told apart.
 */
let glibcCache;

function glibcLayout() {
  if (glibcCache !== undefined)
    return glibcCache;
  glibcCache = null;
  if (IS_DARWIN || Process.pointerSize !== 8)
    return null;
  const versionFn = findExport('gnu_get_libc_version');
  if (versionFn === null)
    return null;
  const version = new NativeFunction(versionFn, 'pointer', [])().readCString();
  const [major, minor] = version.split('.').map(Number);
  if (major !== 2 || minor < 27)
    return null;
  const lay = {
    mstate_size: 0x898, top_offset: 0x60, next_offset: 0x870, fastbins_offset: 0x10, n_fastbins: 10,
    heap_max: 64 * 1024 * 1024, tcache_bins: minor >= 30 ? 64 : 0, safe_linking: minor >= 32 ? 1 : 0,
    heap_start: 0, heap_end: 0, main_arena: uint64(0), version,
  };
  const libc = libcModule();
  const find = fn('mt_leak_find_main_arena', 'uint64', ['uint64', 'uint64', 'uint64', 'uint64', 'uint64', 'uint64']);
  if (libc !== null) {
    for (const r of libc.enumerateRanges('rw-')) {
      const at = find(Process.id, uint64(r.base.toString()), r.size, 0x70, lay.mstate_size, lay.next_offset);
      if (!at.equals(0)) {
        lay.main_arena = at;
        break;
      }
    }
  }
  glibcCache = lay;
  return lay;
}

/* The [heap] mapping (the main arena's sbrk heap), read now: it grows. */
function brkHeap() {
  try {
    const maps = File.readAllText('/proc/self/maps');
    for (const line of maps.split('\n')) {
      if (line.endsWith('[heap]')) {
        const [lo, hi] = line.split(' ')[0].split('-');
        return { start: uint64('0x' + lo), end: uint64('0x' + hi) };
      }
    }
  } catch (e) {
    // no /proc: no heap told apart
  }
  return null;
}

/* The bytes of static TLS below a thread's TCB (x86-64): ld.so's static TLS size
 * (_dl_get_tls_static_info) counts the TCB itself (sizeof (struct pthread), which libc gives
 * libthread_db as _thread_db_sizeof_pthread); the thread's first frame starts right below the
 * rest.  0 when unknown. */
let staticTlsSize;

function staticTls() {
  if (staticTlsSize !== undefined)
    return staticTlsSize;
  staticTlsSize = 0;
  const f = findExport('_dl_get_tls_static_info');
  const tcb = findExport('_thread_db_sizeof_pthread');
  if (f !== null && tcb !== null) {
    const out = Memory.alloc(16);
    new NativeFunction(f, 'void', ['pointer', 'pointer'])(out, out.add(8));
    staticTlsSize = Math.max(0, Number(out.readU64().toString()) - tcb.readU32());
  }
  return staticTlsSize;
}

/* The pieces of `pieces` ({base, size}) outside every one of `holes` ({lo, hi}, sorted by lo:
 * runtime/process.js numberRanges). */
function outside(pieces, holes) {
  const out = [];
  for (const p of pieces) {
    let lo = Number(p.base.toString()), hi = lo + p.size;
    for (const h of holes) {
      if (h.hi <= lo)
        continue;
      if (h.lo >= hi)
        break;
      if (h.lo > lo)
        out.push({ base: ptr(lo), size: h.lo - lo });
      lo = Math.max(lo, h.hi);
      if (lo >= hi)
        break;
    }
    if (hi > lo)
      out.push({ base: ptr(lo), size: hi - lo });
  }
  return out;
}

/* The roots the agent can list before the stop.  `inherited`: in a fork child, its copy of the
 * parent agent's memory (runtime/process.js): never a root, but for what is shaped like a stack --
 * glibc's cache hands the parent's threads' stacks to the child's new threads, so such a range
 * is read as any stack is (from a stopped thread's sp, or its TLS up).  Counts what it left out
 * in stats.inheritedBytes. */
function rootRanges(own, inherited, stats) {
  const ownHoles = numberRanges(own);
  const holes = inherited === null ? [] : inherited.ranges;
  const inheritedStacks = [];
  const guards = new Set();
  if (!IS_DARWIN) {
    for (const g of Process.enumerateRanges({ protection: '---', coalesce: false })) {
      if (g.file === undefined)
        guards.add(rangeEnd(g).toString());
    }
  }
  const out = [];
  for (const r of Process.enumerateRanges({ protection: 'rw-', coalesce: false })) {
    if (IS_DARWIN && isMallocRegion(r))
      continue;      // libmalloc's own regions (its blocks and their free neighbours): never roots
    const stack = stackShaped(r, guards);
    const flags = stack ? LEAK_RANGE_STACK : 0;
    const from = stack ? liveFrom(r) : 0;
    if (stack && holes.length > 0 && outside([r], holes).length === 0 && !threadRunsOn(r)) {
      // the parent's thread's, in the child's stack cache: Frida's (its DTV is no block of the program's)
      inheritedStacks.push({ base: r.base, size: r.size, flags: LEAK_RANGE_STACK | LEAK_RANGE_FRIDA, live_from: from });
      continue;
    }
    let pieces = outside([r], ownHoles);
    if (!stack && holes.length > 0) {
      const before = pieces.reduce((sum, piece) => sum + piece.size, 0);
      pieces = outside(pieces, holes);
      stats.inheritedBytes += before - pieces.reduce((sum, piece) => sum + piece.size, 0);
    }
    for (const piece of pieces)
      out.push({ base: piece.base, size: piece.size, flags, live_from: from });
  }
  // Frida's threads' stacks last: what only they reach is told apart as Frida's own.
  out.push(...inheritedStacks);
  for (const r of cloakedStacks())
    out.push({ base: r.base, size: r.size, flags: LEAK_RANGE_STACK | LEAK_RANGE_FRIDA, live_from: liveFrom(r) });
  return out;
}

/* Linux: the stacks Frida hides (its own threads', and a stack glibc's cache handed from one of
 * them to a thread of the app or back).  Only their TLS and thread control block are roots (the
 * C starts at live_from): they hold the threads' DTVs, which glibc allocates with the app's
 * malloc.  The rest of Frida's memory is never a root (it holds the scan's own tables). */
function cloakedStacks() {
  if (IS_DARWIN)
    return [];
  let maps;
  try {
    maps = File.readAllText('/proc/self/maps');
  } catch (e) {
    return [];
  }
  const out = [];
  let guardEnd = null;       // where the last inaccessible anonymous mapping ended
  for (const line of maps.split('\n')) {
    const f = line.trim().split(/\s+/);
    if (f.length < 5)
      continue;
    const [lo, hi] = f[0].split('-');
    const base = ptr('0x' + lo);
    const anonymous = f.length === 5;
    const afterGuard = guardEnd !== null && guardEnd.equals(base);
    guardEnd = (anonymous && f[1] === '---p') ? ptr('0x' + hi) : null;
    if (f[1] !== 'rw-p' || !anonymous || !afterGuard || base.and(ptr(LINUX_ARENA_ALIGN - 1)).isNull())
      continue;
    if (Process.findRangeByAddress(base) !== null)
      continue;                                      // listed already
    const range = { base, size: Number(ptr('0x' + hi).sub(base).toString()) };
    const tcb = threadControlBlock(range);
    if (tcb !== null && tcbAtTheTop(range, tcb))
      out.push(range);
  }
  return out;
}

function alloc(size, own) {
  const p = Memory.alloc(size);
  own.push({ base: p, size });
  return p;
}

// The program's threads now (Linux: /proc/self/status), less Frida's and the scanning thread.
function programThreads(skip) {
  if (IS_DARWIN)
    return null;
  const m = /^Threads:\s+(\d+)/m.exec(File.readAllText('/proc/self/status'));
  if (m === null)
    return null;
  const self = Process.getCurrentThreadId();
  return Math.max(0, Number(m[1]) - skip.length - (skip.includes(self) ? 0 : 1));
}

/* Linux: every task of the process that Frida cloaks (its own threads), listed by the C (no
 * allocation: opendir would call the allocator we are tracing).  Not Process.enumerateThreads():
 * on Linux it starts a thread of its own to read the others' registers, and that thread's
 * mallocs and its exit's frees (its tcache flushed) would show in the app's counts. */
export function cloakedTids() {
  // Linux: task ids; Darwin: the task's thread ports (task_threads), which are Frida's thread ids
  // there (DEVICE-UNVERIFIED).  Both listed by cmodule/world.c mt_world_list_tasks.
  return fridaThreads(fn('mt_leak_list_tasks', 'uint64', ['uint64', 'pointer', 'uint64']));
}

/*
 * Frida's own threads for the core (cmodule/core.c, mt_own_thread): their malloc calls are never
 * the target's.  Filled before the hooks go in: the threads Frida cloaks now, and (Linux, glibc)
 * the code Frida starts its threads in -- the library holding this thread's start routine (this
 * is Frida's JavaScript thread, started by GLib there) -- for the threads it starts later.  Not any
 * memory Frida cloaks: a thread memtrace itself starts from a CModule (doctor's self-test) runs
 * code the target's threads would, and is the target's.  Returns {threads, code_ranges}.
 */
export function markFridaThreads(cell) {
  const words = new Array(OWN_THREADS_WORDS).fill(0);
  const tids = cloakedTids().slice(0, OWN_TIDS);
  tids.forEach((tid, i) => { words[OWN_TID + i] = tid; });
  words[OWN_N_TIDS] = tids.length;
  const field = IS_DARWIN ? null : findExport('_thread_db_pthread_start_routine');  // glibc: {bits, count, offset}
  if (field !== null && field.readU32() === 64 && field.add(4).readU32() === 1) {
    const offset = field.add(8).readU32();
    const self = new NativeFunction(findExport('pthread_self'), 'pointer', [])();
    const start = self.add(offset).readPointer();
    // Frida's own (cloaked) code only: were this thread started from a library the target uses
    // too (libc, libstdc++), every thread started there would be taken for Frida's.
    const code = Cloak.hasRangeContaining(start) ? mappingsOf(uint64(start.toString())).slice(0, OWN_CODE_RANGES) : [];
    if (code.length > 0) {
      words[OWN_START_OFFSET] = offset;
      code.forEach(([start, end], i) => {
        words[OWN_CODE + 2 * i] = start;
        words[OWN_CODE + 2 * i + 1] = end;
      });
      words[OWN_N_CODE] = code.length;
    }
  }
  words.forEach((w, i) => cell.add(i * 8).writeU64(uint64(w.toString())));
  return { threads: tids.length, code_ranges: words[OWN_N_CODE], forgotten: 0 };
}

/* A listed thread of Frida's that has exited is forgotten (its entry zeroed: one aligned store, which
 * the core reads whole), so that a thread of the target's given its id later is counted: thread ids
 * wrap at pid_max (32768 by default), and GLib's pool workers exit after 15 s idle.  Only from a
 * complete listing.  Returns how many were forgotten. */
let taskBuf = null;

export function forgetExitedFridaThreads(cell) {
  const n = Math.min(OWN_TIDS, Number(cell.add(OWN_N_TIDS * 8).readU64()));
  if (n === 0)
    return 0;
  taskBuf = taskBuf || Memory.alloc(MAX_THREADS * 8);
  // Linux: task ids; Darwin: thread port names (cmodule/world.c mt_world_list_tasks).
  const total = Number(fn('mt_leak_list_tasks', 'uint64', ['uint64', 'pointer', 'uint64'])(Process.id, taskBuf, MAX_THREADS));
  if (total === 0 || total >= MAX_THREADS)
    return 0;
  const alive = new Set();
  for (let i = 0; i < total; i++)
    alive.add(Number(taskBuf.add(i * 8).readU64()));
  let forgotten = 0;
  for (let i = 0; i < n; i++) {
    const at = cell.add((OWN_TID + i) * 8);
    const tid = Number(at.readU64());
    if (tid !== 0 && !alive.has(tid)) {
      at.writeU64(0);
      forgotten++;
    }
  }
  return forgotten;
}

/* Linux: the executable mappings of the file that holds `address` (only its own mapping when it
 * is anonymous), adjacent ones joined: [start, end) UInt64 pairs; [] when none holds it. */
function mappingsOf(address) {
  let maps;
  try {
    maps = File.readAllText('/proc/self/maps');
  } catch (e) {
    return [];
  }
  const exec = [];
  for (const line of maps.split('\n')) {
    const f = line.trim().split(/\s+/);
    if (f.length < 5 || f[1][2] !== 'x')
      continue;
    const [lo, hi] = f[0].split('-').map(h => uint64('0x' + h));
    exec.push({ lo, hi, path: f.slice(5).join(' ') });
  }
  const home = exec.find(m => address.compare(m.lo) >= 0 && address.compare(m.hi) < 0);
  if (home === undefined)
    return [];
  const out = [];
  for (const m of home.path === '' ? [home] : exec.filter(e => e.path === home.path)) {
    const last = out[out.length - 1];
    if (last !== undefined && last[1].equals(m.lo))
      last[1] = m.hi;
    else
      out.push([m.lo, m.hi]);
  }
  return out;
}

/* The candidates' table size: every tracked block, and room for the in-use chunks the live table
 * does not hold (at most the heap's in-use bytes the tracked blocks do not take, 32 bytes a chunk).
 * The buffers are fresh pages: only what the scan writes becomes resident. */
function candidateCapacity(liveNow, glibc) {
  let untracked = 0;
  if (glibc !== null) {
    const mallinfo = findExport('mallinfo2');
    if (mallinfo !== null) {
      const info = new NativeFunction(mallinfo, ['size_t', 'size_t', 'size_t', 'size_t', 'size_t', 'size_t',
        'size_t', 'size_t', 'size_t', 'size_t'], [])();
      const inUse = Number(info[7].toString());        // uordblks: bytes in use, not mmapped
      const tracked = Number(fn('mt_leak_tracked_chunk_bytes', 'uint64', [])().toString());
      untracked = Math.ceil(Math.max(0, inUse - tracked) / 32 * 1.25);
    } else {
      untracked = 1 << 20;
    }
  }
  return Math.max(1024, Math.ceil(liveNow * 1.25) + untracked + 65536);
}

function glibcStruct(own) {
  const lay = glibcLayout();
  if (lay === null)
    return null;
  const heap = brkHeap();
  const g = alloc(LEAK_GLIBC.size, own);
  writeStruct(g, LEAK_GLIBC, {
    main_arena: lay.main_arena, heap_start: heap === null ? 0 : heap.start, heap_end: heap === null ? 0 : heap.end,
    mstate_size: lay.mstate_size, top_offset: lay.top_offset, next_offset: lay.next_offset,
    fastbins_offset: lay.fastbins_offset, n_fastbins: lay.n_fastbins, heap_max: lay.heap_max,
    tcache_bins: lay.tcache_bins, safe_linking: lay.safe_linking,
  });
  return g;
}

/* Blocks by verdict and stack: {verdict: Map(stack key -> [key, blocks, bytes])}, from the C's
 * buffers read whole (one copy, not a native call per block). */
function tally(blocks, marks, n) {
  const byVerdict = Object.values(LEAK_MARKS).map(() => new Map());    // indexed by LEAK_MARKS value
  const listed = [];
  const bytes = n === 0 ? new ArrayBuffer(0) : blocks.readByteArray(n * LEAK_BLOCK.size);
  const words = new Uint32Array(bytes);
  const verdicts = n === 0 ? new Uint8Array(0) : new Uint8Array(marks.readByteArray(n));
  const stride = LEAK_BLOCK.size / 4;
  const untrackedBefore = { blocks: 0, bytes: 0 };
  for (let i = 0; i < n; i++) {
    const w = i * stride;
    const size = words[w + 2] + words[w + 3] * 4294967296;
    const untracked = (words[w + 5] & LEAK_BLOCK_UNTRACKED) !== 0;
    const key = untracked ? LEAK_BEFORE_TRACING_KEY : words[w + 4];
    const v = verdicts[i];
    const by = byVerdict[v];
    const acc = by.get(key);
    if (acc === undefined)
      by.set(key, [key, 1, size]);
    else {
      acc[1]++;
      acc[2] += size;
    }
    if (untracked) {
      untrackedBefore.blocks++;
      untrackedBefore.bytes += size;
    }
    const lost = v === LEAK_MARKS.definitely_lost || v === LEAK_MARKS.indirectly_lost;
    if (lost && listed.length < MAX_LEAKED_LISTED) {
      const ptr = uint64(words[w + 1]).shl(32).or(words[w]);
      listed.push(['0x' + ptr.toString(16), size, key, v === LEAK_MARKS.definitely_lost ? 'definite' : 'indirect']);
    }
  }
  const total = m => [...m.values()].reduce((a, r) => [a[0] + r[1], a[1] + r[2]], [0, 0]);
  return { byVerdict, total, listed, untrackedBefore };
}

/*
 * The scanning thread (and the ptrace helper it clones, which inherits it) ahead of the target's
 * own threads for the scan, where the system allows it (CAP_SYS_NICE; otherwise nothing changes).
 * In a process whose threads keep every CPU busy this thread got about 1 % of a CPU: listing the
 * ranges alone took 33 s beside 64 spinning threads, past the host's wait (issue 27).  While the
 * world is stopped the target's threads do not run anyway.  Returns the undo, or null.
 */
function scanFirst() {
  if (IS_DARWIN)
    return null;
  const get = findExport('getpriority');
  const set = findExport('setpriority');
  if (get === null || set === null)
    return null;
  const tid = Process.getCurrentThreadId();
  const setNice = new NativeFunction(set, 'int', ['int', 'uint', 'int']);
  const before = new NativeFunction(get, 'int', ['int', 'uint'])(0, tid);      // PRIO_PROCESS: this thread
  if (before <= -20 || setNice(0, tid, -20) !== 0)
    return null;
  return () => setNice(0, tid, before);
}

/* exit and _exit, for a scan at exit on x86-64 Linux; zeros otherwise (no thread is read from a
 * call to exit). */
function exitFunctions(when) {
  const none = { exit_fn: 0, exit_fn2: 0 };
  if (when !== 'exit' || IS_DARWIN || Process.arch !== 'x64')
    return none;
  const a = libcExport('exit');
  const b = libcExport('_exit');
  if (a === null && b === null)
    return none;
  return { exit_fn: uint64((a || ptr(0)).toString()), exit_fn2: uint64((b || ptr(0)).toString()) };
}

/*
 * One scan.  `when`: 'window-end' or 'exit'.  Sends the result as a `result` message
 * ({tracer: 'malloc', kind: 'leaks', ...}) and returns a short summary of it.
 */
export function scanLeaks(config, when) {
  const undoPriority = scanFirst();
  try {
    return scan(config, when);
  } finally {
    if (undoPriority !== null)
      undoPriority();
  }
}

function scan(config, when) {
  const t0 = now();
  const own = (core.owned || []).slice();
  const skip = cloakedTids();
  const glibcBuf = glibcStruct(own);
  const liveNow = Number(fn('mt_live_occupied', 'uint64', [])());
  const cap = candidateCapacity(liveNow, glibcLayout());

  // Every buffer first, so the ranges listed next can leave them out (they hold block addresses).
  const job = alloc(LEAK_JOB.size, own);
  const skipBuf = alloc(Math.max(8, skip.length * 8), own);
  skip.forEach((tid, i) => skipBuf.add(i * 8).writeU64(tid));
  const threads = alloc(MAX_THREADS * LEAK_THREAD.size, own);
  const regs = alloc(MAX_THREADS * LEAK_REGS * 8, own);
  const tracerStack = alloc(TRACER_STACK, own);
  const blocks = alloc(cap * LEAK_BLOCK.size, own);
  const marks = alloc(cap, own);
  const worklist = alloc(cap * 2 * 4, own);     // a block is queued at most twice (possibly, then surely reachable)
  const scratch = alloc(SCRATCH, own);
  const segs = alloc(MAX_SEGS * LEAK_SEG.size, own);
  const freed = alloc(MAX_FREED * 8, own);
  const inherited = inheritedAgent();
  const rootStats = { inheritedBytes: 0 };
  const roots = rootRanges(own, inherited, rootStats);
  // Allocated after the listing, so never inside a listed range; it holds no block address anyway.
  const rangeBuf = Memory.alloc(Math.max(1, roots.length) * LEAK_RANGE.size);
  roots.forEach((r, i) => writeStruct(rangeBuf.add(i * LEAK_RANGE.size), LEAK_RANGE,
    { base: uint64(r.base.toString()), size: r.size, flags: r.flags, live_from: r.live_from }));
  // Only resident pages are read: /proc/self/pagemap says which (open before the stop: no allocation).
  let pagemapFd = -1;
  if (!IS_DARWIN) {
    const path = Memory.allocUtf8String('/proc/self/pagemap');
    pagemapFd = new NativeFunction(findExport('open'), 'int', ['pointer', 'int'])(path, 0);
  }

  writeStruct(job, LEAK_JOB, {
    state: LEAK_STATES.idle, tgid: Process.id, self_tid: Process.getCurrentThreadId(),
    skip: uint64(skipBuf.toString()), n_skip: skip.length,
    threads: uint64(threads.toString()), threads_cap: MAX_THREADS, regs: uint64(regs.toString()),
    n_threads: 0, n_failed: 0,
    tracer_stack: uint64(tracerStack.toString()), tracer_stack_size: TRACER_STACK, tracer_pid: 0, error: 0,
    // The stop is part of the scan's time: it may take the whole budget (thousands of threads on a
    // loaded machine need more than world.c's 10 s default for a patch), never more.
    stop_timeout_us: Math.round((config.leaksBudget || 30) * 1e6),
    abandoned: 0, hold_tid: 0, hold_code_lo: 0, hold_code_hi: 0, signal_returns: 0, n_signal_returns: 0,
    ranges: uint64(rangeBuf.toString()), n_ranges: roots.length,
    blocks: uint64(blocks.toString()), blocks_cap: cap, n_blocks: 0, blocks_total: 0,
    marks: uint64(marks.toString()), worklist: uint64(worklist.toString()), n_work: 0,
    scratch: uint64(scratch.toString()), scratch_size: SCRATCH,
    phase: 0, range_index: 0, range_offset: 0, root_bytes: 0, block_bytes: 0,
    skip_stack: 0, skip_own: 0, skip_unreadable: 0, undecided_blocks: 0,
    glibc: glibcBuf === null ? 0 : uint64(glibcBuf.toString()),
    segs: uint64(segs.toString()), segs_cap: MAX_SEGS, n_segs: 0,
    freed: uint64(freed.toString()), freed_cap: MAX_FREED, n_freed: 0,
    n_tracked: 0, n_untracked: 0, n_allocator_meta: 0, walk_errors: 0, walk_bytes_unwalked: 0,
    freed_over_capacity: 0, pagemap_fd: pagemapFd < 0 ? uint64('0xffffffffffffffff') : pagemapFd,
    skip_unresident: 0, skip_dead_frames: 0, interior_guard: 0, leader: 0, clique_index: 0, in_frida: 0,
    page_size: Process.pageSize, ptr_mask: PTR_MASK, budget_us: Math.round((config.leaksBudget || 30) * 1e6),
    stop_us: 0, collect_us: 0, scan_us: 0,
    // At exit the exiting thread is read from its call to exit (leaks.c, mt_leak_find_exit_calls):
    // x86-64 Linux, where the Interceptor's saved context (rip = exit) tells the thread and the call.
    ...exitFunctions(when),
    exit_frames: 0, exit_calls: 0, exit_contexts: 0, exit_threads: 0, exit_words: 0, exit_reads: 0, exit_us: 0,
  });

  const budgetMs = (config.leaksBudget || 30) * 1000;
  // Exclusive: this thread keeps the script's lock while the world is stopped (runtime/world.js).
  const stop = new NativeFunction(core.cm.mt_leak_stop, 'int', ['pointer'], { scheduling: 'exclusive' });
  const resume = new NativeFunction(core.cm.mt_leak_resume, 'void', ['pointer'], { scheduling: 'exclusive' });
  const collect = fn('mt_leak_collect', 'uint64', ['pointer']);
  const step = fn('mt_leak_step', 'int', ['pointer', 'uint64']);

  const total = roots.reduce((a, r) => a + r.size, 0);
  const tStop = now();
  let stopped = false;
  let complete = false;
  let tStopped = tStop;
  let tCollected = tStop;
  let tResumed;
  let j;
  if (IS_DARWIN) {
    // Stop, scan and resume in one C call: no JavaScript (no allocation, no send()) while the
    // app's threads are suspended -- one may hold a lock Frida needs (DEVICE-UNVERIFIED).
    complete = fn('mt_leak_scan_all', 'int', ['pointer'])(job) === 1;
    tResumed = now();
    j = readStruct(job, LEAK_JOB);
    stopped = Number(j.state) !== LEAK_STATES.failed;
    tStopped = tStop + Number(j.stop_us) / 1000;
    tCollected = tStopped + Number(j.collect_us) / 1000;
  } else try {
    stopped = stop(job) === 1;
    if (!stopped) {
      const why = WORLD_ERRORS[Number(job.add(LEAK_JOB.fields.error[0]).readU64())] || 'it could not be stopped';
      send({ type: 'agent:warning', message: `leak scan with the world running: ${why}` });
    }
    tStopped = now();
    collect(job);
    tCollected = now();
    for (;;) {
      if (step(job, SLICE_BYTES) === 1) {
        complete = true;
        break;
      }
      // Linux: Frida's threads run on (only the app's are stopped), so progress can be sent.
      j = readStruct(job, LEAK_JOB);
      const done = Number(j.root_bytes) + Number(j.skip_stack) + Number(j.skip_own) + Number(j.skip_unreadable) +
        Number(j.skip_unresident) + Number(j.skip_dead_frames);
      send({ type: 'leaks:progress', t: now(), when, roots_done: Math.min(done, total), roots_total: total,
        blocks_scanned: Number(j.block_bytes), elapsed_ms: now() - t0 });
      if (now() - t0 > budgetMs)
        break;
    }
  } finally {
    resume(job);
    tResumed = now();
    if (pagemapFd >= 0)
      new NativeFunction(findExport('close'), 'int', ['int'])(pagemapFd);
  }
  // The world runs again: the buffers are ours, read at leisure.
  j = readStruct(job, LEAK_JOB);
  const n = Number(j.n_blocks);
  const t = tally(blocks, marks, n);
  const definite = t.byVerdict[LEAK_MARKS.definitely_lost];
  const indirect = t.byVerdict[LEAK_MARKS.indirectly_lost];
  const possible = t.byVerdict[LEAK_MARKS.possibly_lost];
  const reachable = t.byVerdict[LEAK_MARKS.reachable];
  const [fBlocks, fBytes] = t.total(t.byVerdict[LEAK_MARKS.frida_own]);
  const [dBlocks, dBytes] = t.total(definite);
  const [iBlocks, iBytes] = t.total(indirect);
  const [pBlocks, pBytes] = t.total(possible);
  const [rBlocks, rBytes] = t.total(reachable);
  const read = Number(j.root_bytes) + Number(j.skip_stack) + Number(j.skip_own) + Number(j.skip_unreadable) +
    Number(j.skip_unresident) + Number(j.skip_dead_frames);
  const lay = glibcLayout();
  // A stop that gave up (its time ran out, or it could not start) holds no thread: every thread of
  // the program ran on, not the few the stop had counted as failed before it gave up.
  const notStopped = stopped ? Number(j.n_failed) : (programThreads(skip) ?? Number(j.n_failed));
  const result = {
    type: 'result', tracer: 'malloc', kind: 'leaks', when, t: now(),
    complete, stopped,
    threads_stopped: stopped ? Number(j.n_threads) : 0, threads_not_stopped: notStopped,
    frida_threads: skip.length,
    // at exit: threads read from their call to exit, and of them those whose registers at that call
    // were found (leaks.c, mt_leak_find_exit_calls)
    exit_call_threads: Number(j.exit_calls), exit_call_registers: Number(j.exit_contexts),
    // ... and what finding them cost with the world stopped: one read per thread, a few more for
    // the exiting thread's call (tests/integration/test_leak_parity.py bounds it)
    exit_search: { threads: Number(j.exit_threads), words: Number(j.exit_words), reads: Number(j.exit_reads),
      ms: Number(j.exit_us) / 1000 },
    candidates: n, candidates_total: Number(j.blocks_total), undecided_blocks: Number(j.undecided_blocks),
    tracked_blocks: Number(j.n_tracked), before_tracing_blocks: t.untrackedBefore.blocks,
    before_tracing_bytes: t.untrackedBefore.bytes,
    allocator: lay === null ? null : {
      glibc: lay.version, main_arena_found: !lay.main_arena.equals(0), heap_segments: Number(j.n_segs),
      allocator_own_chunks: Number(j.n_allocator_meta), free_list_chunks: Number(j.n_freed) - Number(j.n_allocator_meta),
      walk_errors: Number(j.walk_errors), unwalked_bytes: Number(j.walk_bytes_unwalked),
      free_list_over_capacity: Number(j.freed_over_capacity),
    },
    definitely_lost_blocks: dBlocks, definitely_lost_bytes: dBytes,
    indirectly_lost_blocks: iBlocks, indirectly_lost_bytes: iBytes,
    possibly_lost_blocks: pBlocks, possibly_lost_bytes: pBytes,
    leaked_blocks: dBlocks + iBlocks, leaked_bytes: dBytes + iBytes,
    reachable_blocks: rBlocks, reachable_bytes: rBytes,
    frida_own_blocks: fBlocks, frida_own_bytes: fBytes,
    definitely_by_stack: [...definite.values()], indirectly_by_stack: [...indirect.values()],
    possibly_by_stack: [...possible.values()], reachable_by_stack: [...reachable.values()],
    leaked_listed: t.listed.length,
    root_ranges: roots.length, root_bytes: Number(j.root_bytes), block_bytes: Number(j.block_bytes),
    // a followed fork child: the parent agent's memory it inherited, as the parent last wrote it down
    inherited_agent: inherited === null ? null : {
      ranges: inherited.ranges.length, age_ms: inherited.age_ms, truncated: inherited.truncated,
    },
    skipped: {
      parent_agent_memory: rootStats.inheritedBytes,
      stacks_of_no_stopped_thread: Number(j.skip_stack), exited_threads_dead_frames: Number(j.skip_dead_frames),
      exiting_thread_frames: Number(j.exit_frames),
      scanning_thread_stack: Number(j.skip_own), unreadable: Number(j.skip_unreadable),
      never_touched_pages: Number(j.skip_unresident),
      not_scanned_budget: complete ? 0 : Math.max(0, total - read),
      candidates_over_capacity: Number(j.blocks_total) - n - Number(j.undecided_blocks),
    },
    stop_ms: tStopped - tStop, collect_ms: tCollected - tStopped, scan_ms: tResumed - tCollected,
    world_stopped_ms: tResumed - tStop, prepare_ms: tStop - t0, budget_ms: budgetMs,
    leaked: t.listed,
  };
  send(result);
  return { leaked_blocks: dBlocks + iBlocks, reachable_blocks: rBlocks, complete, stopped };
}
