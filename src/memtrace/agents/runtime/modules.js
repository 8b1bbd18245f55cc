/*
 * Loaded modules (announced as they appear, so the host can symbolize any address) and
 * symbolization of return addresses, each asked for once by the host.
 */

import { IS_DARWIN, now } from './platform.js';

const knownModules = new Set();

const MH_MAGIC_64 = 0xfeedfacf;
const LC_UUID = 0x1b;

/* The LC_UUID of the Mach-O image whose header is at `base` (as dwarfdump prints it:
 * upper-case hex, 8-4-4-4-12), read from memory; null when it has none or is unreadable.  The host
 * finds the image's dSYM and the device's shared-cache symbols by it. */
export function machoUuid(base) {
  try {
    if (base.readU32() !== MH_MAGIC_64)
      return null;
    const ncmds = base.add(16).readU32();
    let cmd = base.add(32);
    for (let i = 0; i < ncmds && i < 4096; i++) {
      const kind = cmd.readU32();
      const size = cmd.add(4).readU32();
      if (kind === LC_UUID) {
        const hex = Array.from(new Uint8Array(cmd.add(8).readByteArray(16)),
          b => b.toString(16).padStart(2, '0')).join('').toUpperCase();
        return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
      }
      if (size < 8)
        return null;
      cmd = cmd.add(size);
    }
  } catch (e) {
    return null;
  }
  return null;
}

export function describeModule(m) {
  const out = { name: m.name, path: m.path, base: m.base.toString(), size: m.size };
  if (IS_DARWIN) {
    const uuid = machoUuid(m.base);
    if (uuid !== null)
      out.uuid = uuid;
  }
  return out;
}

/* modules:update with every module not announced before. */
export function announceModules() {
  const fresh = [];
  for (const m of Process.enumerateModules()) {
    const k = m.base.toString();
    if (!knownModules.has(k)) {
      knownModules.add(k);
      fresh.push(describeModule(m));
    }
  }
  if (fresh.length > 0)
    send({ type: 'modules:update', t: now(), modules: fresh });
}

/* ---- modules as they load ---------------------------------------------------------------
 *
 * Frida 17's module observer calls onAdded on the loading thread once the dynamic loader has
 * mapped a library (dlopen, a Python extension module, a plugin), before its constructors and
 * before any of its code runs.  The module is announced then, and the loading thread waits
 * (bounded: process.js awaitAck) until the host has recorded it and handed over its unwind
 * table, so that its first allocation already walks through it with a name.  The periodic scan
 * stays as a fallback (and for a runtime without the observer). */

let observer = null;
let announcing = false;
const current = new Map();        // base -> descriptor of every module loaded now (observer)

export function watchModules(onLoaded) {
  if (observer !== null || typeof Process.attachModuleObserver !== 'function')
    return observer !== null;
  try {
    observer = Process.attachModuleObserver({
      onAdded(m) {
        const d = describeModule(m);
        current.set(d.base, d);
        // The modules present at attach are already known: only later loads are announced here.
        if (announcing && !knownModules.has(d.base)) {
          knownModules.add(d.base);
          onLoaded(d);
        }
      },
      onRemoved(m) {
        current.delete(m.base.toString());
      },
    });
  } catch (e) {
    observer = null;
    return false;
  }
  announcing = true;
  return true;
}

export function unwatchModules() {
  announcing = false;
  if (observer !== null) {
    try {
      observer.detach();
    } catch (e) {
      // the process is going away
    }
    observer = null;
  }
}

/* Every module loaded now: the observer's list while it runs (no enumeration, which would wait
 * for a loader that is itself waiting in onAdded for the host), else an enumeration. */
export function moduleList() {
  if (observer !== null)
    return [...current.values()];
  return Process.enumerateModules().map(describeModule);
}

/* [address, module, offset, symbol, file, line] per address (null where unknown).  Asked only after
 * the window (stacks_seen.py says why). */
export function symbolize(addresses) {
  return addresses.map(a => {
    const p = ptr(a);
    let s = null;
    try {
      s = DebugSymbol.fromAddress(p);
    } catch (e) {
      s = null;
    }
    const m = Process.findModuleByAddress(p);
    return [
      a,
      m === null ? null : m.name,
      m === null ? null : p.sub(m.base).toInt32(),
      (s === null || s.name === null) ? null : s.name,
      (s === null || !s.fileName) ? null : s.fileName,
      (s === null || !s.lineNumber) ? null : s.lineNumber,
    ];
  });
}
