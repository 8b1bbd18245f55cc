"""An all-stacked capture's size next to heaptrack's file for the same program (issue 21, item 7),
each run interleaved, and optionally next to another memtrace's (``--baseline SRC``, a checkout's
src/), measured in the same session:

    python bench/capture_size_bench.py [repeats] [--programs sqlite3,cc1plus] [--baseline OLD/src]

The programs are bench_real.py's (built the same way; default: sqlite3 and cc1plus).  A capture
grows with the run's length (the agent drains ten times a second) and heaptrack's file with it
too (its timestamps), so each line compares runs made back to back.  Printed: the median size of
each, and memtrace's against heaptrack's.

Also printed, from each capture's END record: the seconds memtrace spent symbolizing (issue 21,
item 6: <= 1 s at the end when the binaries were seen before) -- in all, and its last round, after
the target ended -- on the first run with an empty symbol cache (MEMTRACE_CACHE_DIR, the bench's
own) and the median of the later runs, which find every binary's SymCache there.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_real import ROOT, Program, build, dir_size, ensure_tools  # noqa: E402


def memtrace_size(p: Program, tmp: Path, src: Path) -> tuple[int, tuple[float, float]]:
    """The capture's size, and (all, final) seconds of symbolizing from its END record."""
    out = Path(tempfile.mkdtemp(dir=tmp)) / "cap"
    cmd = [sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--quiet", "--window", "600",
           "--out", str(out), "--", *p.argv]
    env = {**os.environ, **p.env, "PYTHONPATH": str(src), "MEMTRACE_CACHE_DIR": str(tmp / f"cache-{src.parent.name}")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"memtrace ({src}) on {p.name}: {proc.stderr[-2000:]}")
    size = dir_size(out)
    timing: dict[str, float] = {}
    sys.path.insert(0, str(ROOT / "src"))
    from memtrace.capture import RecordType, read_records

    for record in read_records(out):
        if record.type == RecordType.END:
            timing = record.body.get("timing") or {}
    shutil.rmtree(out.parent, ignore_errors=True)
    return size, (float(timing.get("symbolize_s", "nan")), float(timing.get("final_symbolize_s", "nan")))


def heaptrack_size(p: Program, tmp: Path) -> int:
    out = Path(tempfile.mkdtemp(dir=tmp))
    proc = subprocess.run(["heaptrack", "-o", str(out / "ht"), *p.argv], capture_output=True, text=True,
                          env={**os.environ, **p.env})
    if proc.returncode != 0:
        raise SystemExit(f"heaptrack on {p.name}: {proc.stderr[-2000:]}")
    size = sum(f.stat().st_size for f in out.glob("ht*"))
    shutil.rmtree(out, ignore_errors=True)
    return size


def main() -> None:
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return
    baseline: Path | None = None
    wanted = ["sqlite3", "cc1plus"]
    if "--baseline" in args:
        at = args.index("--baseline")
        baseline = Path(args[at + 1]).resolve()
        del args[at:at + 2]
    if "--programs" in args:
        at = args.index("--programs")
        wanted = args[at + 1].split(",")
        del args[at:at + 2]
    repeats = int(args[0]) if args else 3
    ensure_tools()
    sizes: dict[tuple[str, str], list[int]] = {}
    symbolize: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        _, programs = build(tmp)
        programs = [p for p in programs if p.name in wanted]
        for _ in range(repeats):
            for p in programs:
                size, took = memtrace_size(p, tmp, ROOT / "src")
                sizes.setdefault((p.name, "memtrace"), []).append(size)
                symbolize.setdefault(p.name, []).append(took)
                if baseline is not None:
                    sizes.setdefault((p.name, "baseline"), []).append(memtrace_size(p, tmp, baseline)[0])
                sizes.setdefault((p.name, "heaptrack"), []).append(heaptrack_size(p, tmp))
    print(f"capture size, median of {repeats} interleaved runs (bytes); load average {os.getloadavg()[0]:.1f}"
          + (f"; baseline: {baseline}" if baseline else ""))
    print(f"{'program':9} {'memtrace':>10} {'baseline':>10} {'heaptrack':>10} {'mt/ht':>6} {'base/ht':>8}")
    for p in programs:
        m = statistics.median(sizes[(p.name, "memtrace")])
        h = statistics.median(sizes[(p.name, "heaptrack")])
        b = statistics.median(sizes[(p.name, "baseline")]) if baseline is not None else None
        print(f"{p.name:9} {m:10,.0f} {'—' if b is None else f'{b:,.0f}':>10} {h:10,.0f} {m / h:6.2f} "
              f"{'—' if b is None else f'{b / h:.2f}':>8}")
    # A capture's size follows its run's length (drains, symbol rounds), which varies from run to
    # run on a loaded machine: each run's, in order.
    for (name, who), got in sizes.items():
        print(f"{name:9} {who:9} " + " ".join(f"{n:,}" for n in got))
    print("memtrace's symbolizing (seconds, END timing): all of the run / its last round, after the target ended")
    for p in programs:
        first, *later = symbolize[p.name]
        warm = (f"{statistics.median(t[0] for t in later):.2f} / {statistics.median(t[1] for t in later):.2f}"
                if later else "—")
        print(f"{p.name:9} empty symbol cache {first[0]:.2f} / {first[1]:.2f}; warm (median of {len(later)}) {warm}")


if __name__ == "__main__":
    main()
