"""Native, memtrace's default (every allocation stacked, every block tracked) and heaptrack, side by
side on four real programs built with their compilers' defaults (no frame pointers):

    python bench/bench_real.py [repeats] [--baseline SRC] [--no-heaptrack] [--only NAME,...]   # make bench-real

  python    CPython 3 (Debian's /usr/bin/python3) with PYTHONMALLOC=malloc: JSON, zlib, regexes
  sqlite3   Debian's sqlite3 building a 500,000-row table, three indexes and a grouped table
  cxx       a std::map / std::string / std::vector program, g++ -O2
  cc1plus   GCC's C++ compiler proper compiling a preprocessed file that uses the standard library

The cost figure is the target's own CPU time, from a preloaded library's constructor to its
destructor (bench/real/cputime.c): memtrace's drain thread inside the target counts, memtrace's host
and heaptrack's interpreter (other processes) do not, and neither does the set-up before the
program's constructors run.  The machine is shared, so CPU time, not wall time, and ratios against
native measured in the same run.  Also printed: each tool's whole command in wall seconds, the
capture's size against heaptrack's file, and what memtrace's summary says it dropped or truncated.
Missing tools are installed with apt-get when run as root (python3, sqlite3, g++, heaptrack).

--baseline SRC also runs the memtrace in SRC (another checkout's src/, e.g. from `git archive`; its
cmodule/ beside it), interleaved with this one, so a change is measured against its starting point
in the same run; --no-heaptrack leaves heaptrack out, --only runs the named programs."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "bench" / "real"
PACKAGES = {"/usr/bin/python3": "python3", "/usr/bin/sqlite3": "sqlite3", "g++": "g++", "heaptrack": "heaptrack"}


@dataclass
class Program:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    comm: str = ""          # the target's /proc/self/comm (15 characters at most)


@dataclass
class Result:
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    notes: dict[str, int] = field(default_factory=dict)


def ensure_tools() -> None:
    missing = [pkg for tool, pkg in PACKAGES.items() if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", *missing], check=True)
    else:
        sys.exit(f"bench_real: missing {', '.join(missing)} (apt-get install -y {' '.join(missing)})")


def build(tmp: Path) -> tuple[Path, list[Program]]:
    lib = tmp / "cputime.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(REAL / "cputime.c")], check=True)
    cxx = tmp / "cxx_work"
    subprocess.run(["g++", "-O2", "-o", str(cxx), str(REAL / "cxx_work.cpp")], check=True)
    ii = tmp / "cc_input.ii"
    subprocess.run(["g++", "-E", "-o", str(ii), str(REAL / "cc_input.cpp")], check=True)
    cc1plus = subprocess.run(["g++", "-print-prog-name=cc1plus"], capture_output=True, text=True,
                             check=True).stdout.strip()
    programs = [
        Program("python", ["/usr/bin/python3", str(REAL / "py_work.py")], {"PYTHONMALLOC": "malloc"}, "python3"),
        Program("sqlite3", ["/usr/bin/sqlite3", ":memory:", f".read {REAL / 'sqlite_work.sql'}"], comm="sqlite3"),
        Program("cxx", [str(cxx)], comm="cxx_work"),
        Program("cc1plus", [cc1plus, "-quiet", "-O2", str(ii), "-o", str(tmp / "cc_input.s")], comm="cc1plus"),
    ]
    return lib, programs


def target_cpu(stderr: str, comm: str) -> float:
    for m in re.finditer(r"^bench_cpu (\S+) ([\d.]+) ([\d.]+)\b", stderr, re.M):
        if m.group(1) == comm:
            return float(m.group(2))
    raise RuntimeError(f"no CPU time from {comm}: {stderr[-800:]}")


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def run(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    return proc, time.monotonic() - t0


def native(p: Program, lib: Path, r: Result) -> None:
    proc, wall = run(p.argv, {**p.env, "LD_PRELOAD": str(lib)})
    r.cpu.append(target_cpu(proc.stderr, p.comm))
    r.wall.append(wall)


def memtrace(p: Program, lib: Path, tmp: Path, r: Result, src: Path = ROOT / "src") -> None:
    out = Path(tempfile.mkdtemp(dir=tmp)) / "cap"
    cmd = [sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--json", "--window", "600",
           "--out", str(out), "--", *p.argv]
    proc, wall = run(cmd, {**p.env, "LD_PRELOAD": str(lib), "PYTHONPATH": str(src)})
    if proc.returncode != 0:
        raise RuntimeError(f"memtrace on {p.name}: {proc.stderr[-2000:]}")
    s = json.loads(proc.stdout)
    r.cpu.append(target_cpu(proc.stderr, p.comm))
    r.wall.append(wall)
    r.size.append(dir_size(out))
    for k, v in {**s["dropped"], "truncated_stacks": s["truncated_stacks"]}.items():
        r.notes[k] = max(r.notes.get(k, 0), v)
    r.notes["stack_coverage_pct"] = round(100 * (s["coverage"]["stack_coverage"] or 0))
    shutil.rmtree(out.parent, ignore_errors=True)


def heaptrack(p: Program, lib: Path, tmp: Path, r: Result) -> None:
    out = Path(tempfile.mkdtemp(dir=tmp))
    proc, wall = run(["heaptrack", "-o", str(out / "ht"), *p.argv], {**p.env, "LD_PRELOAD": str(lib)})
    r.cpu.append(target_cpu(proc.stderr + proc.stdout, p.comm))
    r.wall.append(wall)
    files = list(out.glob("ht*"))
    r.size.append(sum(f.stat().st_size for f in files))
    shutil.rmtree(out, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repeats", nargs="?", type=int, default=3, help="runs of each tool on each program (default 3)")
    ap.add_argument("--baseline", type=Path, metavar="SRC",
                    help="also run the memtrace in SRC (another checkout's src/), interleaved with this one")
    ap.add_argument("--no-heaptrack", action="store_true", help="leave heaptrack out")
    ap.add_argument("--only", metavar="NAME,...", help="run only these programs (python, sqlite3, cxx, cc1plus)")
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    baseline: Path | None = args.baseline.resolve() if args.baseline is not None else None
    only: set[str] | None = set(args.only.split(",")) if args.only else None
    with_heaptrack = not args.no_heaptrack
    repeats = args.repeats
    ensure_tools()
    results: dict[tuple[str, str], Result] = {}
    tools = ["native", "memtrace"] + (["baseline"] if baseline is not None else []) + (
        ["heaptrack"] if with_heaptrack else [])
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        lib, programs = build(tmp)
        programs = [p for p in programs if only is None or p.name in only]
        for rep in range(repeats):      # interleaved: a shared machine drifts between runs
            for p in programs:
                native(p, lib, results.setdefault((p.name, "native"), Result()))
                # this memtrace and the baseline take turns going first (a drift favours neither)
                order = [ROOT / "src", baseline] if baseline is not None else [ROOT / "src"]
                for src in order if rep % 2 == 0 else order[::-1]:
                    memtrace(p, lib, tmp, results.setdefault((p.name, "memtrace" if src == ROOT / "src" else
                                                                      "baseline"), Result()), src)
                if with_heaptrack:
                    heaptrack(p, lib, tmp, results.setdefault((p.name, "heaptrack"), Result()))
    print(f"target CPU seconds, median of {repeats} (x: against native in the same run; min-max of the "
          f"per-repeat ratios); whole command wall s; capture size; load {os.getloadavg()[0]:.1f}")
    print(f"{'program':9} {'native':>8} " + " ".join(f"{t:>10} {'x':>5} {'range':>11}" for t in tools[1:])
          + f" {'wall mt':>8} {'size mt':>9}  memtrace notes")
    for p in programs:
        n = results[(p.name, "native")]
        nc = statistics.median(n.cpu)
        cols = []
        for t in tools[1:]:
            r = results[(p.name, t)]
            ratios = [c / b for c, b in zip(r.cpu, n.cpu, strict=True)]
            cols.append(f"{statistics.median(r.cpu):10.2f} {statistics.median(r.cpu) / nc:5.2f} "
                        f"{min(ratios):5.2f}-{max(ratios):<5.2f}")
        m = results[(p.name, "memtrace")]
        notes = ", ".join(f"{k} {v:,}" for k, v in m.notes.items() if v)
        print(f"{p.name:9} {nc:8.2f} " + " ".join(cols) + f" {statistics.median(m.wall):8.2f} "
              f"{statistics.median(m.size) / 1e6:8.1f}M  {notes}")
        if with_heaptrack:
            h = results[(p.name, "heaptrack")]
            print(f"{'':9} heaptrack wall {statistics.median(h.wall):.2f} s, file {statistics.median(h.size) / 1e6:.1f}M")
        if baseline is not None:
            b = results[(p.name, "baseline")]
            print(f"{'':9} {paired_line(m.cpu, b.cpu)}; baseline wall {statistics.median(b.wall):.2f} s, "
                  f"size {statistics.median(b.size) / 1e6:.1f}M")


def paired_line(this: list[float], base: list[float]) -> str:
    """This memtrace against the baseline, repeat by repeat (the two ran one after the other): the
    median of the paired ratios and in how many pairs this one was faster.  Each program's ratio against
    native moves by +-15 % between runs on a shared machine, far more than most changes; a pair shares
    its moment's load, so a change of a few per cent shows as a majority of pairs going one way."""
    pairs = [a / b for a, b in zip(this, base, strict=True) if b > 0]
    if not pairs:
        return "this / baseline: no pairs"
    faster = sum(1 for r in pairs if r < 1)
    return (f"this / baseline, paired: median {statistics.median(pairs):.3f}, faster in {faster} of "
            f"{len(pairs)} pairs")


if __name__ == "__main__":
    main()
