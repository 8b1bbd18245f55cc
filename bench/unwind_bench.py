"""Cost of walking stacks through code without frame pointers (unwind tables) in the malloc core.

Two measurements, each against the frame-pointer-only walk of the same run:

1. The walk alone (bench/unwind_walk.c): cmodule/unwind.c's walk and core.c's frame-pointer loop
   over the same stacks in one process, with the tables memtrace builds for glibc and ld.so.
   Precise: nothing else runs between the timestamps.
2. End to end: ns per allocation of a program under ``memtrace malloc`` with every allocation
   stacked (--stack-threshold 0), tables on and off (MEMTRACE_UNWIND=off, where stacks stop at the
   first glibc frame), every configuration interleaved and repeated; medians.  The rings fill at
   this rate, so most records are dropped (counted): this is the walk + intern + count path.

  direct  malloc(32) from a frame-pointer function: the walk's table steps are the two glibc
          start frames at the bottom of every stack (__libc_start_call_main, __libc_start_main)
  strdup  strdup("x") from a frame-pointer function: one more table step first (__strdup)
  deep    malloc(32) 20 frame-pointer calls deeper than direct (28 frames kept: --frames 28)

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
MODES = ("direct", "strdup", "deep")


def walk_alone(tmp: Path, n: int) -> list[tuple[str, int, int, float, float, float]]:
    """(shape, frames by frame pointers, frames with tables, ns fp, ns tables, ns tables with the frame
    cache) from unwind_walk.c."""
    from memtrace.agentbuild import c_layout_header, cmodule_dir
    from memtrace.symbols.cfi import build_table

    d = tmp / "walk"
    (d / "tables").mkdir(parents=True)
    (d / "glib.h").write_text("typedef unsigned char guint8; typedef unsigned short guint16;\n"
                              "typedef unsigned int guint32; typedef int gint32; typedef unsigned long long guint64;\n"
                              "typedef long long gint64; typedef unsigned long gsize; typedef unsigned int guint;\n"
                              "typedef int gboolean; typedef int gint;\n")
    (d / "walk.c").write_text(c_layout_header() + "\n" + (ROOT / "bench" / "unwind_walk.c").read_text())
    exe = d / "unwind_walk"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-I", str(d), "-I",
                    str(cmodule_dir()), "-o", str(exe), str(d / "walk.c")], check=True)
    libs = subprocess.run(["ldd", str(exe)], capture_output=True, text=True, check=True).stdout
    for path in re.findall(r"(/\S+\.so[.\d]*)", libs):
        table = build_table(path)
        if table is not None and not table.keeps_frame_pointers:
            name = Path(path).resolve().name if Path(path).is_symlink() else Path(path).name
            for alias in {name, Path(path).name}:
                (d / "tables" / f"{alias}.rows").write_bytes(table.rows)
                (d / "tables" / f"{alias}.index").write_bytes(table.index)
    out = subprocess.run([str(exe), str(d / "tables"), str(n)], capture_output=True, text=True, check=True).stdout
    return [(s, int(a), int(b), float(x), float(y), float(z))
            for s, a, b, x, y, z in (line.split() for line in out.splitlines())]


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
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    times: dict[tuple[str, str], list[float]] = {}
    stacks: dict[tuple[str, str], list[str]] = {}
    walks: dict[str, list[tuple[int, int, float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build(tmp)
        for r in range(repeats):
            for shape, nf, nt, tf, tt, tc in walk_alone(tmp / f"w{r}", n):
                walks.setdefault(shape, []).append((nf, nt, tf, tt, tc))
            for mode in MODES:
                times.setdefault((mode, "native"), []).append(native(exe, n, mode))
                for unwind in ("off", "on"):
                    t, frames = memtrace(exe, n, mode, tmp, unwind)
                    times.setdefault((mode, unwind), []).append(t)
                    stacks[(mode, unwind)] = frames
    print(f"1. The walk alone: {n:,} walks per shape, median of {repeats} runs")
    print(f"{'shape':8} {'frames fp':>9} {'frames tables':>13} {'ns fp':>8} {'ns tables':>10} {'+ns':>7} {'x fp':>6} "
          f"{'ns cached':>10}")
    for shape, rows in walks.items():
        nf, nt = rows[0][0], rows[0][1]
        tf = statistics.median(r[2] for r in rows)
        tt = statistics.median(r[3] for r in rows)
        tc = statistics.median(r[4] for r in rows)
        print(f"{shape:8} {nf:9} {nt:13} {tf:8.1f} {tt:10.1f} {tt - tf:+7.1f} {tt / tf:6.2f} {tc:10.1f}")
    print()
    print(f"2. End to end: {n:,} allocations per run, every one stacked; median of {repeats} interleaved runs")
    print(f"{'path':8} {'walk':28} {'ns/alloc':>9} {'+ns vs fp':>10} {'x fp walk':>10}  frames")
    for mode in MODES:
        fp = statistics.median(times[(mode, "off")])
        for key, label in (("native", "native (no memtrace)"), ("off", "frame pointers only"),
                           ("on", "frame pointers + tables")):
            med = statistics.median(times[(mode, key)])
            frames = " <- ".join(stacks.get((mode, key), []))
            if len(frames) > 90:
                frames = "... <- " + frames[-84:]
            extra = f"{med - fp:+10.1f} {med / fp:10.2f}" if key != "native" else f"{'':10} {'':10}"
            print(f"{mode:8} {label:28} {med:9.1f} {extra}  {frames}")


if __name__ == "__main__":
    main()
