/*
 * Stacks for the JavaScript-hooked tracers (the malloc tracer's are walked in C).
 */

/* Swift marks an async frame by setting bit 60 of the frame pointer it saves (arm64 and x86-64;
 * swift/docs/ABI/CallConvSummary): the bit is cleared before following the chain, as Apple's
 * backtracers do.  No user-space address has it set, so clearing it is harmless elsewhere. */
const SWIFT_ASYNC_FRAME_MASK = ptr('0xefffffffffffffff');

/* Return address + the frame-pointer chain above it; every read guarded, PAC stripped on
 * arm64e.  low: the stack pointer at the hook, when known: frames must lie above it (within
 * 64 MiB), which stops a walk that wandered off the stack.  (A frame of a function hooked
 * with a call listener would show Interceptor's trampoline: hooks above C-hooked entries are
 * therefore probes.) */
export function walkFrames(ret, fp, max, low) {
  const frames = [ret.strip().toString()];
  const ps = Process.pointerSize;
  const high = low ? low.add(64 * 1024 * 1024) : null;
  let f = fp.and(SWIFT_ASYNC_FRAME_MASK);
  try {
    while (frames.length < max && !f.isNull() && f.and(ps - 1).isNull()) {
      if (low && (f.compare(low) < 0 || f.compare(high) >= 0))
        break;
      const next = f.readPointer().and(SWIFT_ASYNC_FRAME_MASK);
      const r = f.add(ps).readPointer().strip();
      if (r.isNull())
        break;
      frames.push(r.toString());
      if (next.compare(f) <= 0)
        break;
      f = next;
    }
  } catch (e) {
    // an unreadable frame ends the stack; what was read is still evidence
  }
  return frames;
}

/* The caller chain at a hooked function's entry, walked by us: Frida's accurate backtracer
 * is libunwind on Linux, which opens a pipe of its own in every thread it unwinds (and the fd
 * tracer would then find descriptors nobody opened). */
export function entryFrames(ctx, max) {
  if (Process.arch === 'x64')
    return walkFrames(ctx.rsp.readPointer(), ctx.rbp, max, ctx.sp);   // [rsp]: the return address
  if (Process.arch === 'arm64')
    return walkFrames(ctx.lr, ctx.fp, max, ctx.sp);
  return Thread.backtrace(ctx, Backtracer.FUZZY).slice(0, max).map(p => p.toString());
}
