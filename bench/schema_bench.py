"""What checking a capture's JSON records costs: capture._decode (parse + the msgspec schema check)
against a bare json.loads of the same payloads, measured in the same run (CPU time, best of N).

    .venv/bin/python bench/schema_bench.py [events] [rounds]

The records are what a thread storm's capture holds (tens of thousands of EVENTS, the JSON-heaviest
record memtrace writes) plus a malloc capture's BATCH bodies and a SYMBOLS record.  A ratio at or
below 1.0 means the schema check costs nothing beyond parsing the JSON with the standard library.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from memtrace import capture, layout
from memtrace.capture import RecordType


def payloads(n_events: int) -> list[tuple[RecordType, bytes]]:
    events = []
    for i in range(n_events):
        kind = ("create", "start", "exit", "rename")[i % 4]
        ev = {"type": kind, "t": i * 0.25, "tid": 1000 + i, "frames": [f"0x7f00{i:08x}", "0x55d0c0de1234"]}
        if kind == "create":
            ev.update(routine="0x55d0c0de1000", detached=False, stack_size=8 << 20, handle="0x7f0012345000")
        elif kind == "rename":
            ev.update(name=f"worker-{i}", previous=None)
        events.append(ev)
    out = [(RecordType.EVENTS, json.dumps({"events": events[i:i + 500]}).encode())
           for i in range(0, len(events), 500)]
    batch = {"counters": list(range(layout.N_COUNTERS)), "t": 1234.5, "lost": 0, "live": 17, "stacks": 900,
             "mode": "aggregate", "final": True, "t0": 10.0, "clock": [5_000_000, 1000.0],
             "tracked": {"bytes": 1 << 30, "blocks": 99}, "peak": {"bytes": 1 << 31, "epoch": 3, "t": 600},
             "sample": {"t": 1000, "tracked_bytes": 9192, "tracked_blocks": 2, "peak_bytes": 10192,
                        "in_use": 100000, "footprint": 200000, "top": [[s, s * 64] for s in range(20)]}}
    out += [(RecordType.BATCH, json.dumps(batch).encode())] * 200
    rows = [[f"0x{0x1000 + 16 * i:x}", "app", 16 * i, f"function_{i}", "/src/app.c", i, [["inlined", "/src/h.h", 3]]]
            for i in range(5000)]
    out.append((RecordType.SYMBOLS, json.dumps({"rows": rows}).encode()))
    return out


def best(run: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.process_time()
        run()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return
    n_events = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    recs = payloads(n_events)
    framed = [(k, len(p).to_bytes(4, "little") + p if k == RecordType.BATCH else p) for k, p in recs]
    for k, p in framed:                 # every one of them must pass the check
        assert capture._decode(int(k), p, 2) is not None
    base = best(lambda: [json.loads(p) for _, p in recs], rounds)
    checked = best(lambda: [capture._decode(int(k), p, 2) for k, p in framed], rounds)
    size = sum(len(p) for _, p in recs)
    print(f"{len(recs)} records, {size / 1e6:.1f} MB of JSON, {n_events} events")
    print(f"json.loads alone          {base * 1e3:8.1f} ms")
    print(f"capture._decode (checked) {checked * 1e3:8.1f} ms   ratio {checked / base:.2f}")


if __name__ == "__main__":
    main()
