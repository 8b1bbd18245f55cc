/*
 * Everything the agent tells the host between start and stop goes out here, in batches: the
 * core's binary records with its counters (events:batch), the JavaScript tracers' events
 * (events:json), or, from an agent with nothing to say, agent:alive.
 */

import { core, drainOnce, exactU64, readCounters } from './core.js';
import { now } from './platform.js';

const JSON_BATCH = 512;           // events held before an early flush
/* A drain larger than this goes out in pieces (events:part, then the batch with the rest; the host
 * joins them, capture_loop.py).  send() copies its bytes and Frida's transport copies them again,
 * each copy an allocation of the agent's allocator: a copy of megabytes was fresh pages, zeroed,
 * faulted in and unmapped again, and each unmap a TLB shootdown that interrupted the target's threads
 * too.  cc1plus ships ~3 MiB of stack definitions a drain: that churn was ~0.1 s of its 0.5 s (18,800
 * page faults on the agent's threads; ~8,000 with pieces of 192 KiB, and no fewer with 48 KiB ones,
 * which cost more wake-ups: the allocator's own threshold was not looked up, only measured around). */
const SEND_PIECE = 192 * 1024;
let pendingJson = [];

/* A tracer with a core may add to each batch: batchHook(payload, info, last) fills in what only
 * it knows (malloc: the timeline sample, counts moved between aliased kinds). */
let batchHook = null;

export function setBatchHook(fn) {
  batchHook = fn;
}

/* What a tracer keeps outside JavaScript until the flush takes it (the purgeable tracer's C event
 * ring): each source is called first thing in every flush, on the agent's own thread. */
const flushSources = [];

export function addFlushSource(fn) {
  flushSources.push(fn);
}

/* One drain: stack definitions, changed aggregate rows (and events in events mode), then the
 * counters, in one message; again while the drain says its buffer filled up.  Once the hooks
 * are out (stop, or the process exiting) the drain is final: it ships the composition at the
 * peak and the live table. */
export function flush() {
  for (const source of flushSources)
    source();
  if (core.cm !== null) {
    const final = core.started && !core.enabled;
    let more = true;
    while (more) {
      const { n, info } = drainOnce(final);
      more = info.more !== 0;
      const payload = {
        type: 'events:batch',
        t: now(),
        mode: core.events ? 'events' : 'aggregate',
        final,
        counters: readCounters(),
        lost: exactU64(core.fns.lost()),
        live: info.tracked_blocks,
        stacks: info.stacks,
      };
      if (batchHook !== null)
        batchHook(payload, info, !more);
      // The drain buffer itself, not a copy of it: send() copies the bytes once, before it returns.
      let off = 0;
      for (; n - off > SEND_PIECE; off += SEND_PIECE)
        send({ type: 'events:part' }, ArrayBuffer.wrap(core.drainBuf.add(off), SEND_PIECE));
      send(payload, n > off ? ArrayBuffer.wrap(core.drainBuf.add(off), n - off) : null);
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
