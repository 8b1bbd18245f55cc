"""Objective-C method names for stripped Mach-O binaries, read from the binary's own metadata.

An App Store build has no symbols for its own code, but the Objective-C runtime needs every class
and method to be described in the binary: ``__objc_classlist`` points at each class
(``class_t``), whose read-only part (``class_ro_t``) names it and lists its methods
(``method_list_t``: selector name, types, implementation); its metaclass lists the class methods;
``__objc_catlist`` does the same for categories.  ``LC_FUNCTION_STARTS`` (kept by strip) gives
every function's first instruction, so an address is named ``-[Class selector]`` /
``+[Class selector]`` exactly when the function containing it starts at a method's
implementation -- never the nearest method before an unrelated function.  Swift classes' runtime
names (``_TtC4Demo9ViewModel``) are demangled (``Demo.ViewModel``).

Read on the host from the binary pulled from the device (or the ``.app`` a team keeps), with the
standard library only: fat files, pointer-based and relative method lists (iOS 14+), classic
rebases and chained fixups (DYLD_CHAINED_PTR_64 / ARM64E rebases).  DEVICE-UNVERIFIED: tested
with binaries built here by clang + ld64.lld, not with an App Store download.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pydemumble

from memtrace.symbols.demangle import demangle

MH_MAGIC_64 = 0xFEEDFACF
FAT_MAGIC = 0xCAFEBABE
FAT_MAGIC_64 = 0xCAFEBABF
LC_SEGMENT_64 = 0x19
LC_UUID = 0x1B
LC_FUNCTION_STARTS = 0x26
LC_DYLD_CHAINED_FIXUPS = 0x80000034
MH_DSYM = 0xA                       # a dSYM's companion file: section headers without contents
CPU_TYPES = {"arm64": 0x0100000C, "arm64e": 0x0100000C, "x86_64": 0x01000007}
CPU_SUBTYPE_ARM64E = 2
RELATIVE_METHODS = 0x80000000       # method_list_t flag: entries are three int32 offsets
FAST_DATA_MASK = ~7                 # class_t.data's low bits are Swift flags


class MachOError(ValueError):
    """Not a 64-bit Mach-O file (or slice) memtrace can read."""


@dataclass(frozen=True, slots=True)
class Segment:
    name: str
    vmaddr: int
    vmsize: int
    fileoff: int
    filesize: int


@dataclass
class MachO:
    """One 64-bit slice: its segments, sections, UUID and function starts."""

    data: bytes
    base: int                                       # where the slice starts in the file
    arch: str
    segments: list[Segment] = field(default_factory=list)
    sections: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)   # -> (vmaddr, size)
    uuid: str | None = None
    function_starts: list[int] = field(default_factory=list)                     # vmaddrs, ascending
    chained: bool = False

    @property
    def text_vmaddr(self) -> int:
        return next((s.vmaddr for s in self.segments if s.name == "__TEXT"), 0)

    def offset_of(self, vmaddr: int) -> int | None:
        for s in self.segments:
            if s.vmaddr <= vmaddr < s.vmaddr + s.filesize:
                return self.base + s.fileoff + (vmaddr - s.vmaddr)
        return None

    def read(self, vmaddr: int, size: int) -> bytes | None:
        off = self.offset_of(vmaddr)
        if off is None or off + size > len(self.data):
            return None
        return self.data[off:off + size]

    def u32(self, vmaddr: int) -> int | None:
        b = self.read(vmaddr, 4)
        return None if b is None else int(struct.unpack("<I", b)[0])

    def s32(self, vmaddr: int) -> int | None:
        b = self.read(vmaddr, 4)
        return None if b is None else int(struct.unpack("<i", b)[0])

    def pointer(self, vmaddr: int) -> int:
        """The pointer stored at ``vmaddr`` as a vmaddr (0: none, or bound to another image)."""
        b = self.read(vmaddr, 8)
        if b is None:
            return 0
        v = int(struct.unpack("<Q", b)[0])
        if v == 0 or not self.chained:
            return v
        if self.arch == "arm64e":
            if v >> 63:                                 # authenticated: bind, or rebase by offset
                return 0 if (v >> 62) & 1 else self.text_vmaddr + (v & 0xFFFFFFFF)
            if (v >> 62) & 1:                           # bind
                return 0
            target = v & 0x7FFFFFFFFFF
        else:
            if v >> 63:                                 # bind
                return 0
            target = v & 0xFFFFFFFFF
        return target + self.text_vmaddr if target < self.text_vmaddr else target

    def cstring(self, vmaddr: int, limit: int = 4096) -> str | None:
        off = self.offset_of(vmaddr)
        if off is None:
            return None
        end = self.data.find(b"\0", off, off + limit)
        if end < 0:
            return None
        return self.data[off:end].decode("utf-8", "replace")


def _slices(data: bytes) -> Iterator[tuple[int, str]]:
    """(offset, arch) of every 64-bit slice of a thin or fat file."""
    (magic,) = struct.unpack_from(">I", data, 0)
    if magic in (FAT_MAGIC, FAT_MAGIC_64):
        (n,) = struct.unpack_from(">I", data, 4)
        wide = magic == FAT_MAGIC_64
        for i in range(n):
            if wide:
                cpu, sub, off, _size, _align, _res = struct.unpack_from(">iiQQII", data, 8 + i * 32)
            else:
                cpu, sub, off, _size, _align = struct.unpack_from(">iiIII", data, 8 + i * 20)
            yield off, _arch_name(cpu, sub)
        return
    (le_magic, cpu, sub) = struct.unpack_from("<Iii", data, 0)
    if le_magic != MH_MAGIC_64:
        raise MachOError("not a 64-bit Mach-O file")
    yield 0, _arch_name(cpu, sub)


def _arch_name(cpu: int, sub: int) -> str:
    if cpu & 0xFFFFFFFF == CPU_TYPES["arm64"]:
        return "arm64e" if sub & 0xFF == CPU_SUBTYPE_ARM64E else "arm64"
    if cpu & 0xFFFFFFFF == CPU_TYPES["x86_64"]:
        return "x86_64"
    return f"cpu{cpu & 0xFFFFFFFF:#x}"


def parse(data: bytes, arch: str | None = None) -> MachO:
    """The slice for ``arch`` (Frida's arm64 also takes an arm64e slice), else the first 64-bit one."""
    slices = list(_slices(data))
    want = {"x64": "x86_64"}.get(arch or "", arch)
    chosen = next((s for s in slices if s[1] == want), None)
    if chosen is None and want == "arm64":
        chosen = next((s for s in slices if s[1] == "arm64e"), None)
    base, found = chosen or slices[0]
    if struct.unpack_from("<I", data, base)[0] != MH_MAGIC_64:
        raise MachOError("not a 64-bit Mach-O slice")
    m = MachO(data, base, found)
    filetype, ncmds, sizeofcmds = struct.unpack_from("<III", data, base + 12)
    if filetype == MH_DSYM:
        raise MachOError("a dSYM holds no Objective-C metadata (only the binary does)")
    at, end = base + 32, base + 32 + sizeofcmds
    starts_cmd: tuple[int, int] | None = None
    for _ in range(ncmds):
        if at + 8 > end:
            break
        cmd, size = struct.unpack_from("<II", data, at)
        if size < 8:
            break
        if cmd == LC_SEGMENT_64:
            segname = data[at + 8:at + 24].split(b"\0", 1)[0].decode()
            vmaddr, vmsize, fileoff, filesize = struct.unpack_from("<QQQQ", data, at + 24)
            (nsects,) = struct.unpack_from("<I", data, at + 64)
            m.segments.append(Segment(segname, vmaddr, vmsize, fileoff, filesize))
            for k in range(nsects):
                s = at + 72 + k * 80
                sect = data[s:s + 16].split(b"\0", 1)[0].decode()
                seg = data[s + 16:s + 32].split(b"\0", 1)[0].decode()
                addr, sz = struct.unpack_from("<QQ", data, s + 32)
                m.sections[(seg, sect)] = (addr, sz)
        elif cmd == LC_UUID:
            u = data[at + 8:at + 24].hex().upper()
            m.uuid = f"{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:]}"
        elif cmd == LC_FUNCTION_STARTS:
            starts_cmd = struct.unpack_from("<II", data, at + 8)
        elif cmd == LC_DYLD_CHAINED_FIXUPS:
            m.chained = True
        at += size
    if starts_cmd is not None:
        m.function_starts = _function_starts(data, base + starts_cmd[0], starts_cmd[1], m.text_vmaddr)
    return m


def _function_starts(data: bytes, off: int, size: int, text: int) -> list[int]:
    """ULEB128 deltas, the first from __TEXT's start, ended by a zero."""
    out: list[int] = []
    addr, i, stop = text, off, off + size
    while i < stop:
        value = shift = 0
        while i < stop:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if value == 0:
            break
        addr += value
        out.append(addr)
    return out


def _section_pointers(m: MachO, segs: tuple[str, ...], name: str) -> list[int]:
    for seg in segs:
        if (seg, name) in m.sections:
            addr, size = m.sections[(seg, name)]
            return [p for p in (m.pointer(addr + k) for k in range(0, size - size % 8, 8)) if p]
    return []


_DATA_SEGS = ("__DATA_CONST", "__DATA", "__DATA_DIRTY", "__AUTH_CONST", "__AUTH")


def _methods(m: MachO, list_addr: int) -> Iterator[tuple[str, int]]:
    """(selector, implementation vmaddr) of one method_list_t."""
    if not list_addr:
        return
    head = m.read(list_addr, 8)
    if head is None:
        return
    flags_size, count = struct.unpack("<II", head)
    entsize = flags_size & 0xFFFC
    relative = bool(flags_size & RELATIVE_METHODS)
    if count > 100_000 or entsize < (12 if relative else 24):
        return
    for k in range(count):
        e = list_addr + 8 + k * entsize
        if relative:
            name_off, imp_off = m.s32(e), m.s32(e + 8)
            if name_off is None or imp_off is None:
                continue
            # In an image (not the shared cache) the name offset reaches a selector reference.
            sel = m.cstring(m.pointer(e + name_off))
            imp = e + 8 + imp_off
        else:
            sel, imp = m.cstring(m.pointer(e)), m.pointer(e + 16)
        if sel and imp:
            yield sel, imp


def _class_name(m: MachO, cls: int) -> str | None:
    ro = m.pointer(cls + 32) & FAST_DATA_MASK
    name = m.cstring(m.pointer(ro + 24)) if ro else None
    if name and name.startswith("_Tt"):
        # A Swift class's Objective-C runtime name (_TtC4Demo9ViewModel -> Demo.ViewModel).
        return str(pydemumble.demangle(name) or name)
    return demangle(name) if name else None


def _class_methods(m: MachO, cls: int) -> tuple[str | None, int, int]:
    """(name, instance method list, class method list) of one class_t."""
    ro = m.pointer(cls + 32) & FAST_DATA_MASK
    meta = m.pointer(cls)
    meta_ro = m.pointer(meta + 32) & FAST_DATA_MASK if meta else 0
    return (_class_name(m, cls), m.pointer(ro + 32) if ro else 0, m.pointer(meta_ro + 32) if meta_ro else 0)


def method_names(m: MachO) -> dict[int, str]:
    """Implementation vmaddr -> ``-[Class selector]`` / ``+[Class selector]``, classes and categories."""
    out: dict[int, str] = {}
    for cls in _section_pointers(m, _DATA_SEGS, "__objc_classlist"):
        name, inst, klass = _class_methods(m, cls)
        for sel, imp in _methods(m, inst):
            out.setdefault(imp, f"-[{name or '?'} {sel}]")
        for sel, imp in _methods(m, klass):
            out.setdefault(imp, f"+[{name or '?'} {sel}]")
    for cat in _section_pointers(m, _DATA_SEGS, "__objc_catlist"):
        cat_name = m.cstring(m.pointer(cat)) or "?"
        cls = m.pointer(cat + 8)
        owner = _class_name(m, cls) if cls else None
        shown = f"{owner}({cat_name})" if owner else f"?({cat_name})"
        for sel, imp in _methods(m, m.pointer(cat + 16)):
            out.setdefault(imp, f"-[{shown} {sel}]")
        for sel, imp in _methods(m, m.pointer(cat + 24)):
            out.setdefault(imp, f"+[{shown} {sel}]")
    return out


class ObjcNames:
    """Names for addresses (relative to the image's __TEXT) from one binary's ObjC metadata."""

    def __init__(self, path: str | Path, arch: str | None = None) -> None:
        self.macho = parse(Path(path).read_bytes(), arch)
        self.names = method_names(self.macho)
        self.starts = self.macho.function_starts

    def __len__(self) -> int:
        return len(self.names)

    def lookup(self, rel: int) -> tuple[str, int] | None:
        """(name, function start relative to __TEXT) of the method containing ``rel``, or None when
        the function containing it is not a method (or function starts are unknown)."""
        text = self.macho.text_vmaddr
        vmaddr = text + rel
        i = bisect.bisect_right(self.starts, vmaddr) - 1
        if i < 0:
            return None
        start = self.starts[i]
        name = self.names.get(start)
        return None if name is None else (name, start - text)
