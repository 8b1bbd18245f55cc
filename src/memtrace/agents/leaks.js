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
 */

import { LEAK_BLOCK, LEAK_JOB, LEAK_RANGE, LEAK_RANGE_STACK, LEAK_REGS, LEAK_STATES, LEAK_THREAD,
  WORLD_ERRORS } from './layout.js';
import { core } from './runtime/core.js';
import { IS_DARWIN, findExport, now } from './runtime/platform.js';
import { readStruct, writeStruct } from './runtime/structs.js';
import { fridaThreads } from './runtime/world.js';

const SLICE_BYTES = 64 * 1024 * 1024;    // bytes read between two progress messages
const MAX_THREADS = 4096;
const MAX_LEAKED_LISTED = 200000;         // addresses sent; beyond, only the totals
const TRACER_STACK = 64 * 1024;
const SCRATCH = 64 * 1024;
const LINUX_ARENA_ALIGN = 64 * 1024 * 1024;   // glibc's HEAP_MAX_SIZE: non-main arenas start aligned

// cmodule/world.c (stopping the world) and leaks.c's reads.
const LINUX_SYMBOLS = ['clone', 'ptrace', 'waitpid', 'prctl', 'open', 'close', 'read', 'process_vm_readv',
  'usleep'];
const DARWIN_SYMBOLS = ['mach_task_self_', 'task_threads', 'thread_suspend', 'thread_resume', 'thread_get_state',
  'mach_port_deallocate', 'mach_vm_deallocate', 'mach_vm_read_overwrite', 'mach_vm_region_recurse',
  'usleep'];

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

/* [base, end) minus every hole, as {base, size} pieces. */
function subtract(range, holes) {
  let pieces = [{ base: range.base, end: rangeEnd(range) }];
  for (const h of holes) {
    const hEnd = h.base.add(h.size);
    const next = [];
    for (const p of pieces) {
      if (hEnd.compare(p.base) <= 0 || h.base.compare(p.end) >= 0) {
        next.push(p);
        continue;
      }
      if (h.base.compare(p.base) > 0)
        next.push({ base: p.base, end: h.base });
      if (hEnd.compare(p.end) < 0)
        next.push({ base: hEnd, end: p.end });
    }
    pieces = next;
  }
  return pieces.map(p => ({ base: p.base, size: Number(p.end.sub(p.base).toString()) }));
}

/* Linux: a pthread stack is a writable mapping right above a guard page.  glibc's non-main
 * arenas also sit above an inaccessible range (the previous arena's reserve), but start on a
 * 64 MB boundary, which a stack after its guard page never does. */
function stackShaped(range, guards) {
  if (IS_DARWIN) {
    const tag = fn('mt_leak_region_tag', 'int', ['uint64'])(uint64(range.base.toString()));
    return tag === 30;    // VM_MEMORY_STACK (DEVICE-UNVERIFIED)
  }
  // A module's data can sit above a hole the loader made inaccessible: not a stack.
  if (range.file !== undefined || Process.findModuleByAddress(range.base) !== null)
    return false;
  if (range.base.and(ptr(LINUX_ARENA_ALIGN - 1)).isNull())
    return false;
  return guards.has(range.base.toString()) && holdsThreadControlBlock(range);
}

/* glibc puts a thread's struct pthread at the top of its stack mapping, and the TCB header at
 * its start points to itself twice (tcbhead_t.tcb and .self, 16 bytes apart).  Requiring that
 * signature keeps an ordinary anonymous mapping that happens to sit above a guard page (a
 * custom arena, a big buffer) from being taken for a dead thread's stack and left unscanned,
 * which would make what it points to look leaked. */
const TCB_SEARCH_BYTES = 16 * 1024;

function holdsThreadControlBlock(range) {
  const span = Math.min(range.size, TCB_SEARCH_BYTES);
  const start = range.base.add(range.size - span);
  try {
    for (let off = span - 24; off >= 0; off -= 8) {
      const at = start.add(off);
      if (at.readPointer().equals(at) && at.add(16).readPointer().equals(at))
        return true;
    }
  } catch (e) {
    // unreadable: not something we can call a stack
  }
  return false;
}

/* The roots the agent can list before the stop. */
function rootRanges(own) {
  const guards = new Set();
  if (!IS_DARWIN) {
    for (const g of Process.enumerateRanges({ protection: '---', coalesce: false })) {
      if (g.file === undefined)
        guards.add(rangeEnd(g).toString());
    }
  }
  const out = [];
  for (const r of Process.enumerateRanges({ protection: 'rw-', coalesce: false })) {
    const flags = stackShaped(r, guards) ? LEAK_RANGE_STACK : 0;
    for (const piece of subtract(r, own)) {
      if (piece.size > 0)
        out.push({ base: piece.base, size: piece.size, flags });
    }
  }
  return out;
}

function alloc(size, own) {
  const p = Memory.alloc(size);
  own.push({ base: p, size });
  return p;
}

/* Linux: every task of the process that Frida cloaks (its own threads), listed by the C (no
 * allocation: opendir would call the allocator we are tracing). */
function cloakedTids() {
  if (IS_DARWIN)
    return [];    // DEVICE-UNVERIFIED: Frida's threads on Darwin are told apart the same way once listed
  return fridaThreads(fn('mt_leak_list_tasks', 'uint64', ['uint64', 'pointer', 'uint64']));
}

/*
 * One scan.  `when`: 'window-end' or 'exit'.  Sends the result as a `result` message
 * ({tracer: 'malloc', kind: 'leaks', ...}) and returns a short summary of it.
 */
export function scanLeaks(config, when) {
  const t0 = now();
  const own = (core.owned || []).slice();
  const skip = cloakedTids();
  const liveNow = Number(fn('mt_live_occupied', 'uint64', [])());
  const cap = Math.max(1024, Math.ceil(liveNow * 1.5) + 4096);

  // Every buffer first, so the ranges listed next can leave them out (they hold block addresses).
  const job = alloc(LEAK_JOB.size, own);
  const skipBuf = alloc(Math.max(8, skip.length * 8), own);
  skip.forEach((tid, i) => skipBuf.add(i * 8).writeU64(tid));
  const threads = alloc(MAX_THREADS * LEAK_THREAD.size, own);
  const regs = alloc(MAX_THREADS * LEAK_REGS * 8, own);
  const tracerStack = alloc(TRACER_STACK, own);
  const blocks = alloc(cap * LEAK_BLOCK.size, own);
  const marks = alloc(cap, own);
  const worklist = alloc(cap * 4, own);
  const scratch = alloc(SCRATCH, own);
  const roots = rootRanges(own);
  // Allocated after the listing, so never inside a listed range; it holds no block address anyway.
  const rangeBuf = Memory.alloc(Math.max(1, roots.length) * LEAK_RANGE.size);
  roots.forEach((r, i) => writeStruct(rangeBuf.add(i * LEAK_RANGE.size), LEAK_RANGE,
    { base: uint64(r.base.toString()), size: r.size, flags: r.flags }));

  writeStruct(job, LEAK_JOB, {
    state: LEAK_STATES.idle, tgid: Process.id, self_tid: Process.getCurrentThreadId(),
    skip: uint64(skipBuf.toString()), n_skip: skip.length,
    threads: uint64(threads.toString()), threads_cap: MAX_THREADS, regs: uint64(regs.toString()),
    n_threads: 0, n_failed: 0,
    tracer_stack: uint64(tracerStack.toString()), tracer_stack_size: TRACER_STACK, tracer_pid: 0, error: 0,
    ranges: uint64(rangeBuf.toString()), n_ranges: roots.length,
    blocks: uint64(blocks.toString()), blocks_cap: cap, n_blocks: 0, blocks_total: 0,
    marks: uint64(marks.toString()), worklist: uint64(worklist.toString()), n_work: 0,
    scratch: uint64(scratch.toString()), scratch_size: SCRATCH,
    phase: 0, range_index: 0, range_offset: 0, root_bytes: 0, block_bytes: 0,
    skip_stack: 0, skip_own: 0, skip_unreadable: 0, undecided_blocks: 0,
  });

  const budgetMs = (config.leaksBudget || 30) * 1000;
  // Exclusive: this thread keeps the script's lock while the world is stopped (runtime/world.js).
  const stop = new NativeFunction(core.cm.mt_leak_stop, 'int', ['pointer'], { scheduling: 'exclusive' });
  const resume = new NativeFunction(core.cm.mt_leak_resume, 'void', ['pointer'], { scheduling: 'exclusive' });
  const collect = fn('mt_leak_collect', 'uint64', ['pointer']);
  const step = fn('mt_leak_step', 'int', ['pointer', 'uint64']);

  const stopped = stop(job) === 1;
  if (!stopped) {
    const why = WORLD_ERRORS[Number(job.add(LEAK_JOB.fields.error[0]).readU64())] || 'it could not be stopped';
    send({ type: 'agent:warning', message: `leak scan with the world running: ${why}` });
  }
  const tStopped = now();
  let complete = false;
  let leaked = [];
  let leakedCount = 0;
  let leakedBytes = 0;
  let reachableCount = 0;
  let reachableBytes = 0;
  let j;
  try {
    collect(job);
    const total = roots.reduce((a, r) => a + r.size, 0);
    for (;;) {
      if (step(job, SLICE_BYTES) === 1) {
        complete = true;
        break;
      }
      j = readStruct(job, LEAK_JOB);
      const done = Number(j.root_bytes) + Number(j.skip_stack) + Number(j.skip_own) + Number(j.skip_unreadable);
      send({ type: 'leaks:progress', t: now(), when, roots_done: done, roots_total: total,
        blocks_scanned: Number(j.block_bytes), elapsed_ms: now() - t0 });
      if (now() - t0 > budgetMs)
        break;
    }
    j = readStruct(job, LEAK_JOB);
    const n = Number(j.n_blocks);
    const leakedBy = new Map();
    const reachableBy = new Map();
    for (let i = 0; i < n; i++) {
      const at = blocks.add(i * LEAK_BLOCK.size);
      const size = Number(at.add(8).readU64());
      const sid = at.add(16).readU32();
      const by = marks.add(i).readU8() !== 0 ? reachableBy : leakedBy;
      const acc = by.get(sid);
      if (acc === undefined)
        by.set(sid, [sid, 1, size]);
      else {
        acc[1]++;
        acc[2] += size;
      }
      if (by === reachableBy) {
        reachableCount++;
        reachableBytes += size;
      } else {
        leakedCount++;
        leakedBytes += size;
        if (leaked.length < MAX_LEAKED_LISTED)
          leaked.push([at.readPointer().toString(), size, sid]);
      }
    }
    const result = {
      type: 'result', tracer: 'malloc', kind: 'leaks', when, t: now(),
      complete, stopped,
      threads_stopped: Number(j.n_threads), threads_not_stopped: Number(j.n_failed),
      frida_threads: skip.length,
      candidates: n, candidates_total: Number(j.blocks_total), undecided_blocks: Number(j.undecided_blocks),
      leaked_blocks: leakedCount, leaked_bytes: leakedBytes,
      reachable_blocks: reachableCount, reachable_bytes: reachableBytes,
      leaked_by_stack: [...leakedBy.values()], reachable_by_stack: [...reachableBy.values()],
      leaked_listed: leaked.length,
      root_ranges: roots.length, root_bytes: Number(j.root_bytes), block_bytes: Number(j.block_bytes),
      skipped: {
        stacks_of_no_stopped_thread: Number(j.skip_stack), scanning_thread_stack: Number(j.skip_own),
        unreadable: Number(j.skip_unreadable),
        not_scanned_budget: complete ? 0 : Math.max(0, total - (Number(j.root_bytes) + Number(j.skip_stack) +
          Number(j.skip_own) + Number(j.skip_unreadable))),
        candidates_over_capacity: Number(j.blocks_total) - n - Number(j.undecided_blocks),
      },
      stop_ms: tStopped - t0, scan_ms: now() - tStopped, budget_ms: budgetMs,
      leaked,
    };
    send(result);
  } finally {
    resume(job);
  }
  return { leaked_blocks: leakedCount, reachable_blocks: reachableCount, complete, stopped };
}
