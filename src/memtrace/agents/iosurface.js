/*
 * IOSurface tracer: what the target allocates outside every malloc zone (kernel IOKit memory,
 * VM tag 88).  Low frequency: plain JS listeners.  Surfaces are known by their IOSurface ID,
 * whichever path made them, and each is recorded once, from the OUTERMOST entry that made it.
 *
 *   IOSurfaceCreate            onLeave: the surface read through its accessor functions
 *                              (alloc size, width, height, bytes per row, pixel format, id),
 *                              never by parsing the properties dictionary; creating stack.
 *   IOSurfaceClientCreateChild IOSurfaceCreate builds its client with CreateChild(NULL, props):
 *                              nested inside IOSurfaceCreate on the same thread it records
 *                              nothing (the outer entry does, with geometry).  Reached directly
 *                              (a framework path without IOSurfaceCreate) it records the surface,
 *                              read through the client accessors (IOSurfaceClientGetID,
 *                              GetAllocSize, GetWidth/Height/BytesPerRow/PixelFormat); a child
 *                              only when the parent is non-NULL (its parent's ID is kept).
 *   IOSurfaceClientLookup / IOSurfaceClientRetain   one more reference to a surface's client.
 *   IOSurfaceClientRelease     one reference less; the release is recorded only when the count
 *                              memtrace kept for that surface reaches zero (the client is destroyed
 *                              on its last reference only).  A surface created before the window
 *                              has an unknown count: its reference drops are counted apart.
 *   IOSurfaceIncrement/DecrementUseCount   counted per surface (use count is not ownership).
 * CFRelease itself is far too hot to hook.
 * DEVICE-UNVERIFIED: the client functions are IOSurface.framework's private exports (in its symbol
 * lists, not its headers); their signatures are the stand-in's (demo/darwin/mtdarwin.c), which
 * nests and counts references as issue 23's review of the device's framework found.  Where one
 * is missing, recon says so: without the release hook a surface not seen released is "still
 * referenced as far as we saw".
 */

import { emitJson } from './runtime/flush.js';
import { applyListeners, attachListener, detachListeners } from './runtime/listeners.js';
import { IS_DARWIN, findExport } from './runtime/platform.js';
import { entryFrames } from './runtime/stacks.js';

const ACCESSORS = {
  IOSurfaceGetAllocSize: 'size_t', IOSurfaceGetWidth: 'size_t', IOSurfaceGetHeight: 'size_t',
  IOSurfaceGetBytesPerRow: 'size_t', IOSurfaceGetPixelFormat: 'uint32', IOSurfaceGetID: 'uint32',
};
const CLIENT_ACCESSORS = {
  IOSurfaceClientGetID: 'uint32', IOSurfaceClientGetAllocSize: 'size_t', IOSurfaceClientGetWidth: 'size_t',
  IOSurfaceClientGetHeight: 'size_t', IOSurfaceClientGetBytesPerRow: 'size_t', IOSurfaceClientGetPixelFormat: 'uint32',
};
const CHILD_CREATE = 'IOSurfaceClientCreateChild';
const LOOKUP = 'IOSurfaceClientLookup';
const RETAIN = 'IOSurfaceClientRetain';
const RELEASE = 'IOSurfaceClientRelease';
const STANDIN_NAME = 'mtdarwin_surface_name';
const SURFACE_FRAMES = 16;

const surf = {
  fns: {},
  listeners: [],
  live: new Map(),      // surface pointer (string) -> id, for use counts
  seen: new Set(),      // ids recorded (a surface is recorded once, whichever entries it went through)
  refs: new Map(),      // id -> client references held, for surfaces recorded in the window
  creating: new Map(),  // thread id -> IOSurfaceCreate calls in progress on it
};

function addRef(id) {
  if (id !== null && surf.refs.has(id))
    surf.refs.set(id, surf.refs.get(id) + 1);
}

function fourcc(v) {
  let s = '';
  for (const shift of [24, 16, 8, 0]) {
    const c = (v >>> shift) & 0xff;
    if (c < 0x20 || c > 0x7e)
      return '0x' + (v >>> 0).toString(16);
    s += String.fromCharCode(c);
  }
  return s;
}

function call(name, p) {
  const f = surf.fns[name];
  if (f === undefined)
    return null;
  try {
    return Number(f(p));
  } catch (e) {
    return null;
  }
}

function hook(name, callbacks) {
  attachListener(name, findExport(name), callbacks, surf.listeners);
}

function useCountHook(op) {
  // Probe (no return trap): only the argument matters.
  return function (args) {
    const key = args[0].toString();
    if (surf.live.has(key))
      emitJson({ type: 'use', op, id: surf.live.get(key), surface: key });
  };
}

/* The caller chain at the hooked entry, by the shared guarded frame-pointer walk (Apple's arm64 ABI
 * keeps frame pointers; the unwinder's view of an entry patched by Interceptor is less reliable). */
function frames(ctx) {
  return entryFrames(ctx, SURFACE_FRAMES);
}

export const tracer = {
  name: 'iosurface',

  symbols(config) {
    const wanted = [{ name: 'IOSurfaceCreate', role: 'hook' }];
    for (const n of Object.keys(ACCESSORS))
      wanted.push({ name: n, role: 'accessor' });
    wanted.push({ name: 'IOSurfaceIncrementUseCount', role: 'hook' });
    wanted.push({ name: 'IOSurfaceDecrementUseCount', role: 'hook' });
    wanted.push({ name: CHILD_CREATE, role: 'hook' });
    wanted.push({ name: LOOKUP, role: 'hook' });
    wanted.push({ name: RETAIN, role: 'hook' });
    wanted.push({ name: RELEASE, role: 'release' });
    for (const n of Object.keys(CLIENT_ACCESSORS))
      wanted.push({ name: n, role: 'accessor' });
    if (!IS_DARWIN)
      wanted.push({ name: STANDIN_NAME, role: 'accessor' });    // the stand-in's name accessor
    return wanted;
  },

  init(config, sources) {
    for (const [name, ret] of Object.entries(Object.assign({}, ACCESSORS, CLIENT_ACCESSORS))) {
      const p = findExport(name);
      if (p !== null)
        surf.fns[name] = new NativeFunction(p, ret, ['pointer']);
    }
    const n = IS_DARWIN ? null : findExport(STANDIN_NAME);
    if (n !== null)
      surf.fns.name = new NativeFunction(n, 'pointer', ['pointer']);
    const release = findExport(RELEASE) !== null && surf.fns.IOSurfaceClientGetID !== undefined;
    return { release_hook: release ? RELEASE : null, child_hook: findExport(CHILD_CREATE) !== null ? CHILD_CREATE : null,
      accessors: Object.keys(surf.fns) };
  },

  install(config) {
    hook('IOSurfaceCreate', {
      onEnter(args) {
        this.frames = frames(this.context);
        surf.creating.set(this.threadId, (surf.creating.get(this.threadId) || 0) + 1);
      },
      onLeave(retval) {
        const depth = surf.creating.get(this.threadId) - 1;
        if (depth > 0)
          surf.creating.set(this.threadId, depth);
        else
          surf.creating.delete(this.threadId);
        if (retval.isNull()) {
          emitJson({ type: 'create-failed', via: 'IOSurfaceCreate', tid: this.threadId, frames: this.frames });
          return;
        }
        const id = call('IOSurfaceGetID', retval);
        surf.live.set(retval.toString(), id);
        if (id !== null && surf.seen.has(id))
          return;        // recorded already (an IOSurfaceCreate nested in another)
        if (id !== null) {
          surf.seen.add(id);
          surf.refs.set(id, 1);    // the surface object's reference to its client
        }
        const format = call('IOSurfaceGetPixelFormat', retval);
        let name = null;
        if (surf.fns.name) {
          try {
            const s = surf.fns.name(retval);
            name = s.isNull() ? null : s.readUtf8String();
          } catch (e) {
            name = null;
          }
        }
        emitJson({
          type: 'surface', via: 'IOSurfaceCreate', surface: retval.toString(), id, parent_id: null,
          alloc_size: call('IOSurfaceGetAllocSize', retval),
          width: call('IOSurfaceGetWidth', retval), height: call('IOSurfaceGetHeight', retval),
          bytes_per_row: call('IOSurfaceGetBytesPerRow', retval),
          pixel_format: format, format: format === null ? null : fourcc(format), name,
          tid: this.threadId, frames: this.frames,
        });
      },
    });
    hook(CHILD_CREATE, {
      onEnter(args) {
        this.parent = args[0];
        // Inside IOSurfaceCreate (which builds its client with CreateChild(NULL, ...)): the outer
        // entry records it, with the surface's geometry.
        this.nested = this.parent.isNull() && surf.creating.has(this.threadId);
        if (!this.nested)
          this.frames = frames(this.context);
      },
      onLeave(retval) {
        if (this.nested)
          return;
        if (retval.isNull()) {
          emitJson({ type: 'create-failed', via: CHILD_CREATE, tid: this.threadId, frames: this.frames });
          return;
        }
        const id = call('IOSurfaceClientGetID', retval);
        if (id !== null) {
          if (surf.seen.has(id))
            return;
          surf.seen.add(id);
          surf.refs.set(id, 1);
        }
        const format = call('IOSurfaceClientGetPixelFormat', retval);
        emitJson({
          type: 'surface', via: CHILD_CREATE, surface: null, client: retval.toString(), id,
          parent_id: this.parent.isNull() ? null : call('IOSurfaceClientGetID', this.parent),
          alloc_size: call('IOSurfaceClientGetAllocSize', retval),
          width: call('IOSurfaceClientGetWidth', retval), height: call('IOSurfaceClientGetHeight', retval),
          bytes_per_row: call('IOSurfaceClientGetBytesPerRow', retval),
          pixel_format: format, format: format === null ? null : fourcc(format), name: null,
          tid: this.threadId, frames: this.frames,
        });
      },
    });
    hook('IOSurfaceIncrementUseCount', useCountHook('inc'));
    hook('IOSurfaceDecrementUseCount', useCountHook('dec'));
    if (surf.fns.IOSurfaceClientGetID !== undefined) {
      hook(LOOKUP, {
        onLeave(retval) {
          if (!retval.isNull())
            addRef(call('IOSurfaceClientGetID', retval));
        },
      });
      // Probes (no return trap): the id is read before the client can go.
      hook(RETAIN, function (args) {
        addRef(call('IOSurfaceClientGetID', args[0]));
      });
      hook(RELEASE, function (args) {
        const id = call('IOSurfaceClientGetID', args[0]);
        if (id === null || !surf.refs.has(id)) {
          // Created before the window: how many references it has is unknown.
          emitJson({ type: 'release-unknown', via: RELEASE, id, tid: this.threadId });
          return;
        }
        const left = surf.refs.get(id) - 1;
        if (left > 0) {
          surf.refs.set(id, left);
          return;
        }
        surf.refs.delete(id);
        emitJson({ type: 'release', via: RELEASE, id, tid: this.threadId, frames: entryFrames(this.context, 4) });
      });
    }
    applyListeners('iosurface hooks in');
  },

  uninstall() {
    detachListeners(surf.listeners);
  },
};
