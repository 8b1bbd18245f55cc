"""memtrace's host at the end of a run: from the target's exit to the command's return, and the
host's CPU for the whole run, on programs of a few hundred thousand allocations (issue 21 item 6):

    python bench/end_bench.py [repeats] [--baseline SRC] [--only python,cxx]

  python    CPython 3 (/usr/bin/python3) with PYTHONMALLOC=malloc running bench/real/py_work.py
  cxx       bench/real/cxx_work.cpp (std::map / std::string / std::vector), g++ -O2

A library preloaded into every process of the run (bench/real/cputime.c, bench_real.py's) prints, at its destructor, the process's pid,
name, CPU seconds and CLOCK_MONOTONIC (one clock for every process of the machine): ``end`` is the
command's return minus the target's destructor -- the final drain, the symbolization, the summary;
``host cpu`` is memtrace's own process's CPU from its start to its exit.  ``--baseline SRC`` runs
another memtrace's src/ (e.g. ``git archive`` of main, with its cmodule/ beside it) interleaved
with this one, taking turns going first: the machine is shared, so compare within one run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "bench" / "real"


def build(tmp: Path) -> tuple[Path, dict[str, tuple[list[str], dict[str, str], str]]]:
    # bench_real's library: each process prints its CPU time, pid and end (bench/real/cputime.c)
    lib = tmp / "cputime.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(REAL / "cputime.c")], check=True)
    cxx = tmp / "cxx_work"
    subprocess.run(["g++", "-O2", "-o", str(cxx), str(REAL / "cxx_work.cpp")], check=True)
    return lib, {
        "python": (["/usr/bin/python3", str(REAL / "py_work.py")], {"PYTHONMALLOC": "malloc"}, "python3"),
        "cxx": ([str(cxx)], {}, "cxx_work"),
    }


def run(src: Path, argv: list[str], env: dict[str, str], comm: str, lib: Path, tmp: Path) -> tuple[float, float]:
    """(end seconds, host CPU seconds) of one run of the memtrace in ``src``."""
    out = Path(tempfile.mkdtemp(dir=tmp)) / "cap"
    cmd = [sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--quiet", "--out", str(out),
           "--", *argv]
    full = {**os.environ, **env, "LD_PRELOAD": str(lib), "PYTHONPATH": str(src),
            "PYTHONPYCACHEPREFIX": str(tmp / "pycache")}
    full.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.Popen(cmd, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate()
    done = time.monotonic()
    if proc.returncode != 0:
        raise SystemExit(f"memtrace failed ({proc.returncode}): {err[-1500:]}")
    target_end = host_cpu = None
    for m in re.finditer(r"^bench_cpu (\S+) ([\d.]+) [\d.]+ (\d+) ([\d.]+)$", err, re.M):
        name, cpu, pid, at = m.group(1), float(m.group(2)), int(m.group(3)), float(m.group(4))
        if pid == proc.pid:
            host_cpu = cpu
        elif name == comm:
            target_end = at
    if target_end is None or host_cpu is None:
        raise SystemExit(f"no stamps from the target or the host: {err[-800:]}")
    shutil.rmtree(out.parent, ignore_errors=True)
    return done - target_end, host_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repeats", nargs="?", type=int, default=3)
    ap.add_argument("--baseline", type=Path, metavar="SRC", help="another memtrace's src/, interleaved")
    ap.add_argument("--only", metavar="NAME,...", help="python, cxx")
    args = ap.parse_args()
    srcs = {"memtrace": ROOT / "src"}
    if args.baseline is not None:
        srcs["baseline"] = args.baseline.resolve()
    with tempfile.TemporaryDirectory(prefix="memtrace-end-") as d:
        tmp = Path(d)
        lib, programs = build(tmp)
        names = [n for n in programs if args.only is None or n in args.only.split(",")]
        for name in names:          # a first, untimed run of each fills the caches (bytecode, symbols)
            for src in srcs.values():
                run(src, *programs[name], lib, tmp)
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for rep in range(args.repeats):
            for name in names:
                order = list(srcs.items()) if rep % 2 == 0 else list(srcs.items())[::-1]
                for label, src in order:
                    results.setdefault((name, label), []).append(run(src, *programs[name], lib, tmp))
    print(f"memtrace's host at the end of a run, median of {args.repeats} (seconds); "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'program':8} {'tool':9} {'end':>6} {'range':>11} {'host cpu':>9}")
    for (name, label), rows in results.items():
        ends = [r[0] for r in rows]
        print(f"{name:8} {label:9} {statistics.median(ends):6.2f} {min(ends):5.2f}-{max(ends):<5.2f} "
              f"{statistics.median(r[1] for r in rows):9.2f}")


if __name__ == "__main__":
    main()
