"""How fast `memtrace report` is against merely reading and decoding the same capture.

    .venv/bin/python bench/report_bench.py [--records 10000000] [--keep DIR]

Writes one synthetic malloc capture of about N agent records (allocations and frees with a
realistic mix of sizes and a few hundred distinct stacks, through the real capture writer), then
times, in this one run:

1. read + decode: ``read_records`` and ``iter_agent_tuples`` over every record, nothing else;
2. ``memtrace report`` on the folder (the real CLI entry, in-process, writing REPORT.md and
   report.json).

and prints records/s for both and their ratio (the goal: report within 2x of read+decode).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from memtrace.capture import RecordType, iter_agent_tuples, read_records  # noqa: E402
from memtrace.report import build_report  # noqa: E402
from memtrace.report.synthetic import CALLOC, MALLOC, REALLOC, SyntheticCapture  # noqa: E402

FUNCS = ["json_parse_document", "json_tokenize", "image_decode_frame", "jpeg_decode_scanlines",
         "gzip_inflate_chunk", "deflate_response", "net_receive_buffer", "http_read_request",
         "mtl_command_buffer_encode", "protobuf_serialize_message", "camera_metadata_alloc",
         "sqlite3_pcache_fetch", "cache_insert_entry", "simd_buffer_alloc", "render_tile"]
CALLERS = ["handle_request", "worker", "decode_loop", "main_loop", "serializer", "net_thread"]
SIZES = [4096, 8192, 12288, 16384, 32768, 65536, 131072, 262144, 1048576]
SIZE_WEIGHTS = [30, 25, 10, 12, 8, 8, 4, 2, 1]


def generate(path: Path, records: int, seed: int = 7) -> int:
    """Write the capture; returns the number of agent records written."""
    rng = random.Random(seed)
    cap = SyntheticCapture(path, "bench_app", window=60.0)
    stacks = [cap.stack(f, rng.choice(CALLERS), rng.choice(CALLERS), "start_thread")
              for f in FUNCS for _ in range(20)]          # 300 distinct stacks
    n = len(stacks)
    live: list[tuple[int, int]] = []
    written = n
    batch = 0
    sizes = rng.choices(SIZES, SIZE_WEIGHTS, k=4096)
    cap.calibration("before", 1 << 20, 40 << 20)
    i = 0
    while written < records:
        # Allocation-heavy with most blocks freed soon after: churn >> net, like a real app.
        if live and (len(live) > 5000 or rng.random() < 0.47):
            ptr, size = live.pop(rng.randrange(len(live)) if rng.random() < 0.1 else -1)
            cap.free(ptr, size)
        else:
            size = sizes[i & 4095]
            kind = MALLOC if i % 7 else (CALLOC if i % 2 else REALLOC)
            live.append((cap.alloc(stacks[(i * 2654435761) % n], size, kind), size))
            i += 1
        written += 1
        batch += 1
        if batch >= 20000:
            cap.flush()
            batch = 0
    cap.calibration("after", (1 << 20) + sum(s for _, s in live), 48 << 20)
    cap.end(captured_s=60.0)
    return written


def read_and_decode(path: Path) -> int:
    n = 0
    for rec in read_records(path):
        if rec.type == RecordType.BATCH and rec.data:
            for _ in iter_agent_tuples(rec.data):
                n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=3, help="Interleaved timing runs (median reported).")
    ap.add_argument("--keep", type=Path, help="Write the capture here (and keep it) instead of a temp dir.")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="memtrace-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    cap_path = work / "capture.mtc"
    try:
        if cap_path.exists():
            written = read_and_decode(cap_path)
            print(f"reusing {cap_path}: {written:,} records")
        else:
            t0 = time.perf_counter()
            written = generate(cap_path, args.records)
            print(f"generated {written:,} records ({cap_path.stat().st_size / 1e6:.0f} MB) "
                  f"in {time.perf_counter() - t0:.1f} s")
        # Interleaved repeats, median of each: shared machines drift between runs.
        decodes, reports = [], []
        decoded = 0
        out = work / "out"
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            decoded = read_and_decode(cap_path)
            decodes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            result = build_report(work, out=out)
            reports.append(time.perf_counter() - t0)
            assert not result.skipped, result.skipped
        t_decode, t_report = statistics.median(decodes), statistics.median(reports)
        print(f"median of {args.repeats} interleaved runs")
        print(f"read+decode : {t_decode:7.2f} s  {decoded / t_decode:12,.0f} records/s")
        print(f"report      : {t_report:7.2f} s  {decoded / t_report:12,.0f} records/s")
        print(f"ratio report / read+decode = {t_report / t_decode:.2f}x (goal <= 2x)")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
