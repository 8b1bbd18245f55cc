/*
 * Calibration: what the allocator and the kernel say the process uses, at start and at exit,
 * so the host can state how much of it the trace explains.
 *
 * Its values are read as JavaScript Numbers on purpose: each is a size of memory mapped in one
 * process at one instant (in use, resident, footprint), bounded by the 48-bit address space
 * (< 2^48), so exact.  Counters that grow with time (calls, gross bytes, the peak) never pass
 * through a Number (runtime/core.js, drainOnce; memtrace/exact.py on the host).
 */

import { core, ownBytes } from './core.js';
import { IS_DARWIN, findExport, now } from './platform.js';
import { selfTaskVmInfo } from './taskinfo.js';

/* The agent's own tables: reserved and resident bytes (mincore), so calibration can take the
 * agent's footprint out of the target's.  null without a core (JavaScript-only tracers).  The
 * stack budget's tables reserve gigabytes: mincore is asked a chunk at a time into one small
 * vector, counted in C -- a vector per table, as large as its pages, and a NativeFunction per
 * table cost 6-10 ms of the target's CPU at its exit. */
const MINCORE_CHUNK_PAGES = 64 * 1024;
let mincoreFns = null;

function agentMemory() {
  const mincore = findExport('mincore');
  if (core.tables.length === 0 || mincore === null)
    return null;
  if (mincoreFns === null) {
    mincoreFns = {
      mincore: new NativeFunction(mincore, 'int', ['pointer', 'size_t', 'pointer']),
      count: core.cm && core.cm.mt_count_resident
        ? new NativeFunction(core.cm.mt_count_resident, 'uint64', ['pointer', 'uint64']) : null,
      vec: Memory.alloc(MINCORE_CHUNK_PAGES),
    };
  }
  const { count, vec } = mincoreFns;
  const ps = Process.pageSize;
  let reserved = 0;
  let resident = 0;
  // Which table holds what: the footprint's first question when the agent's share is large.
  const byTable = {};
  for (const t of core.tables) {
    const pages = Math.ceil((t.extent ? Math.min(Number(t.size), t.extent()) : Number(t.size)) / ps);
    const before = resident;
    reserved += Number(t.size);
    for (let done = 0; done < pages; done += MINCORE_CHUNK_PAGES) {
      const n = Math.min(MINCORE_CHUNK_PAGES, pages - done);
      const had = resident;
      if (mincoreFns.mincore(t.base.add(done * ps), n * ps, vec) !== 0)
        return null;
      if (count !== null) {
        resident += ps * Number(count(vec, n));
      } else {
        const bytes = new Uint8Array(vec.readByteArray(n));
        for (let i = 0; i < n; i++)
          if (bytes[i] & 1)
            resident += ps;
      }
      // A table that fills from its start has nothing resident past a stretch with nothing: the
      // stack budget reserves gigabytes, and counting them all was 1.5 ms of every target's exit.
      if (t.prefix && resident === had)
        break;
    }
    const name = t.name || 'other';
    byTable[name] = (byTable[name] || 0) + resident - before;
  }
  return { source: 'mincore', tables: core.tables.length, reserved, resident, resident_by_table: byTable };
}

function readProcKeyValues(path) {
  const out = {};
  let text;
  try {
    text = File.readAllText(path);
  } catch (e) {
    return null;
  }
  for (const line of text.split('\n')) {
    const m = /^(\w+):\s+(\d+)\s*kB/.exec(line);
    if (m)
      out[m[1]] = Number(m[2]) * 1024;
  }
  return out;
}

/* `exiting`: the process is exiting, and every microsecond here is the target's (its exiting thread
 * waits on this): smaps_rollup, which walks the page tables of every mapping -- the agent's
 * reservations included -- for the one value the host does not use (Pss_Anon: 0.8-1.4 ms of a
 * target's exit), is not read; pss_anon is null then. */
function calibrateLinux(exiting) {
  const result = { allocator: null, footprint: null };
  const mi2 = findExport('mallinfo2');
  if (mi2 !== null) {
    const f = new NativeFunction(mi2, ['size_t', 'size_t', 'size_t', 'size_t', 'size_t',
      'size_t', 'size_t', 'size_t', 'size_t', 'size_t'], []);
    const v = f().map(Number);
    result.allocator = {
      source: 'mallinfo2', arena: v[0], ordblks: v[1], hblks: v[3], hblkhd: v[4],
      uordblks: v[7], fordblks: v[8], in_use: v[7] + v[4],
    };
  }
  const status = readProcKeyValues('/proc/self/status');
  const rollup = exiting ? null : readProcKeyValues('/proc/self/smaps_rollup');
  if (status !== null) {
    result.footprint = {
      source: '/proc/self/status',
      rss: status.VmRSS || 0,
      rss_anon: status.RssAnon || 0,
      hwm: status.VmHWM || 0,
      pss_anon: rollup === null ? null : (rollup.Pss_Anon || 0),
      footprint: status.RssAnon || 0,
    };
  }
  return result;
}

function calibrateDarwin() {
  // DEVICE-UNVERIFIED: struct malloc_statistics_t from <malloc/malloc.h>.
  const result = { allocator: null, footprint: null };
  const zs = findExport('malloc_zone_statistics');
  if (zs !== null) {
    const stats = Memory.alloc(32);
    new NativeFunction(zs, 'void', ['pointer', 'pointer'])(NULL, stats);
    result.allocator = {
      source: 'malloc_zone_statistics',
      blocks_in_use: stats.readU32(),
      in_use: Number(stats.add(8).readU64()),
      max_in_use: Number(stats.add(16).readU64()),
      allocated: Number(stats.add(24).readU64()),
    };
  }
  const vm = selfTaskVmInfo();
  if (vm !== null) {
    result.footprint = {
      source: 'task_vm_info',
      resident: vm.resident_size,
      internal: vm.internal,
      reusable: vm.reusable,
      purgeable_volatile_pmap: vm.purgeable_volatile_pmap,
      compressed: vm.compressed,
      footprint: vm.phys_footprint,
      ledger_purgeable_nonvolatile: vm.ledger_purgeable_nonvolatile,
      ledger_purgeable_volatile: vm.ledger_purgeable_volatile,
    };
  }
  return result;
}

export function calibrate(exiting = false) {
  const r = IS_DARWIN ? calibrateDarwin() : calibrateLinux(exiting);
  r.agent = agentMemory();
  // What memtrace's own thread holds in the allocator now: the host takes it out of in-use.
  r.own_bytes = ownBytes();
  r.t = now();
  return r;
}
