"""Objective-C methods named on a stripped Mach-O from its own metadata (symbols/objc.py).

The binary is built here (clang + ld64.lld, arm64 iOS) and stripped as an App Store build is;
the oracle is llvm-nm on the unstripped binary, whose symbol table clang wrote with the same
``-[Class selector]`` names.  The capture's module lives "on the device": only its name, load
address and UUID reach the host, and ``--symbols`` holds the binary pulled from the device.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from memtrace.frames import Frame
from memtrace.symbols import Symbolizer
from memtrace.symbols.objc import ObjcNames, parse

from ..conftest import PROGRAMS  # noqa: TID252
from .test_symbols import NO_SYSTEM_DIRS
from .test_symbols_macho import TOOLS, device_modules, run, text_vmaddr, uuid_of

SRC = PROGRAMS / "symbols_objc.m"
DEVICE_APP = "/private/var/containers/Bundle/Application/0C5A/Demo.app/Demo"
BASE = 0x104A30000
METHODS = ["+[MTRoot makeShared:]", "-[MTRoot decode:]", "-[MTImageCoder decodeFrame:]",
           "-[MTRoot(Caching) purgeCache:]"]


@dataclass(frozen=True)
class Built:
    full: Path              # with its symbol table (the oracle)
    symbols: Path           # a folder holding Demo.app/Demo, stripped


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    strip = shutil.which("llvm-strip") or next(iter(sorted(Path("/usr/lib").glob("llvm-*/bin/llvm-strip"))), None)
    missing = [n for n in ("clang", "ld64.lld", "llvm-nm", "llvm-objdump") if TOOLS[n] is None]
    if missing or strip is None:
        pytest.skip(f"Objective-C Mach-O fixtures need {', '.join(missing) or 'llvm-strip'} "
                    f"(Debian: clang, lld, llvm; .ci/run installs them)")
    out = tmp_path_factory.mktemp("objc")
    obj = out / "symbols_objc.o"
    run(TOOLS["clang"], "-target", "arm64-apple-ios15.0", "-O1", "-c", SRC, "-o", obj)
    full = out / "Demo"
    run(TOOLS["ld64.lld"], "-arch", "arm64", "-platform_version", "ios", "15.0", "15.0", "-execute",
        "-undefined", "dynamic_lookup", "-o", full, obj)
    symbols = out / "symbols"
    (symbols / "Demo.app").mkdir(parents=True)
    run(strip, full, "-o", symbols / "Demo.app" / "Demo")
    return Built(full, symbols)


def nm_addresses(binary: Path) -> dict[str, int]:
    out = {}
    for line in run(TOOLS["llvm-nm"], "--defined-only", binary).splitlines():
        addr, _kind, name = line.split(" ", 2)
        out[name] = int(addr, 16)
    return out


def test_the_stripped_binary_has_no_method_symbols(built: Built) -> None:
    stripped = nm_addresses(built.symbols / "Demo.app" / "Demo")
    assert not any(n.startswith(("-[", "+[")) for n in stripped)
    assert set(METHODS) <= set(nm_addresses(built.full))


def test_methods_read_from_the_metadata_match_the_symbol_table(built: Built) -> None:
    names = ObjcNames(built.symbols / "Demo.app" / "Demo", "arm64")
    nm = nm_addresses(built.full)
    assert names.names == {nm[m]: m for m in METHODS}
    assert names.macho.uuid == uuid_of(built.full)
    # Every method starts a function (LC_FUNCTION_STARTS survives strip).
    assert set(names.names) <= set(names.starts)


def test_frames_in_a_stripped_app_are_named_by_their_methods(built: Built) -> None:
    nm = nm_addresses(built.full)
    text = text_vmaddr(built.full)
    sym = Symbolizer(device_modules("Demo", DEVICE_APP, BASE), [built.symbols], arch="arm64",
                     ids={"Demo": (uuid_of(built.full),)}, system_dirs=NO_SYSTEM_DIRS)
    for method in METHODS:
        # A return address four bytes into the method (looked up one byte back).
        ra = BASE + nm[method] - text + 4
        assert sym.row(ra) == [hex(ra), "Demo", ra - BASE, method, None, None], method
    # A plain C function is never given a method's name (the nearest method before it).
    c_ra = BASE + nm["_plain_c_function"] - text + 4
    assert not str(sym.row(c_ra)[3]).startswith(("-[", "+["))
    (image,) = sym.usage()
    assert image["how"] == "uuid" and image["named"] >= len(METHODS)


def test_two_call_sites_in_one_method_without_lines_are_one_row(built: Built) -> None:
    """No line information: frames merge by function, not by raw offset."""
    a = Frame(address=BASE + 0x4004, function="-[MTRoot decode:]", module="Demo", offset=0x4004)
    b = Frame(address=BASE + 0x4006, function="-[MTRoot decode:]", module="Demo", offset=0x4006)
    unnamed = [Frame(address=BASE + o, function=None, module="Demo", offset=o) for o in (0x5000, 0x5004)]
    assert a.key() == b.key()
    assert unnamed[0].key() != unnamed[1].key()


def test_a_dsym_is_refused_as_a_metadata_source(built: Built, tmp_path: Path) -> None:
    data = bytearray(built.full.read_bytes())
    data[12:16] = (0xA).to_bytes(4, "little")            # MH_DSYM
    with pytest.raises(ValueError, match="dSYM"):
        parse(bytes(data))


def test_the_agent_reads_lc_uuid_from_an_image_in_memory(built: Built) -> None:
    """runtime/modules.js's machoUuid, run by Frida's JavaScript runtime over the binary's bytes
    copied into memory, gives the UUID llvm-dwarfdump reads from the file."""
    import frida

    from memtrace import agentbuild

    agents = Path(agentbuild.__file__).parent / "agents"
    files = {str(p.relative_to(agents)): p.read_bytes() for p in agents.rglob("*.js")}
    files["layout.js"] = agentbuild.js_layout_module().encode()
    files["uuid_probe.js"] = b"""
import { machoUuid } from './runtime/modules.js';
rpc.exports = {
  uuid(bytes) {
    const buf = Memory.alloc(bytes.length);
    buf.writeByteArray(bytes);
    return [machoUuid(buf), machoUuid(buf.add(8))];
  },
};
"""
    source = agentbuild._compile(files, "uuid_probe.js")
    session = frida.get_local_device().attach(0)
    try:
        script = session.create_script(source, name="memtrace-uuid-probe")
        script.load()
        head = list((built.symbols / "Demo.app" / "Demo").read_bytes()[:16384])
        assert script.exports_sync.uuid(head) == [uuid_of(built.full), None]
        script.unload()
    finally:
        session.detach()


# ---- hand-built image: what ld64.lld 14 does not emit (relative method lists, chained fixups) ----

TEXT = 0x100000000


def _uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def hand_built_image(path: Path) -> None:
    """A thin arm64 image as a current App Store build lays it out: chained-fixup pointers
    (DYLD_CHAINED_PTR_64_OFFSET: a target offset with a `next` field above it), relative method
    lists pointing at selector references, a Swift class's mangled runtime name with its data
    pointer's Swift bit set, and a plain function after the methods."""
    import struct

    img = bytearray(0x8000)

    def put(off: int, fmt: str, *v: int) -> None:
        struct.pack_into(fmt, img, off, *v)

    def ptr(at: int, target: int) -> None:            # chained rebase: offset, next = 1
        put(at, "<Q", target | (1 << 51))

    for off, s in ((0x2000, b"_TtC4Demo5Coder\0"), (0x2020, b"decode:\0"), (0x2030, b"shared\0"),
                   (0x2040, b"v16@0:8\0")):
        img[off:off + len(s)] = s
    ptr(0x4000, 0x4100)                                # __objc_classlist
    ptr(0x4010, 0x2020)                                # __objc_selrefs: decode:
    ptr(0x4018, 0x2030)                                # shared
    ptr(0x4100, 0x4140)                                # class_t.isa -> metaclass
    put(0x4120, "<Q", (0x4200 | 2) | (1 << 51))        # class_t.data (Swift stable bit set)
    ptr(0x4160, 0x4280)                                # metaclass data
    ptr(0x4218, 0x2000)                                # class_ro_t.name
    ptr(0x4220, 0x4300)                                # baseMethods
    put(0x4280, "<I", 1)                               # RO_META
    ptr(0x4298, 0x2000)
    ptr(0x42A0, 0x4340)
    for lst, selref, imp in ((0x4300, 0x4010, 0x1000), (0x4340, 0x4018, 0x1010)):
        put(lst, "<II", 0x8000000C, 1)                 # relative, entsize 12, one method
        e = lst + 8
        put(e, "<iii", selref - e, 0x2040 - (e + 4), imp - (e + 8))
    starts = _uleb(0x1000) + _uleb(0x10) + _uleb(0x10) + b"\0"
    img[0x6000:0x6000 + len(starts)] = starts
    # Load commands: __TEXT (__text), __DATA_CONST (__objc_classlist), __DATA (__objc_selrefs),
    # LC_UUID, LC_FUNCTION_STARTS, LC_DYLD_CHAINED_FIXUPS.
    cmds = bytearray()

    def segment(name: bytes, vm: int, size: int, sections: list[tuple[bytes, int, int]]) -> None:
        body = struct.pack("<II16sQQQQiiII", 0x19, 72 + 80 * len(sections), name, TEXT + vm, size, vm, size,
                           5, 5, len(sections), 0)
        for sect, addr, sz in sections:
            body += struct.pack("<16s16sQQIIIIIIII", sect, name, TEXT + addr, sz, addr, 3, 0, 0, 0, 0, 0, 0)
        cmds.extend(body)

    segment(b"__TEXT", 0, 0x4000, [(b"__text", 0x1000, 0x30)])
    segment(b"__DATA_CONST", 0x4000, 0x10, [(b"__objc_classlist", 0x4000, 8)])
    segment(b"__DATA", 0x4010, 0x3FF0, [(b"__objc_selrefs", 0x4010, 16)])
    cmds.extend(struct.pack("<II16s", 0x1B, 24, bytes(range(16))))
    cmds.extend(struct.pack("<IIII", 0x26, 16, 0x6000, len(starts)))
    cmds.extend(struct.pack("<IIII", 0x80000034, 16, 0x7000, 0))
    put(0, "<IiiIIIII", 0xFEEDFACF, 0x0100000C, 0, 2, 6, len(cmds), 0x200000, 0)
    img[32:32 + len(cmds)] = cmds
    path.write_bytes(bytes(img))


def test_relative_method_lists_and_chained_fixups(tmp_path: Path) -> None:
    image = tmp_path / "Coder"
    hand_built_image(image)
    names = ObjcNames(image, "arm64")
    assert names.macho.chained and names.macho.uuid == "00010203-0405-0607-0809-0A0B0C0D0E0F"
    assert names.names == {TEXT + 0x1000: "-[Demo.Coder decode:]", TEXT + 0x1010: "+[Demo.Coder shared]"}
    assert names.lookup(0x1004) == ("-[Demo.Coder decode:]", 0x1000)
    assert names.lookup(0x1013) == ("+[Demo.Coder shared]", 0x1010)
    assert names.lookup(0x1024) is None                 # the plain function after them
    assert names.lookup(0x0800) is None                 # before the first function
