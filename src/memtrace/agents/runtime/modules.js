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
