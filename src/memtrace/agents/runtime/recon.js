/*
 * Recon: every symbol a tracer wants, found or MISSING.  A wanted symbol is a name or
 * {name, module?, resolve?, role?}; resolve() overrides the lookup.
 */

import { findExport, moduleOf } from './platform.js';

export function recon(wanted) {
  return wanted.map(w => {
    const spec = (typeof w === 'string') ? { name: w } : w;
    let address = null;
    try {
      address = spec.resolve ? spec.resolve() : findExport(spec.name, spec.module || null);
    } catch (e) {
      address = null;
    }
    return {
      name: spec.name,
      module: address === null ? (spec.module || null) : moduleOf(address),
      address: address === null ? null : address.toString(),
      status: address === null ? 'MISSING' : 'found',
      role: spec.role || 'hook',
    };
  });
}
