"""The symbolization service on real ELF files: a C++ program built here with -g, stripped copies
with separate debug files, and the machine's libc with its distro debug file.

Oracles never come from the symbolizer under test: the program prints its own return addresses
and where main was loaded, the expected lines are the source lines tagged ``@name``, and libc's
expectations come from binutils (nm, addr2line) reading the debug file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from memtrace.analyze.symbols import ModuleMap, SymbolTable
from memtrace.frames import Frame
from memtrace.symbols import Symbolizer

from ..conftest import PROGRAMS  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ELF symbolization tests run on Linux")

SRC = PROGRAMS / "symbols_demo.cpp"
NO_SYSTEM_DIRS: list[Path] = []          # keep /usr/lib/debug out unless a test wants it


def marker_line(path: Path, tag: str) -> int:
    (n,) = [i for i, text in enumerate(path.read_text().splitlines(), 1) if f"@{tag}" in text]
    return n


def nm_address(binary: Path, name: str, *flags: str) -> int:
    out = subprocess.run(["nm", *flags, str(binary)], capture_output=True, text=True, check=True).stdout
    (addr,) = {int(p[0], 16) for p in (line.split() for line in out.splitlines())
               if len(p) >= 3 and p[-1].split("@")[0] == name}
    return addr


def build_id(binary: Path) -> str:
    out = subprocess.run(["readelf", "-n", str(binary)], capture_output=True, text=True, check=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", out).group(1)  # type: ignore[union-attr]


@dataclass(frozen=True)
class Demo:
    exe: Path
    base: int                 # where the first PT_LOAD page was mapped (vaddr 0 in a PIE)
    fill: int                 # return address in Pool<double>::fill
    twice: int                # return address in the inlined twice() inside outer()

    def modules(self, path: Path | None = None) -> ModuleMap:
        m = ModuleMap()
        m.add([{"name": self.exe.name, "path": str(path or self.exe), "base": hex(self.base), "size": 1 << 20}])
        return m


def build_demo(out: Path, *extra: str) -> Demo:
    exe = out / "symbols_demo"
    subprocess.run(["g++", "-g", "-O2", "-o", str(exe), str(SRC), *extra], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    printed = {k: int(v, 16) for k, v in (line.split() for line in run.splitlines())}
    return Demo(exe, printed["main"] - nm_address(exe, "main"), printed["fill"], printed["twice"])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    return build_demo(tmp_path_factory.mktemp("symdemo"))


@pytest.mark.smoke
def test_function_file_line_and_demangled_cpp_name(demo: Demo) -> None:
    sym = Symbolizer(demo.modules(), system_dirs=NO_SYSTEM_DIRS)
    row = sym.row(demo.fill)
    # Rows keep the name as the binary spells it (nm's), readers get it demangled.
    assert nm_address(demo.exe, "_ZN4PoolIdE4fillEid") < demo.fill - demo.base
    assert row == [hex(demo.fill), "symbols_demo", demo.fill - demo.base, "_ZN4PoolIdE4fillEid",
                   str(SRC), marker_line(SRC, "fill-call")]
    assert sym.row(demo.fill) is row                      # each address resolved once
    table = SymbolTable()
    table.add_rows([row])
    assert [f.label() for f in table.frames_of(demo.fill)] == [
        f"Pool<double>::fill(int, double) (symbols_demo) symbols_demo.cpp:{marker_line(SRC, 'fill-call')}"]
    (image,) = sym.usage()
    assert (image["how"], image["file"], image["addresses"], image["with_lines"]) == (
        "module file", str(demo.exe), 1, 1)


def test_inlined_always_inline_call_at_the_same_adjusted_address(demo: Demo) -> None:
    sym = Symbolizer(demo.modules(), system_dirs=NO_SYSTEM_DIRS)
    row = sym.row(demo.twice)
    # The containing function with the call site of the inlined call, then the inlined call itself.
    assert row[3:6] == ["_Z5outeri", str(SRC), marker_line(SRC, "outer-call")]
    assert row[6] == [["twice", str(SRC), marker_line(SRC, "twice-call")]]
    table = SymbolTable()
    table.add_rows([row])
    off = demo.twice - demo.base
    assert table.frames_of(demo.twice) == [
        Frame(demo.twice, "symbols_demo", off, "twice", str(SRC), marker_line(SRC, "twice-call"), inlined=True),
        Frame(demo.twice, "symbols_demo", off, "outer(int)", str(SRC), marker_line(SRC, "outer-call")),
    ]


def stripped_copy(demo: Demo, where: Path) -> tuple[Path, Path]:
    """``where/symbols_demo`` without symbols or DWARF, and its debug file (objcopy's way)."""
    where.mkdir(parents=True, exist_ok=True)
    debug = where / "symbols_demo.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(demo.exe), str(debug)], check=True)
    stripped = where / "symbols_demo"
    shutil.copy(demo.exe, stripped)
    subprocess.run(["strip", "--strip-all", str(stripped)], check=True)
    return stripped, debug


def test_stripped_binary_found_its_debug_file_by_build_id(demo: Demo, tmp_path: Path) -> None:
    stripped, debug = stripped_copy(demo, tmp_path / "bin")
    alone = Symbolizer(demo.modules(stripped), system_dirs=NO_SYSTEM_DIRS)
    assert alone.row(demo.fill)[3:] == [None, None, None]  # nothing in .dynsym for it
    (image,) = alone.usage()
    bid = build_id(demo.exe)
    assert image["how"] == "module file" and f"build-id {bid}" in image["note"]

    tree = tmp_path / "syms" / ".build-id" / bid[:2]
    tree.mkdir(parents=True)
    shutil.copy(debug, tree / f"{bid[2:]}.debug")
    sym = Symbolizer(demo.modules(stripped), symbol_dirs=[tmp_path / "syms"], system_dirs=NO_SYSTEM_DIRS)
    assert sym.row(demo.fill)[3:] == ["_ZN4PoolIdE4fillEid", str(SRC), marker_line(SRC, "fill-call")]
    assert sym.row(demo.twice)[6] == [["twice", str(SRC), marker_line(SRC, "twice-call")]]
    (image,) = sym.usage()
    assert (image["how"], image["file"]) == ("build-id", str(tree / f"{bid[2:]}.debug"))


def test_a_debug_file_of_another_build_is_refused(demo: Demo, tmp_path: Path) -> None:
    stripped, _ = stripped_copy(demo, tmp_path / "bin")
    other = build_demo(tmp_path, "-DOTHER_BUILD=1", "-Wl,--build-id=0x" + "ab" * 20)
    other_debug = tmp_path / "other.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(other.exe), str(other_debug)], check=True)
    bid = build_id(demo.exe)
    tree = tmp_path / "syms" / ".build-id" / bid[:2]
    tree.mkdir(parents=True)
    shutil.copy(other_debug, tree / f"{bid[2:]}.debug")   # right place, wrong build
    sym = Symbolizer(demo.modules(stripped), symbol_dirs=[tmp_path / "syms"], system_dirs=NO_SYSTEM_DIRS)
    assert sym.row(demo.fill)[3] is None
    assert sym.usage()[0]["how"] == "module file"


def test_stripped_binary_found_its_debug_file_by_gnu_debuglink(demo: Demo, tmp_path: Path) -> None:
    stripped, debug = stripped_copy(demo, tmp_path / "bin")
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(stripped)], check=True)
    (tmp_path / "bin" / ".debug").mkdir()
    good = tmp_path / "bin" / ".debug" / debug.name
    shutil.move(debug, good)
    # A file of the linked name next to the binary whose CRC does not match must be passed over.
    tampered = tmp_path / "bin" / debug.name
    tampered.write_bytes(good.read_bytes() + b"\0")
    sym = Symbolizer(demo.modules(stripped), system_dirs=NO_SYSTEM_DIRS)
    assert sym.row(demo.fill)[3:] == ["_ZN4PoolIdE4fillEid", str(SRC), marker_line(SRC, "fill-call")]
    (image,) = sym.usage()
    assert (image["how"], image["file"]) == ("debuglink", str(good))


# ---- libc and its distro debug file --------------------------------------------------------


def libc_mapping() -> tuple[str, int]:
    """This process's libc: its path and the start of its first mapping."""
    starts: dict[str, int] = {}
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and re.search(r"/libc(\.so\.6|-[\d.]+\.so)$", parts[5]):
            starts[parts[5]] = min(starts.get(parts[5], 1 << 64), int(parts[0].split("-")[0], 16))
    (path, base), = starts.items()
    return path, base


def where_is(debug: Path, vaddr: int) -> tuple[str | None, int]:
    """(file name, line) of the innermost frame at ``vaddr``: LLVM's symbolizer when installed;
    else binutils' addr2line, whose file is not trusted (it misnames files of DWARF 5 headers)."""
    if shutil.which("llvm-symbolizer"):
        out = subprocess.run(["llvm-symbolizer", f"--obj={debug}", hex(vaddr)], capture_output=True, text=True,
                             check=True).stdout.split()
        file, line = out[1].split(":")[:2]
        return Path(file).name, int(line)
    out = subprocess.run(["addr2line", "-e", str(debug), hex(vaddr)], capture_output=True, text=True,
                         check=True).stdout.strip()
    return None, int(out.rsplit(":", 1)[1].split()[0])


def test_libc_start_frames_named_from_its_debug_file() -> None:
    path, base = libc_mapping()
    bid = build_id(Path(path))
    debug = Path("/usr/lib/debug/.build-id") / bid[:2] / f"{bid[2:]}.debug"
    if not debug.is_file():
        pytest.skip(f"libc's debug file {debug} is not installed (Debian: libc6-dbg)")
    modules = ModuleMap()
    modules.add([{"name": "libc.so.6", "path": path, "base": hex(base), "size": 1 << 24}])
    call_main = nm_address(debug, "__libc_start_call_main")
    ra = base + call_main + 0x21
    want_file, want_line = where_is(debug, call_main + 0x20)
    sym = Symbolizer(modules)
    row = sym.row(ra)
    assert row[3] == "__libc_start_call_main"
    _, inner_file, inner_line = row[6][0] if len(row) > 6 else row[3:6]   # the oracles name the innermost
    assert inner_line == want_line
    if want_file is not None:
        assert Path(inner_file).name == want_file
    # The function a local alias (__libc_start_main_impl/_alias_N) names in the debug file is
    # reported by its exported name.
    start_main = nm_address(Path(path), "__libc_start_main", "-D")
    assert sym.row(base + start_main + 0x11)[3] == "__libc_start_main"
    image = next(i for i in sym.usage() if i["module"] == "libc.so.6")
    assert (image["how"], image["file"]) == ("build-id", str(debug))

    # Without the debug file the static function has no name, and the reason says what was missing.
    bare = Symbolizer(modules, system_dirs=NO_SYSTEM_DIRS)
    assert bare.row(ra)[3:] == [None, None, None]
    assert bare.row(base + start_main + 0x11)[3:] == ["__libc_start_main", None, None]
    assert f"no debug file (build-id {bid}" in bare.usage()[0]["note"]


@pytest.mark.parametrize("content", [b"", b"\x7fELF" + b"\x02\x01\x01" + b"\0" * 40, b"not a binary at all\n"])
def test_unreadable_module_files_leave_module_and_offset_and_say_why(demo: Demo, tmp_path: Path,
                                                                    content: bytes) -> None:
    broken = tmp_path / "symbols_demo"
    broken.write_bytes(content)
    sym = Symbolizer(demo.modules(broken), system_dirs=NO_SYSTEM_DIRS)
    assert sym.row(demo.fill) == [hex(demo.fill), "symbols_demo", demo.fill - demo.base, None, None, None]
    (image,) = sym.usage()
    assert image["how"] == "none" and str(broken) in image["note"]


def test_build_id_is_the_gnu_note_not_a_systemtap_note_of_the_same_type(tmp_path: Path) -> None:
    """SystemTap probe notes (libstdc++ carries them) use note type 3 too, under owner "stapsdt"."""
    from memtrace.symbols.binaries import elf_identity

    src = tmp_path / "probe.c"
    src.write_text('__asm__(".pushsection .note.stapsdt,\\"\\",@note\\n.balign 4\\n.4byte 8, 2f-1f, 3\\n'
                   '.asciz \\"stapsdt\\"\\n.balign 4\\n1: .8byte 0, 0, 0\\n.asciz \\"mt\\"\\n.asciz \\"probe\\"\\n'
                   '.asciz \\"\\"\\n2: .balign 4\\n.popsection\\n");\n'
                   "int main(void) { return 0; }\n")
    exe = tmp_path / "probe"
    subprocess.run(["gcc", "-Wl,--build-id", "-o", str(exe), str(src)], check=True)
    notes = subprocess.run(["readelf", "-n", str(exe)], capture_output=True, text=True, check=True).stdout
    assert "stapsdt" in notes
    ident = elf_identity(exe)
    assert ident is not None and ident.build_id == build_id(exe)
