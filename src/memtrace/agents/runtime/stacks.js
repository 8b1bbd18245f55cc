/*
 * Stacks for the JavaScript-hooked tracers (the malloc tracer's are walked in C).
 */

import { unwindStep } from './unwind.js';

/* Swift marks an async frame by setting bit 60 of the frame pointer it saves (arm64 and x86-64;
 * swift/docs/ABI/CallConvSummary): the bit is cleared before following the chain, as Apple's
 * backtracers do.  No user-space address has it set, so clearing it is harmless elsewhere. */
const SWIFT_ASYNC_FRAME_MASK = ptr('0xefffffffffffffff');

/* Return address + the frame-pointer chain above it; every read guarded, PAC stripped on
 * arm64e.  low: the stack pointer at the hook, when known: frames must lie above it (within
 * 64 MiB), which stops a walk that wandered off the stack; on x86-64 it also lets the walk
 * step through modules without frame pointers with their unwind tables (unwind.js), as the
 * malloc core does in C.  (A frame of a function hooked with a call listener would show
 * Interceptor's trampoline: hooks above C-hooked entries are therefore probes.) */
export function walkFrames(ret, fp, max, low) {
  const first = ret.strip();
  const frames = [first.toString()];
  const ps = Process.pointerSize;
  const high = low ? low.add(64 * 1024 * 1024) : null;
  // The frame being left: its return address and, where known, its stack pointer after return.
  let pc = first;
  let sp = (low && Process.arch === 'x64') ? low.add(ps) : null;
  let f = fp.and(SWIFT_ASYNC_FRAME_MASK);
  let skippedOwn = false;
  try {
    while (frames.length < max) {
      const step = sp === null ? null : unwindStep(pc, sp, f, high);
      if (step !== null) {
        if (step.stop || step.pc.isNull())
          break;
        pc = step.pc.strip();
        sp = step.sp;
        f = step.fp;
        frames.push(pc.toString());
        continue;
      }
      if (f.isNull() || !f.and(ps - 1).isNull())
        break;
      if (!skippedOwn && frames.length === 1 && isOwnRecord(f, first, low)) {
        skippedOwn = true;
        f = f.readPointer().and(SWIFT_ASYNC_FRAME_MASK);
        continue;
      }
      if (low && (f.compare(low) < 0 || f.compare(high) >= 0))
        break;
      if (sp !== null && f.compare(sp) < 0)
        break;
      const next = f.readPointer().and(SWIFT_ASYNC_FRAME_MASK);
      const r = f.add(ps).readPointer().strip();
      if (r.isNull())
        break;
      frames.push(r.toString());
      if (sp === null && next.compare(f) <= 0)
        break;
      pc = r;
      if (sp !== null)
        sp = f.add(2 * ps);
      f = next;
    }
  } catch (e) {
    // an unreadable frame ends the stack; what was read is still evidence
  }
  return frames;
}

/* A frame record of the hooked function itself (a hook placed after its prologue) holds the
 * return address already reported: the walk steps over it instead of showing the caller twice.
 * x86-64: the record's return slot is the one the hook read; arm64: the address is in lr. */
function isOwnRecord(f, first, low) {
  if (Process.arch === 'x64' && low)
    return f.add(8).equals(low);
  return f.add(Process.pointerSize).readPointer().strip().equals(first);
}

/* The caller chain at a hooked function's entry, walked by us: Frida's accurate backtracer
 * is libunwind on Linux, which opens a pipe of its own in every thread it unwinds (and the fd
 * tracer would then find descriptors nobody opened). */
export function entryFrames(ctx, max) {
  if (Process.arch === 'x64')
    return walkFrames(ctx.rsp.readPointer(), ctx.rbp, max, ctx.sp);   // [rsp]: the return address
  if (Process.arch === 'arm64')     // ARCH-UNVERIFIED on arm64 Linux: the tests run on x86-64
    return walkFrames(ctx.lr, ctx.fp, max, ctx.sp);
  return Thread.backtrace(ctx, Backtracer.FUZZY).slice(0, max).map(p => p.toString());
}
