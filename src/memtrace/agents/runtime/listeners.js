/*
 * Listeners for the JavaScript-hooked tracers.
 */

import { applyPatches, deferPatch, notePatched, warnLater } from './world.js';

/* A listener on `address` (null: the target lacks it, recon has said so), kept in `listeners`
 * for uninstall.  Attached by the tracer's applyPatches (world.js: made right before the world
 * stops, so that no lookup in between writes it early).  A refusal becomes a warning, never a
 * failed start.  True when queued. */
export function attachListener(name, address, callbacks, listeners, data) {
  if (address === null || address === undefined)
    return false;
  notePatched(address);
  deferPatch(() => {
    try {
      listeners.push(data === undefined ? Interceptor.attach(address, callbacks)
        : Interceptor.attach(address, callbacks, data));
    } catch (e) {
      warnLater(`cannot hook ${name} at ${address}: ${e.message || e}`);
    }
  });
  return true;
}

/* Every listener out, the list emptied, the code restored (world stopped) before returning. */
export function detachListeners(listeners, what) {
  for (const l of listeners.splice(0))
    l.detach();
  applyPatches(what || 'listeners out');
}
