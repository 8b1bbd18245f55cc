"""Cost of walking stacks through code without frame pointers (unwind tables) in the malloc core.

One run on this machine, every configuration interleaved and repeated; numbers are medians and
the comparison is a ratio against the frame-pointer-only walk of the same run (MEMTRACE_UNWIND=off,
where stacks stop at the first glibc frame).  Every allocation is stacked (--stack-threshold 0).

  direct  malloc(32) from a frame-pointer function: the walk's table steps are the two glibc
          start frames at the bottom of every stack (__libc_start_call_main, __libc_start_main)
  strdup  strdup("x") from a frame-pointer function: one more table step first (__strdup)

Usage: python bench/unwind_bench.py [allocations] [repeats]
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("direct", "strdup")


def build(tmp: Path) -> Path:
    exe = tmp / "unwind_loop"
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-rdynamic",
                    "-o", str(exe), str(ROOT / "bench" / "unwind_loop.c")], check=True)
    return exe


def parse(text: str) -> float:
    m = re.search(r"ns_per_alloc ([\d.]+)", text)
    if not m:
        raise RuntimeError(f"no timing in output: {text[-500:]}")
    return float(m.group(1))


def native(exe: Path, n: int, mode: str) -> float:
    return parse(subprocess.run([str(exe), str(n), mode], capture_output=True, text=True, check=True).stdout)


def memtrace(exe: Path, n: int, mode: str, tmp: Path, unwind: str) -> tuple[float, list[str]]:
    out = Path(tempfile.mkdtemp(dir=tmp))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MEMTRACE_UNWIND": unwind}
    proc = subprocess.run([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--json",
                           "--window", "600", "--stack-threshold", "0", "--out", str(out / "cap"), "--",
                           str(exe), str(n), mode], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    top = json.loads(proc.stdout)["top_stacks"][0]
    return parse(proc.stderr), [f["function"] or "?" for f in top["frames"]]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    times: dict[tuple[str, str], list[float]] = {}
    stacks: dict[tuple[str, str], list[str]] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build(tmp)
        for _ in range(repeats):
            for mode in MODES:
                times.setdefault((mode, "native"), []).append(native(exe, n, mode))
                for unwind in ("off", "on"):
                    t, frames = memtrace(exe, n, mode, tmp, unwind)
                    times.setdefault((mode, unwind), []).append(t)
                    stacks[(mode, unwind)] = frames
    print(f"{n:,} allocations per run, every one stacked; median of {repeats} interleaved runs")
    print(f"{'path':8} {'walk':28} {'ns/alloc':>9} {'+ns vs fp':>10} {'x fp walk':>10}  frames")
    for mode in MODES:
        fp = statistics.median(times[(mode, "off")])
        for key, label in (("native", "native (no memtrace)"), ("off", "frame pointers only"),
                           ("on", "frame pointers + tables")):
            med = statistics.median(times[(mode, key)])
            frames = " <- ".join(stacks.get((mode, key), []))
            extra = f"{med - fp:+10.1f} {med / fp:10.2f}" if key != "native" else f"{'':10} {'':10}"
            print(f"{mode:8} {label:28} {med:9.1f} {extra}  {frames}")


if __name__ == "__main__":
    main()
