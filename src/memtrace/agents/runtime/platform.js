/*
 * Where the agent runs and how it finds the target's functions.
 */

export const NATIVE_PLATFORM = Process.platform;   // 'linux' | 'darwin' | ...
export const IS_DARWIN = NATIVE_PLATFORM === 'darwin';
const T0 = Date.now();

/* Milliseconds since the agent loaded: the `t` of every message. */
export function now() {
  return Date.now() - T0;
}

export function findExport(name, moduleName) {
  if (moduleName) {
    const m = Process.findModuleByName(moduleName);
    return m === null ? null : m.findExportByName(name);
  }
  return Module.findGlobalExportByName(name);
}

let libc;   // undefined until first asked for

/* The C library (Linux): its own exports, never a same-named one from another module
 * (the agent's allocator among them).  null on Darwin, where names are two-level anyway,
 * so libcExport there is the global export. */
export function libcModule() {
  if (IS_DARWIN)
    return null;
  if (libc === undefined)
    libc = Process.enumerateModules().find(m => /^libc[.-]/.test(m.name) || m.name === 'libc.so') || null;
  return libc;
}

export function libcExport(name) {
  const m = libcModule();
  const p = m === null ? null : m.findExportByName(name);
  return p !== null ? p : findExport(name);
}

export function libcFunction(name, ret, args) {
  const p = findExport(name);
  return p === null ? null : new NativeFunction(p, ret, args);
}

export function moduleOf(address) {
  const m = Process.findModuleByAddress(address);
  return m === null ? null : m.name;
}
