"""Mach-O and dSYM symbolization, with binaries built here by clang + ld64.lld + dsymutil.

An iOS capture's modules live on the device: only their names, load addresses and (when known)
UUIDs reach the host.  These tests give the service a module path that does not exist here and a
--symbols folder holding what a team has on its Mac: the ``.app`` bundle and its ``.dSYM``.
Oracles: return addresses from llvm-objdump's disassembly (the instruction after the call), UUIDs
from llvm-dwarfdump, lines from the ``@name`` tags in the sources.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from memtrace.analyze.symbols import ModuleMap
from memtrace.capture import CaptureWriter, RecordType, StackRecord, encode_agent_records, read_records
from memtrace.symbols import Symbolizer

from ..conftest import PROGRAMS, run_memtrace  # noqa: TID252
from .test_symbols import NO_SYSTEM_DIRS, marker_line

LIB_SRC = PROGRAMS / "symbols_macho.c"
APP_SRC = PROGRAMS / "symbols_app.c"
DEVICE_APP = "/private/var/containers/Bundle/Application/0C5A/Demo.app/Demo"
BASE = 0x104A30000                     # where "the device" loaded the module


def tool(name: str) -> str | None:
    found = shutil.which(name) or shutil.which(f"{name}-14")
    if found is None:
        hits = sorted(glob.glob(f"/usr/lib/llvm-*/bin/{name}"))
        found = hits[-1] if hits else None
    return found


TOOLS = {n: tool(n) for n in ("clang", "ld64.lld", "dsymutil", "llvm-objdump", "llvm-nm", "llvm-dwarfdump",
                                  "llvm-lipo")}


def run(*args: str | Path, env: dict[str, str] | None = None) -> str:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=True, env=env).stdout


def return_address(binary: Path, function: str, callee: str, arch: str = "arm64") -> int:
    """The address right after ``function``'s call to ``callee``, from the disassembly."""
    text = run(TOOLS["llvm-objdump"], "-d", "--macho", f"--arch={arch}", binary)
    body = text.split(f"\n_{function}:\n", 1)[1]
    lines = [ln for ln in body.splitlines() if re.match(r"\s*[0-9a-f]+:", ln)]
    (i,) = [k for k, ln in enumerate(lines) if re.search(rf"\b(bl|callq?)\s+_{callee}\b", ln)]
    return int(lines[i + 1].split(":")[0], 16)


def symbol_vaddr(binary: Path, function: str) -> int:
    (addr,) = [int(p[0], 16) for p in (ln.split() for ln in run(TOOLS["llvm-nm"], binary).splitlines())
               if len(p) == 3 and p[2] == f"_{function}"]
    return addr


def text_vmaddr(binary: Path, arch: str = "arm64") -> int:
    text = run(TOOLS["llvm-objdump"], "--macho", "--private-headers", f"--arch={arch}", binary)
    return int(re.search(r"segname __TEXT\s+vmaddr (0x[0-9a-f]+)", text).group(1), 16)  # type: ignore[union-attr]


def uuid_of(path: Path, arch: str = "arm64") -> str:
    text = run(TOOLS["llvm-dwarfdump"], "--uuid", path)
    return re.search(rf"UUID: ([0-9A-F-]+) \({arch}\)", text).group(1)  # type: ignore[union-attr]


@dataclass(frozen=True)
class Built:
    symbols: Path             # what the team keeps: Demo.app, Demo.app.dSYM, libmt.dylib(.dSYM)
    app: Path                 # symbols/Demo.app/Demo
    lib: Path                 # a local copy of the arm64 dylib (not in symbols/)
    fat_lib: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    missing = [n for n, p in TOOLS.items() if p is None]
    if missing:
        pytest.skip(f"Mach-O fixtures need {', '.join(missing)} (Debian: clang, lld, llvm; .ci/run installs them)")
    out = tmp_path_factory.mktemp("macho")
    link = [TOOLS["ld64.lld"], "-platform_version", "macos", "11.0", "11.0"]
    objs = {}
    for arch in ("arm64", "x86_64"):
        for src in (LIB_SRC, APP_SRC):
            o = out / f"{src.stem}.{arch}.o"
            run(TOOLS["clang"], "-target", f"{arch}-apple-macos11", "-g", "-O1", "-c", src, "-o", o)
            objs[(src, arch)] = o
    symbols = out / "symbols"
    (symbols / "Demo.app").mkdir(parents=True)
    app = symbols / "Demo.app" / "Demo"
    run(*link, "-arch", "arm64", "-execute", "-o", app, objs[(APP_SRC, "arm64")], objs[(LIB_SRC, "arm64")])
    run(TOOLS["dsymutil"], app, "-o", symbols / "Demo.app.dSYM")
    lib = out / "libmt.dylib"
    run(*link, "-arch", "arm64", "-dylib", "-o", lib, objs[(LIB_SRC, "arm64")])
    run(TOOLS["dsymutil"], lib, "-o", symbols / "libmt.dylib.dSYM")
    lib64 = out / "x86_64" / "libmt.dylib"
    lib64.parent.mkdir()
    run(*link, "-arch", "x86_64", "-dylib", "-o", lib64, objs[(LIB_SRC, "x86_64")])
    fat = out / "fat" / "libmt.dylib"
    fat.parent.mkdir()
    run(TOOLS["llvm-lipo"], "-create", lib, lib64, "-output", fat)
    # dsymutil merges the slices' dSYMs with `lipo`, which Debian ships as llvm-lipo.
    (out / "tools").mkdir()
    (out / "tools" / "lipo").symlink_to(TOOLS["llvm-lipo"])  # type: ignore[arg-type]
    run(TOOLS["dsymutil"], fat, "-o", out / "fat" / "libmt.dylib.dSYM",
        env={**os.environ, "PATH": f"{out / 'tools'}:{os.environ.get('PATH', '')}"})
    return Built(symbols, app, lib, fat)


def device_modules(name: str, path: str, base: int = BASE) -> ModuleMap:
    m = ModuleMap()
    m.add([{"name": name, "path": path, "base": hex(base), "size": 1 << 20}])
    return m


def at_runtime(binary: Path, vaddr: int, arch: str = "arm64", base: int = BASE) -> int:
    return base + vaddr - text_vmaddr(binary, arch)


def test_dsym_found_by_uuid_for_a_module_on_the_device(built: Built) -> None:
    ra = at_runtime(built.app, return_address(built.app, "app_work", "mt_caller"))
    uuid = uuid_of(built.app)
    sym = Symbolizer(device_modules("Demo", DEVICE_APP), [built.symbols], arch="arm64", ids={"Demo": (uuid,)},
                     system_dirs=NO_SYSTEM_DIRS)
    assert sym.row(ra) == [hex(ra), "Demo", ra - BASE, "app_work", str(APP_SRC), marker_line(APP_SRC, "app-call")]
    (image,) = sym.usage()
    assert image["how"] == "uuid"
    assert image["file"] == str(built.symbols / "Demo.app.dSYM" / "Contents" / "Resources" / "DWARF" / "Demo")
    assert image["id"].replace("-", "") == uuid.replace("-", "").lower()


def test_dsym_matched_by_name_when_the_capture_has_no_uuid(built: Built) -> None:
    ra = at_runtime(built.app, return_address(built.app, "app_work", "mt_caller"))
    sym = Symbolizer(device_modules("Demo", DEVICE_APP), [built.symbols], arch="arm64", system_dirs=NO_SYSTEM_DIRS)
    assert sym.row(ra)[3:] == ["app_work", str(APP_SRC), marker_line(APP_SRC, "app-call")]
    assert sym.usage()[0]["how"] == "name (unverified)"


def test_a_dsym_with_another_uuid_is_refused(built: Built) -> None:
    ra = at_runtime(built.app, return_address(built.app, "app_work", "mt_caller"))
    sym = Symbolizer(device_modules("Demo", DEVICE_APP), [built.symbols], arch="arm64",
                     ids={"Demo": ("0badc0de-0000-4000-8000-000000000000",)}, system_dirs=NO_SYSTEM_DIRS)
    assert sym.row(ra)[3:] == [None, None, None]
    (image,) = sym.usage()
    assert image["how"] == "none" and "no file named Demo" in image["note"]


def test_app_bundle_binary_alone_gives_names_without_lines(built: Built, tmp_path: Path) -> None:
    only_app = tmp_path / "Demo.app"
    shutil.copytree(built.symbols / "Demo.app", only_app)
    ra = at_runtime(built.app, return_address(built.app, "app_work", "mt_caller"))
    sym = Symbolizer(device_modules("Demo", DEVICE_APP), [tmp_path], arch="arm64", system_dirs=NO_SYSTEM_DIRS)
    assert sym.row(ra)[3:] == ["app_work", None, None]
    assert sym.usage()[0]["file"] == str(only_app / "Demo")


def test_inlined_frames_from_a_dsym(built: Built) -> None:
    sym = Symbolizer(device_modules("libmt.dylib", "/usr/lib/libmt.dylib"), [built.symbols], arch="arm64",
                     system_dirs=NO_SYSTEM_DIRS)
    call = at_runtime(built.lib, return_address(built.lib, "mt_caller", "mt_leaf"))
    assert sym.row(call)[3:] == ["mt_caller", str(LIB_SRC), marker_line(LIB_SRC, "caller-call")]
    # mt_leaf's first instruction is helper()'s code, inlined (a thread-start style "address + 1").
    leaf = at_runtime(built.lib, symbol_vaddr(built.lib, "mt_leaf")) + 1
    row = sym.row(leaf)
    assert row[3:6] == ["mt_leaf", str(LIB_SRC), marker_line(LIB_SRC, "leaf-inline")]
    assert row[6] == [["helper", str(LIB_SRC), marker_line(LIB_SRC, "helper-body")]]


def test_local_mach_o_finds_its_dsym_by_its_own_uuid(built: Built) -> None:
    call = at_runtime(built.lib, return_address(built.lib, "mt_caller", "mt_leaf"))
    sym = Symbolizer(device_modules("libmt.dylib", str(built.lib)), [built.symbols], arch="arm64",
                     system_dirs=NO_SYSTEM_DIRS)
    assert sym.row(call)[3:] == ["mt_caller", str(LIB_SRC), marker_line(LIB_SRC, "caller-call")]
    assert sym.usage()[0]["how"] == "uuid"


@pytest.mark.parametrize(("frida_arch", "arch"), [("arm64", "arm64"), ("x64", "x86_64")])
def test_fat_dsym_slice_chosen_by_the_device_architecture(built: Built, frida_arch: str, arch: str) -> None:
    fat_dir = built.fat_lib.parent
    call = at_runtime(built.fat_lib, return_address(built.fat_lib, "mt_caller", "mt_leaf", arch), arch)
    sym = Symbolizer(device_modules("libmt.dylib", "/usr/lib/libmt.dylib"), [fat_dir / "libmt.dylib.dSYM"],
                     arch=frida_arch, system_dirs=NO_SYSTEM_DIRS)
    assert sym.row(call)[3:] == ["mt_caller", str(LIB_SRC), marker_line(LIB_SRC, "caller-call")]
    image = sym.usage()[0]
    assert image["arch"] == arch and image["id"].replace("-", "") == uuid_of(
        fat_dir / "libmt.dylib.dSYM", arch).replace("-", "").lower()


def test_memtrace_symbolize_an_ios_capture_offline(built: Built, tmp_path: Path) -> None:
    """A capture as an iPhone session writes it (agent rows: names, no lines), symbolized on the
    Mac afterwards: the app's frames gain file:line from its dSYM; the system library's name,
    which only the device could give, is kept."""
    ra_app = at_runtime(built.app, return_address(built.app, "app_work", "mt_caller"))
    routine = at_runtime(built.app, symbol_vaddr(built.app, "app_work"))
    sys_base = 0x1A2B00000
    ra_sys = sys_base + 0x1234
    cap = tmp_path / "ios" / "capture.mtc"
    cap.parent.mkdir()
    with CaptureWriter(cap) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "Demo"}})
        w.write(RecordType.RECON, {"symbols": [], "device": {"type": "usb", "arch": "arm64", "platform": "darwin"}})
        w.write(RecordType.MODULES, {"modules": [
            {"name": "Demo", "path": DEVICE_APP, "base": hex(BASE), "size": 0x100000},
            {"name": "libsystem_malloc.dylib", "path": "/usr/lib/system/libsystem_malloc.dylib",
             "base": hex(sys_base), "size": 0x10000}]})
        w.write(RecordType.BATCH, {"t": 1}, encode_agent_records(3, [StackRecord(3, 0, (ra_sys, ra_app))]))
        w.write(RecordType.EVENTS, {"type": "events:json", "events": [{"type": "create", "routine": hex(routine)}]})
        w.write(RecordType.SYMBOLS, {"by": "agent", "rows": [
            [hex(ra_sys), "libsystem_malloc.dylib", 0x1234, "_malloc_zone_malloc", None, None],
            [hex(ra_app), "Demo", ra_app - BASE, "app_work", None, None]]})
        w.write(RecordType.END, {"ended": "target-exited"})
    doc = json.loads(run_memtrace("symbolize", cap.parent, "--symbols", built.symbols, "--json").stdout)
    rows = {r[0]: r for rec in read_records(cap) if rec.type == RecordType.SYMBOLS for r in rec.body["rows"]}
    assert rows == {
        hex(ra_sys): [hex(ra_sys), "libsystem_malloc.dylib", 0x1234, "_malloc_zone_malloc", None, None],
        hex(ra_app): [hex(ra_app), "Demo", ra_app - BASE, "app_work", str(APP_SRC), marker_line(APP_SRC, "app-call")],
        # A thread's start routine is resolved one byte in, as the session does.
        hex(routine + 1): [hex(routine + 1), "Demo", routine + 1 - BASE, "app_work", str(APP_SRC),
                           rows[hex(routine + 1)][5]],
    }
    assert (doc["addresses"], doc["named"], doc["with_lines"], doc["kept"], doc["unresolved"]) == (3, 3, 2, 1, 0)
    images = {i["module"]: i for i in doc["images"]}
    assert images["Demo"]["how"] == "name (unverified)"
    assert images["libsystem_malloc.dylib"]["how"] == "none"
    assert "not on this machine" in images["libsystem_malloc.dylib"]["note"]
