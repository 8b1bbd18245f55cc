"""The same records through two capture writers: this memtrace's and another checkout's (a
capture's size without the run-to-run noise of a live run, whose length -- drains, symbol rounds
-- changes from one run to the next):

    python bench/capture_rewrite_bench.py --baseline OLD/src CAPTURE...

Each capture is read (by this memtrace), then written again by each writer, record by record in
the order they were read, in a process of its own (``PYTHONPATH`` the writer's ``src``), with the
writer's clock (``time.monotonic``, which closes a group after GROUP_S) set to the run's time at
each record (a drain's ``t``, a SNAPSHOT's): the groups close where they would have in the run.
Printed: each writer's file size and its CPU time for the writing.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WRITE = """
import os, pickle, sys, time
from memtrace import capture
from memtrace.capture import CaptureWriter, RecordType
records = pickle.load(open(sys.argv[1], "rb"))
now = [0.0]
capture.time.monotonic = lambda: now[0]
cpu = time.process_time()
with CaptureWriter(sys.argv[2], reserve=0) as w:
    for rtype, body, data, clock in records:
        now[0] = clock
        w.write(RecordType(rtype), body, data)
print(os.path.getsize(sys.argv[2]), time.process_time() - cpu, capture.FORMAT_VERSION)
"""


def records(path: Path) -> list[tuple[int, object, bytes, float]]:
    sys.path.insert(0, str(ROOT / "src"))
    from memtrace.capture import RecordType, read_records

    out = []
    clock = 0.0
    for r in read_records(path):
        body = r.body if isinstance(r.body, dict) else {}
        t = body.get("t")
        if isinstance(t, int | float) and r.type == RecordType.BATCH:
            clock = t / 1000            # (ms after the hooks went in)
        elif isinstance(t, int | float) and r.type == RecordType.SNAPSHOT:
            clock = t                   # (s)
        out.append((int(r.type), r.body, bytes(r.data or b""), clock))
    return out


def write(src: Path, recs: Path, out: Path) -> tuple[int, float, int]:
    out.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-c", WRITE, str(recs), str(out)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    if proc.returncode != 0:
        raise SystemExit(f"the writer of {src}: {proc.stderr[-2000:]}")
    size, cpu, version = proc.stdout.split()
    return int(size), float(cpu), int(version)


def main() -> None:
    args = sys.argv[1:]
    if "--baseline" not in args:
        raise SystemExit(__doc__)
    at = args.index("--baseline")
    baseline = Path(args[at + 1]).resolve()
    del args[at:at + 2]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for capture in map(Path, args):
            recs = Path(d) / "records.pickle"
            recs.write_bytes(pickle.dumps(records(capture)))
            new = write(ROOT / "src", recs, Path(d) / "new.mtc")
            old = write(baseline, recs, Path(d) / "old.mtc")
            rows.append({"capture": str(capture), "this": new[0], "this_cpu_s": round(new[1], 3),
                         "this_format": new[2], "baseline": old[0], "baseline_cpu_s": round(old[1], 3),
                         "baseline_format": old[2], "ratio": round(new[0] / old[0], 3)})
            print(json.dumps(rows[-1]))


if __name__ == "__main__":
    main()
