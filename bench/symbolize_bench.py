"""How fast the symbolization service resolves 10,000 unique addresses in a large binary.

    .venv/bin/python bench/symbolize_bench.py [--addresses 10000] [--generated N] [--pyelftools-dwarf]

Target: this machine's libc with its separate debug file (/usr/lib/debug/.build-id, Debian's
libc6-dbg) -- a 2 MB library with 4 MB of DWARF; or, with ``--generated N`` (or when libc's debug
file is absent), a C++ program of N template functions generated and built here with -g -O2.
Addresses are drawn (seeded) inside the binary's functions, each once.  In this one run it times:

1. the service (``memtrace.symbols.Symbolizer``) from cold: finding the debug file by build-id,
   building its SymCache, and resolving every address (function, file:line, inlined calls);
2. the previous pyelftools path (``memtrace/symbolize.py`` before the service, kept below as the
   baseline): function names only, from the module's own .symtab/.dynsym;
3. the same baseline pointed at the debug file (the full .symtab; still no lines);
4. with ``--pyelftools-dwarf``: pyelftools decoding every line table and DIE of the debug file,
   the least a pyelftools-based file:line + inlined-frame lookup would have to do.

and prints addresses/s and the ratio of each to the service.
"""

from __future__ import annotations

import argparse
import bisect
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from elftools.common.exceptions import ELFError  # noqa: E402
from elftools.elf.elffile import ELFFile  # noqa: E402
from elftools.elf.sections import SymbolTableSection  # noqa: E402

from memtrace.analyze.symbols import ModuleMap  # noqa: E402
from memtrace.symbols import Symbolizer  # noqa: E402

BASE = 0x7F0000000000


# ---- the baseline: the pyelftools symbolizer this service replaced (names only) -------------------


class BaselineElfSymbols:
    def __init__(self, path: str) -> None:
        self.starts: list[int] = []
        self.entries: list[tuple[int, int, str]] = []
        self.load_bias = 0
        try:
            with open(path, "rb") as f:
                elf = ELFFile(f)
                loads = [s["p_vaddr"] & ~0xFFF for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
                self.load_bias = min(loads) if loads else 0
                seen: dict[int, tuple[int, int, str]] = {}
                for section in elf.iter_sections():
                    if not isinstance(section, SymbolTableSection):
                        continue
                    for sym in section.iter_symbols():
                        if sym["st_info"]["type"] not in ("STT_FUNC", "STT_GNU_IFUNC") or not sym.name:
                            continue
                        value = sym["st_value"]
                        if value == 0:
                            continue
                        old = seen.get(value)
                        if old is None or (sym["st_info"]["bind"] == "STB_GLOBAL" and old[2].startswith("_")):
                            seen[value] = (value, max(sym["st_size"], 1), sym.name)
                for value in sorted(seen):
                    self.starts.append(value)
                    self.entries.append(seen[value])
        except (OSError, ELFError, ValueError):
            pass

    def lookup(self, vaddr: int) -> str | None:
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i < 0:
            return None
        start, size, name = self.entries[i]
        return name if vaddr < start + size else None


def baseline(path: str, addresses: list[int]) -> tuple[float, int]:
    t = time.perf_counter()
    elf = BaselineElfSymbols(path)
    named = sum(elf.lookup(a - BASE - 1 + elf.load_bias) is not None for a in addresses)
    return time.perf_counter() - t, named


# ---- targets -------------------------------------------------------------------------------------


def functions(binary: Path) -> list[tuple[int, int]]:
    out = subprocess.run(["nm", "-S", "--defined-only", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    return [(int(p[0], 16), int(p[1], 16)) for p in (ln.split() for ln in out.splitlines())
            if len(p) == 4 and p[2] in "tTwWi" and int(p[1], 16) > 1]


def libc_target() -> tuple[str, Path] | None:
    maps = Path("/proc/self/maps").read_text()
    m = re.search(r"\s(/\S*/libc\.so\.6)\n", maps)
    if m is None:
        return None
    notes = subprocess.run(["readelf", "-n", m.group(1)], capture_output=True, text=True).stdout
    bid = re.search(r"Build ID: ([0-9a-f]+)", notes)
    debug = Path("/usr/lib/debug/.build-id") / bid.group(1)[:2] / f"{bid.group(1)[2:]}.debug" if bid else None
    return (m.group(1), debug) if debug and debug.is_file() else None


def generated_target(n: int, where: Path) -> tuple[str, Path]:
    src = where / "big.cpp"
    parts = ["#include <cstdio>\n#include <vector>\n#include <string>\n",
             "template <int N, typename T> struct Worker {\n"
             "  static inline __attribute__((always_inline)) T step(T x) { return x * N + T(1); }\n"
             "  __attribute__((noinline)) static T run(std::vector<T> &v) {\n"
             "    T acc{}; for (auto &x : v) { acc += step(x); x = acc; }\n"
             "    std::printf(\"%d\\n\", N); return acc; }\n};\n"]
    parts.append("int main() { std::vector<double> v(3, 1.0); std::vector<long> w(3, 2); double s = 0;\n")
    parts += [f"  s += Worker<{i}, double>::run(v) + Worker<{i}, long>::run(w);\n" for i in range(n)]
    parts.append("  return s > 0 ? 0 : 1; }\n")
    src.write_text("".join(parts))
    exe = where / "big"
    subprocess.run(["g++", "-g", "-O2", "-o", str(exe), str(src)], check=True)
    return str(exe), exe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--addresses", type=int, default=10000)
    ap.add_argument("--generated", type=int, default=0, metavar="N",
                    help="use a generated C++ program of 2N functions instead of libc")
    ap.add_argument("--pyelftools-dwarf", action="store_true",
                    help="also time pyelftools decoding every line table and DIE (slow)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        target = None if args.generated else libc_target()
        if target is None:
            if not args.generated:
                print("libc's debug file is not installed (libc6-dbg): using a generated C++ program")
            print(f"building a generated C++ program ({2 * (args.generated or 2500)} functions) ...")
            target = generated_target(args.generated or 2500, Path(tmp))
        path, debug = target
        funcs = functions(debug)
        rng = random.Random(11)
        picked: set[int] = set()
        while len(picked) < args.addresses:
            start, size = rng.choice(funcs)
            picked.add(BASE + start + rng.randrange(1, size) + 1)   # +1: read as a return address
        addresses = sorted(picked)
        size_mb = Path(path).stat().st_size / 1e6
        debug_mb = debug.stat().st_size / 1e6
        print(f"target: {path} ({size_mb:.1f} MB) symbols: {debug} ({debug_mb:.1f} MB), "
              f"{len(funcs):,} functions, {len(addresses):,} unique addresses")

        modules = ModuleMap()
        modules.add([{"name": Path(path).name, "path": path, "base": hex(BASE), "size": 1 << 30}])
        t = time.perf_counter()
        sym = Symbolizer(modules)
        rows = sym.symbolize(addresses)
        service_s = time.perf_counter() - t
        named = sum(r[3] is not None for r in rows)
        lines = sum(r[5] is not None for r in rows)
        inlined = sum(len(r) > 6 for r in rows)
        t = time.perf_counter()
        sym.symbolize(addresses)
        again_s = time.perf_counter() - t
        (image,) = sym.usage()

        base_s, base_named = baseline(path, addresses)
        full_s, full_named = baseline(str(debug), addresses)

        rate = len(addresses) / service_s
        print(f"\n{'path':<46} {'time':>9} {'addresses/s':>12} {'named':>7} {'file:line':>9} {'inlined':>7}  vs service")
        print(f"{'service (symbolic), cold, ' + image['how']:<46} {service_s:>8.3f}s {rate:>12,.0f} "
              f"{named:>7,} {lines:>9,} {inlined:>7,}  1.00x")
        print(f"{'  of which loading the symbol file':<46} {sym.load_seconds:>8.3f}s")
        print(f"{'service, same addresses again (cached)':<46} {again_s:>8.3f}s "
              f"{len(addresses) / max(again_s, 1e-9):>12,.0f}")
        print(f"{'baseline: pyelftools, module file (old path)':<46} {base_s:>8.3f}s "
              f"{len(addresses) / base_s:>12,.0f} {base_named:>7,} {0:>9} {0:>7}  {base_s / service_s:.2f}x")
        print(f"{'baseline: pyelftools, debug file .symtab':<46} {full_s:>8.3f}s "
              f"{len(addresses) / full_s:>12,.0f} {full_named:>7,} {0:>9} {0:>7}  {full_s / service_s:.2f}x")
        if args.pyelftools_dwarf:
            t = time.perf_counter()
            entries = dies = 0
            with open(debug, "rb") as f:
                dwarf = ELFFile(f).get_dwarf_info()
                for cu in dwarf.iter_CUs():
                    prog = dwarf.line_program_for_CU(cu)
                    entries += len(prog.get_entries()) if prog is not None else 0
                    dies += sum(1 for _ in cu.iter_DIEs())
            dwarf_s = time.perf_counter() - t
            print(f"{'pyelftools: decode line tables + DIEs only':<46} {dwarf_s:>8.3f}s "
                  f"{'':>12} ({entries:,} line rows, {dies:,} DIEs)  {dwarf_s / service_s:.2f}x")


if __name__ == "__main__":
    main()
