/*
 * Everything the agent tells the host between start and stop goes out here, in batches: the
 * core's binary records with its counters (events:batch), the JavaScript tracers' events
 * (events:json), or, from an agent with nothing to say, agent:alive.
 */

import { core, readCounters } from './core.js';
import { now } from './platform.js';

const JSON_BATCH = 512;           // events held before an early flush
let pendingJson = [];

/* One drain: every thread's records, then the counters, in one message. */
export function flush() {
  if (core.cm !== null) {
    let more = true;
    while (more) {
      const n = Number(core.fns.drain(core.drainBuf, core.drainCap));
      more = n > core.drainCap / 2;
      const payload = {
        type: 'events:batch',
        t: now(),
        counters: readCounters(),
        lost: Number(core.fns.lost()),
        live: Number(core.fns.live()),
        stacks: Number(core.fns.stacks()),
      };
      send(payload, n > 0 ? core.drainBuf.readByteArray(n) : null);
    }
  }
  if (pendingJson.length > 0) {
    const events = pendingJson;
    pendingJson = [];
    send({ type: 'events:json', t: now(), events });
  } else if (core.cm === null) {
    // The host reads a silent agent as a frozen process (anti-debug): a tracer with nothing to
    // report still says it is alive.
    send({ type: 'agent:alive', t: now() });
  }
}

/* A low-frequency event, stamped now and sent with the next flush. */
export function emitJson(event) {
  event.t = now();
  pendingJson.push(event);
  if (pendingJson.length >= JSON_BATCH)
    flush();
}

/* Something the user should know (shown, and kept in the capture); never fatal. */
export function warn(message) {
  send({ type: 'agent:warning', message });
}
