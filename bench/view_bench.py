"""How big and how slow the HTML views are on a large capture (issue: views that scale).

    .venv/bin/python bench/view_bench.py [--stacks 131072] [--report-copies 24] [--keep DIR]

Writes one synthetic aggregate-mode malloc capture with N distinct stacks
(:func:`memtrace.report.synthetic.write_large_capture`), then measures, in this one run:

1. ``memtrace flamegraph`` (the real CLI, in a child process): seconds, page size, peak RSS;
2. ``memtrace report`` over a folder holding ``--report-copies`` copies of that capture (child
   process): seconds, report.html size, the size of everything written, peak RSS.

Prints wall and CPU seconds (CPU is what an idle machine's wall time would be, roughly: on a
shared machine wall time mostly measures the neighbours); nothing is asserted.  The goals
the views are held to: flame page <= 5 MB and <= 5 s; report.html <= 10 MB and <= 600 MB of memory.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from memtrace.report.synthetic import write_large_capture  # noqa: E402

# Runs the command in a fresh process and prints its children's CPU seconds and largest RSS: this
# bench's own RUSAGE_CHILDREN would mix every command it ran before.
_MEASURE = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "r = resource.getrusage(resource.RUSAGE_CHILDREN); print(r.ru_utime + r.ru_stime, r.ru_maxrss)")


def run(*args: str | Path) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, largest process's RSS in MB -- the report's workers included) of
    one memtrace command."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "memtrace.cli", *map(str, args)],
                         check=True, capture_output=True, text=True).stdout.split()
    return time.perf_counter() - t0, float(out[0]), int(out[1]) / 1024


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stacks", type=int, default=131_072)
    ap.add_argument("--report-copies", type=int, default=24)
    ap.add_argument("--keep", type=Path, help="Work here (and keep it) instead of a temp dir.")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="memtrace-viewbench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        cap = work / "large-malloc" / "capture.mtc"
        if not cap.exists():
            cap.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            truth = write_large_capture(cap, stacks=args.stacks)
            print(f"capture: {truth['stacks']:,} stacks, {cap.stat().st_size / 1e6:.1f} MB, "
                  f"written in {time.perf_counter() - t0:.1f} s")
        page = work / "flame.html"
        took, cpu, rss = run("flamegraph", cap.parent, "-o", page)
        print(f"flamegraph : {took:6.1f} s wall, {cpu:6.1f} s CPU  page {page.stat().st_size / 1e6:7.2f} MB  "
              f"peak RSS {rss:6.0f} MB")
        if args.report_copies:
            folder = work / "many"
            if not folder.exists():
                for i in range(args.report_copies):
                    (folder / f"large{i:02d}-malloc").mkdir(parents=True)
                    shutil.copy(cap, folder / f"large{i:02d}-malloc" / "capture.mtc")
            out = work / "report-out"
            shutil.rmtree(out, ignore_errors=True)
            took, cpu, rss = run("report", folder, "--out", out)
            html = out / "report.html"
            print(f"report x{args.report_copies}: {took:6.1f} s wall, {cpu:6.1f} s CPU  report.html "
                  f"{html.stat().st_size / 1e6:7.2f} MB  all written {du(out) / 1e6:7.1f} MB  "
                  f"largest process {rss:6.0f} MB")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
