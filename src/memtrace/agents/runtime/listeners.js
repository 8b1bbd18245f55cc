/*
 * Listeners for the JavaScript-hooked tracers.
 */

import { applyPatches, notePatched, warnLater } from './world.js';

/* A listener on `address` (null: the target lacks it, recon has said so), kept in `listeners`
 * for uninstall.  A refusal becomes a warning, never a failed start.  True when in place. */
export function attachListener(name, address, callbacks, listeners, data) {
  if (address === null || address === undefined)
    return false;
  notePatched(address);
  try {
    listeners.push(data === undefined ? Interceptor.attach(address, callbacks)
      : Interceptor.attach(address, callbacks, data));
    return true;
  } catch (e) {
    warnLater(`cannot hook ${name} at ${address}: ${e.message || e}`);
    return false;
  }
}

/* Every listener out, the list emptied, the code restored (world stopped) before returning. */
export function detachListeners(listeners, what) {
  for (const l of listeners.splice(0))
    l.detach();
  applyPatches(what || 'listeners out');
}
