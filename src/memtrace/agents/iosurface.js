/*
 * IOSurface tracer: what the target allocates outside every malloc zone (kernel IOKit memory,
 * VM tag 88).  Low frequency: plain JS listeners.
 *
 *   IOSurfaceCreate            onLeave: the surface read through its accessor functions
 *                              (alloc size, width, height, bytes per row, pixel format, id),
 *                              never by parsing the properties dictionary; creating stack.
 *   IOSurfaceIncrement/DecrementUseCount   counted per surface (use count is not ownership).
 *   release                    where a destruction function is visible (the Linux stand-in's
 *                              mtdarwin_surface_destroy).  iOS exports none and CFRelease is
 *                              far too hot to hook, so there a surface not seen destroyed is
 *                              "still referenced by the app as far as we saw".
 */

import { emitJson } from './runtime/flush.js';
import { attachListener, detachListeners } from './runtime/listeners.js';
import { IS_DARWIN, findExport } from './runtime/platform.js';
import { entryFrames } from './runtime/stacks.js';

const ACCESSORS = {
  IOSurfaceGetAllocSize: 'size_t', IOSurfaceGetWidth: 'size_t', IOSurfaceGetHeight: 'size_t',
  IOSurfaceGetBytesPerRow: 'size_t', IOSurfaceGetPixelFormat: 'uint32', IOSurfaceGetID: 'uint32',
};
const STANDIN_DESTROY = 'mtdarwin_surface_destroy';
const STANDIN_NAME = 'mtdarwin_surface_name';
const SURFACE_FRAMES = 16;

const surf = {
  fns: {},
  listeners: [],
  live: new Map(),      // surface pointer (string) -> id, for releases
};

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

export const tracer = {
  name: 'iosurface',

  symbols(config) {
    const wanted = [{ name: 'IOSurfaceCreate', role: 'hook' }];
    for (const n of Object.keys(ACCESSORS))
      wanted.push({ name: n, role: 'accessor' });
    wanted.push({ name: 'IOSurfaceIncrementUseCount', role: 'hook' });
    wanted.push({ name: 'IOSurfaceDecrementUseCount', role: 'hook' });
    if (!IS_DARWIN) {
      // The stand-in's destruction point and name accessor; iOS has no exported equivalent.
      wanted.push({ name: STANDIN_DESTROY, role: 'release' });
      wanted.push({ name: STANDIN_NAME, role: 'accessor' });
    }
    return wanted;
  },

  init(config, sources) {
    for (const [name, ret] of Object.entries(ACCESSORS)) {
      const p = findExport(name);
      if (p !== null)
        surf.fns[name] = new NativeFunction(p, ret, ['pointer']);
    }
    const n = IS_DARWIN ? null : findExport(STANDIN_NAME);
    if (n !== null)
      surf.fns.name = new NativeFunction(n, 'pointer', ['pointer']);
    return { release_hook: IS_DARWIN ? null : STANDIN_DESTROY, accessors: Object.keys(surf.fns) };
  },

  install(config) {
    hook('IOSurfaceCreate', {
      onEnter(args) {
        this.frames = entryFrames(this.context, SURFACE_FRAMES);
      },
      onLeave(retval) {
        if (retval.isNull()) {
          emitJson({ type: 'create-failed', tid: Process.getCurrentThreadId(), frames: this.frames });
          return;
        }
        const id = call('IOSurfaceGetID', retval);
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
        surf.live.set(retval.toString(), id);
        emitJson({
          type: 'surface', surface: retval.toString(), id,
          alloc_size: call('IOSurfaceGetAllocSize', retval),
          width: call('IOSurfaceGetWidth', retval), height: call('IOSurfaceGetHeight', retval),
          bytes_per_row: call('IOSurfaceGetBytesPerRow', retval),
          pixel_format: format, format: format === null ? null : fourcc(format), name,
          tid: Process.getCurrentThreadId(), frames: this.frames,
        });
      },
    });
    hook('IOSurfaceIncrementUseCount', useCountHook('inc'));
    hook('IOSurfaceDecrementUseCount', useCountHook('dec'));
    if (!IS_DARWIN) {
      hook(STANDIN_DESTROY, function (args) {
        const key = args[0].toString();
        const id = surf.live.has(key) ? surf.live.get(key) : call('IOSurfaceGetID', args[0]);
        surf.live.delete(key);
        emitJson({ type: 'release', surface: key, id, tid: Process.getCurrentThreadId(),
          frames: entryFrames(this.context, 4) });
      });
    }
    Interceptor.flush();
  },

  uninstall() {
    detachListeners(surf.listeners);
  },
};
