/*
 * Loaded modules (announced as they appear, so the host can symbolize any address) and
 * symbolization of return addresses, each asked for once by the host.
 */

import { now } from './platform.js';

const knownModules = new Set();

export function describeModule(m) {
  return { name: m.name, path: m.path, base: m.base.toString(), size: m.size };
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

/* [address, module, offset, symbol, file, line] per address (null where unknown). */
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
