/*
 * Listeners for the JavaScript-hooked tracers (fds, threads, iosurface, purgeable): in and out
 * with the world stopped (runtime/world.js explains how, and why draining comes first).
 */

import { applyListenerPatches, deferPatch, deferUntilFlushed, holdListenerSite, isRedirected, notePatched,
  releaseListenerSites, warnLater } from './world.js';

const siteOf = new Map();     // InvocationListener -> the address it is on

/* A listener on `address` (null: the target lacks it, recon has said so), kept in `listeners`
 * for uninstall.  Attached by the tracer's applyListeners (world.js: made right before the world
 * stops, so that no lookup in between writes it early).  A refusal becomes a warning, never a
 * failed start.  True when queued. */
export function attachListener(name, address, callbacks, listeners, data) {
  if (address === null || address === undefined)
    return false;
  // A site memtrace redirects already gets its listener after the flush (no code to write, and
  // live at once: world.js, deferUntilFlushed); any other before the stop.
  const defer = isRedirected(address) ? deferUntilFlushed : deferPatch;
  notePatched(address, true);
  defer(() => {
    try {
      const l = data === undefined ? Interceptor.attach(address, callbacks)
        : Interceptor.attach(address, callbacks, data);
      listeners.push(l);
      siteOf.set(l, address);
      holdListenerSite(address);
    } catch (e) {
      warnLater(`cannot hook ${name} at ${address}: ${e.message || e}`);
    }
  });
  return true;
}

/* Every listener queued by attachListener in, with the world stopped.  True when it was. */
export function applyListeners(what) {
  return applyListenerPatches(what);
}

/* Every listener out, the list emptied, the code restored (world stopped) before returning. */
export function detachListeners(listeners, what) {
  const sites = [];
  for (const l of listeners.splice(0)) {
    l.detach();    // not called any more from now on; its restore is queued
    if (siteOf.has(l)) {
      sites.push(siteOf.get(l));
      siteOf.delete(l);
    }
  }
  return releaseListenerSites(sites, what || 'listeners out');
}
