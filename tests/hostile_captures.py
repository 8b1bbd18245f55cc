"""Crafted captures that are well framed (valid checksums) but say impossible things.

Written from the format's description (memtrace/capture.py's docstring), not with its writer,
so the tests hold the reader to the format rather than to itself.  Each case is one record
of a small valid capture replaced or added; ``write_case`` writes it for format version 1 or 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

META, RECON, MODULES, BATCH, SYMBOLS, CALIBRATION, EVENTS, WARNING, SNAPSHOT, END, RESULT = range(1, 12)


def header(version: int = 2) -> bytes:
    if version == 1:
        return struct.pack("<8sHHI", b"MEMTRACE", 1, 0, 0)
    head = struct.pack("<8sHH", b"MEMTRACE", version, 0)
    return head + struct.pack("<I", zlib.crc32(head))


def record_head(rtype: int, length: int, crc: int = 0) -> bytes:
    """A version-2 record header claiming ``length`` bytes (its own check right, ``crc`` as given)."""
    check = zlib.crc32(struct.pack("<BBI", rtype, 0, length)) & 0xFFFF
    return struct.pack("<BBHII", rtype, 0, check, length, crc)


def frame(rtype: int, payload: bytes, version: int = 2) -> bytes:
    if version == 1:
        return struct.pack("<BBHI", rtype, 0, 0, len(payload)) + payload
    check = zlib.crc32(struct.pack("<BBI", rtype, 0, len(payload))) & 0xFFFF
    head = struct.pack("<BBHI", rtype, 0, check, len(payload))
    return head + struct.pack("<I", zlib.crc32(head + payload)) + payload


def js(body: Any) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def batch(body: Any, data: bytes = b"", json_length: int | None = None) -> bytes:
    j = js(body)
    return struct.pack("<I", len(j) if json_length is None else json_length) + j + data


def chunk(tid: int, records: bytes, length: int | None = None) -> bytes:
    return struct.pack("<II", tid, len(records) if length is None else length) + records


STACK = struct.pack("<BBHI", 1, 2, 0, 5) + struct.pack("<2Q", 0x1010, 0x1020)
ALLOC = struct.pack("<BBHIQQQ", 2, 0, 1, 5, 0xA000, 8192, 8192)
FREE = struct.pack("<BBHIQQ", 3, 3, 0, 0, 0xA000, 0)
COUNTERS = [0] * 64
COUNTERS[0], COUNTERS[16] = 1, 8192


def base(tracer: str = "malloc") -> list[tuple[int, bytes]]:
    """A small, valid capture of ``tracer``: every record type the analyzers fold."""
    recs = [
        (META, js({"tracer": tracer, "target": {"label": "hostile", "argv": ["hostile"]},
                   "options": {"window": 1.0, "attach_delay": 0.0, "agent": {}}})),
        (RECON, js({"symbols": [{"name": "malloc", "status": "found"}, {"name": "gone", "status": "MISSING"}],
                    "info": {}})),
        (MODULES, js({"modules": [{"name": "app", "path": "/app", "base": "0x1000", "size": 4096}]})),
        (CALIBRATION, js({"phase": "before", "allocator": {"source": "x", "in_use": 100},
                          "footprint": {"source": "x", "footprint": 1000}})),
    ]
    if tracer == "malloc":
        recs.append((BATCH, batch({"counters": COUNTERS}, chunk(7, STACK + ALLOC + FREE))))
    else:
        recs.append((EVENTS, js({"events": [
            {"type": "set", "entry": "vm_purgable_control", "control": 0, "addr": "0x5000", "new_state": 1,
             "old_state": 0, "kr": 0, "bytes": 4096, "frames": ["0x1010", "0x1020"], "t": 1}]})))
    recs += [
        (SYMBOLS, js({"rows": [["0x1010", "app", 16, "main", "main.c", 3], ["0x1020", "app", 32, None, None, None]],
                      "by": "test"})),
        (CALIBRATION, js({"phase": "after", "allocator": {"source": "x", "in_use": 8292},
                          "footprint": {"source": "x", "footprint": 9192}})),
        (END, js({"ended": "completed", "reason": "the 1 s window completed", "evidence": {},
                  "timing": {"captured_s": 1.0}, "counters": COUNTERS})),
    ]
    return recs


def _replace(rtype: int, payload: bytes, tracer: str = "malloc") -> Callable[[], list[tuple[int, bytes]]]:
    def build() -> list[tuple[int, bytes]]:
        recs = base(tracer)
        i = next(i for i, (t, _) in enumerate(recs) if t == rtype)
        recs[i] = (rtype, payload)
        return recs
    return build


def _add(rtype: int, payload: bytes, tracer: str = "malloc") -> Callable[[], list[tuple[int, bytes]]]:
    def build() -> list[tuple[int, bytes]]:
        recs = base(tracer)
        recs.insert(-1, (rtype, payload))
        return recs
    return build


def _event(ev: dict[str, Any]) -> Callable[[], list[tuple[int, bytes]]]:
    good = {"type": "set", "entry": "vm_purgable_control", "control": 0, "addr": "0x5000", "new_state": 1,
            "old_state": 0, "kr": 0, "bytes": 4096, "frames": ["0x1010"], "t": 1}
    return _replace(EVENTS, js({"events": [{**good, **ev}]}), "purgeable")


CASES: dict[str, Callable[[], list[tuple[int, bytes]]]] = {
    # BATCH framing
    "batch-stack-overruns": _replace(BATCH, batch({"counters": COUNTERS},
                                                  chunk(7, struct.pack("<BBHI", 1, 200, 0, 5) + b"\0" * 16))),
    "batch-chunk-overruns": _replace(BATCH, batch({"counters": COUNTERS}, chunk(7, ALLOC, length=4096))),
    "batch-json-length-overruns": _replace(BATCH, batch({"counters": COUNTERS}, b"", json_length=1 << 20)),
    "batch-unknown-agent-record": _replace(BATCH, batch({"counters": COUNTERS}, chunk(7, b"\x09" + ALLOC[1:]))),
    "batch-alloc-cut": _replace(BATCH, batch({"counters": COUNTERS}, chunk(7, ALLOC[:20]))),
    "batch-counters-short": _replace(BATCH, batch({"counters": [1, 2]})),
    "batch-counters-string": _replace(BATCH, batch({"counters": "lots"})),
    "batch-body-list": _replace(BATCH, batch([1, 2, 3])),
    # addresses
    "symbols-bad-address": _replace(SYMBOLS, js({"rows": [["0xq1", "app", 1, "f", None, None]]})),
    "events-bad-frame": _event({"frames": ["0x1010", "0xZZ"]}),
    "events-bad-addr": _event({"addr": "nowhere"}),
    "modules-bad-base": _replace(MODULES, js({"modules": [{"name": "app", "base": "zz", "size": 1}]})),
    # rows and keys
    "symbols-row-short": _replace(SYMBOLS, js({"rows": [["0x1010"]]})),
    "symbols-rows-objects": _replace(SYMBOLS, js({"rows": [{"address": "0x1010"}]})),
    "symbols-inlined-wrong": _replace(SYMBOLS, js({"rows": [["0x1010", "app", 16, "main", None, None, [[7]]]]})),
    "modules-missing-base": _replace(MODULES, js({"modules": [{"name": "app", "size": 4096}]})),
    "recon-symbol-without-name": _replace(RECON, js({"symbols": [{"status": "MISSING"}]})),
    "events-not-objects": _replace(EVENTS, js({"events": [1, "two"]}), "purgeable"),
    "events-not-a-list": _replace(EVENTS, js({"events": {"type": "set"}}), "purgeable"),
    "event-bytes-string": _event({"bytes": "4096"}),
    # whole records of the wrong JSON type
    "meta-list": _replace(META, js([1, 2])),
    "meta-string": _replace(META, js("malloc")),
    "meta-target-list": _replace(META, js({"tracer": "malloc", "target": ["x"]})),
    "meta-window-string": _replace(META, js({"tracer": "malloc", "options": {"window": "long"}})),
    "end-list": _replace(END, js(["completed"])),
    "end-number": _replace(END, js(3)),
    "end-timing-list": _replace(END, js({"ended": "completed", "reason": "x", "timing": [1]})),
    "end-counters-short": _replace(END, js({"ended": "completed", "reason": "x", "counters": [1]})),
    "symbols-list": _replace(SYMBOLS, js([["0x1010", "app", 16, "main"]])),
    "modules-string": _replace(MODULES, js("app")),
    "calibration-list": _replace(CALIBRATION, js([100])),
    "calibration-in-use-string": _replace(CALIBRATION, js({"phase": "before", "allocator": {"in_use": "100"}})),
    "warning-number": _add(WARNING, js(5)),
    "result-list": _add(RESULT, js([1]), "purgeable"),
    "probe-rows-wrong": _add(RESULT, js({"tracer": "probe", "rows": [{"entry": "x", "ledger_delta": {"a": "b"}}],
                                         "errors": [], "ledger_available": True}), "purgeable"),
    # JSON a memtrace never writes
    "nan-in-end": _replace(END, b'{"ended": "completed", "reason": "x", "timing": {"captured_s": NaN}}'),
    "huge-number": _replace(END, b'{"ended": "completed", "reason": "x", "timing": {"captured_s": 1e999}}'),
    "deep-nesting": _add(WARNING, b"[" * 100000 + b"]" * 100000),
    "not-utf8": _add(WARNING, b'{"message": "\xff\xfe"}'),
}


def write_case(path: Path, name: str, version: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header(version) + b"".join(frame(t, p, version) for t, p in CASES[name]()))
    return path


def write_base(path: Path, tracer: str = "malloc", version: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header(version) + b"".join(frame(t, p, version) for t, p in base(tracer)))
    return path


@contextlib.contextmanager
def scratch_dir(fallback: Path) -> Iterator[Path]:
    """Where tests write thousands of small variants: memory (/dev/shm) where the machine has it."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(dir=shm, prefix="memtrace-test-") as d:
            yield Path(d)
    else:
        yield fallback


# ---- absurd values (issue 26) ---------------------------------------------------------------------
#
# Records whose framing, checksums and JSON shapes are all right, but whose values are impossible:
# counters at 2^63 and 2^64-1, AGG masks with bits beyond the fields or more bits than values,
# PEAK_HEADs naming 2^32-1 stacks that never follow, stack ids that point nowhere.  Every agent
# record type and every number of every JSON record gets each absurd value in turn; a seeded random
# mix of several at once follows.  Each case is (name, records).

U64_ABSURD = (0, 1 << 31, (1 << 32) - 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)
JSON_ABSURD: tuple[Any, ...] = (-1, 1 << 63, (1 << 64) - 1, 1 << 64, 10**30, 1e308, -1e308, 0.5)

# The agent records' layouts as the format's description gives them: (struct format, field names).
AGENT_LAYOUTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "stack": ("<BBHI", ("type", "nframes", "zero", "stack_id")),
    "alloc": ("<BBHIQQQ", ("type", "kind", "flags", "stack_id", "ptr", "size", "weight")),
    "free": ("<BBHIQQ", ("type", "kind", "zero", "zero2", "ptr", "size")),
    "agg": ("<BBHIII", ("type", "nvalues", "zero", "stack_id", "mask", "zero2")),
    "peak_head": ("<BBHIQQQQ", ("type", "zero", "zero2", "nstacks", "epoch", "bytes", "count", "t_us")),
    "peak": ("<BBHIQQ", ("type", "zero", "zero2", "stack_id", "bytes", "count")),
    "live": ("<BBHIQQII", ("type", "k", "zero", "stack_id", "ptr", "size", "tick", "zero2")),
}
AGG_MASK = 0b1_1111_1110_0011_1111     # the shipped fields (layout.AGG_SHIPPED_MASK)


def _agent(record: str, **values: int) -> dict[str, Any]:
    return {"record": record, **values}


def _aggregate_records() -> list[dict[str, Any]]:
    """A valid aggregate-mode drain: two stacks, their totals, a peak of both, a live block each."""
    nvalues = bin(AGG_MASK).count("1")
    return [
        _agent("stack", type=1, nframes=2, zero=0, stack_id=1, frames=[0x1010, 0x1020]),
        _agent("stack", type=1, nframes=1, zero=0, stack_id=2, frames=[0x1020]),
        _agent("agg", type=4, nvalues=nvalues, zero=0, stack_id=1, mask=AGG_MASK, zero2=0,
               values=[3, 3000, 1, 1000, 1, 1000] + [0] * (nvalues - 6)),
        _agent("agg", type=4, nvalues=2, zero=0, stack_id=2, mask=0b11, zero2=0, values=[1, 8192]),
        _agent("peak_head", type=5, zero=0, zero2=0, nstacks=2, epoch=3, bytes=10192, count=3, t_us=5_000_500),
        _agent("peak", type=6, zero=0, zero2=0, stack_id=1, bytes=2000, count=2),
        _agent("peak", type=6, zero=0, zero2=0, stack_id=2, bytes=8192, count=1),
        _agent("live", type=7, k=0, zero=0, stack_id=1, ptr=0xB000, size=1000, tick=3, zero2=0),
        _agent("live", type=7, k=0, zero=0, stack_id=2, ptr=0xC000, size=8192, tick=4, zero2=0),
        _agent("alloc", type=2, kind=0, flags=1, stack_id=2, ptr=0xD000, size=64, weight=64),
        _agent("free", type=3, kind=3, zero=0, zero2=0, ptr=0xD000, size=64),
    ]


def pack_agent(rec: dict[str, Any]) -> bytes:
    fmt, names = AGENT_LAYOUTS[rec["record"]]
    out = struct.pack(fmt, *(rec[n] & ((1 << (8 * struct.calcsize("<" + c))) - 1)
                             for n, c in zip(names, fmt[1:], strict=True)))
    if rec["record"] == "stack":
        out += struct.pack(f"<{len(rec['frames'])}Q", *rec["frames"])
    elif rec["record"] == "agg":
        out += struct.pack(f"<{len(rec['values'])}Q", *rec["values"])
    return out


AGG_BODY = {"mode": "aggregate", "final": True, "counters": COUNTERS, "t": 1000, "t0": 100,
            "clock": [5_001_000, 1000], "lost": 0, "live": 2, "stacks": 2,
            "tracked": {"bytes": 9192, "blocks": 2}, "peak": {"bytes": 10192, "epoch": 3, "t": 600},
            "live_done": True,
            "sample": {"t": 1000, "tracked_bytes": 9192, "tracked_blocks": 2, "peak_bytes": 10192,
                       "in_use": 100000, "footprint": 200000, "top": [[1, 1000], [2, 8192]]}}


def _chunks(agent: list[dict[str, Any]]) -> bytes:
    """The records in chunks as the core writes them: a composition (PEAK_HEAD and its PEAK
    records) in a chunk of its own."""
    groups: list[list[dict[str, Any]]] = [[]]
    for r in agent:
        in_composition = bool(groups[-1]) and groups[-1][0]["record"] == "peak_head"
        if r["record"] == "peak_head" or (in_composition and r["record"] != "peak"):
            groups.append([])
        groups[-1].append(r)
    return b"".join(chunk(0, b"".join(map(pack_agent, g))) for g in groups if g)


def aggregate_base(agent: list[dict[str, Any]] | None = None, body: Any = None) -> list[tuple[int, bytes]]:
    """The malloc base capture with its BATCH replaced by an aggregate-mode one."""
    recs = base("malloc")
    agent = _aggregate_records() if agent is None else agent
    i = next(i for i, (t, _) in enumerate(recs) if t == BATCH)
    recs[i] = (BATCH, batch(AGG_BODY if body is None else body, _chunks(agent)))
    recs.insert(-1, (RESULT, js({"tracer": "malloc", "kind": "leaks", "when": "end", "complete": True,
                                 "stopped": True, "candidates": 2, "leaked_blocks": 1, "leaked_bytes": 1000,
                                 "reachable_blocks": 1, "reachable_bytes": 8192,
                                 "leaked_by_stack": [[1, 1, 1000]], "reachable_by_stack": [[2, 1, 8192]],
                                 "leaked": [["0xb000", 1000, 1]], "skipped": {}})))
    recs.insert(-1, (SNAPSHOT, js({"t": 1.0, "calls": 4, "bytes": 12192, "calls_per_s": 4.0,
                                   "bytes_per_s": 12192.0, "counters": COUNTERS})))
    recs.insert(-1, (WARNING, js({"message": "a warning"})))
    return recs


def _numbers(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every number in a JSON value (of a list longer than 8, the first two elements only)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield at
    elif isinstance(value, dict):
        for k, x in value.items():
            yield from _numbers(x, (*at, k))
    elif isinstance(value, list):
        for i, x in enumerate(value if len(value) <= 8 else value[:2]):
            yield from _numbers(x, (*at, i))


def _set(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[at[0]] = _set(value[at[0]], at[1:], new)
    return copy


def _split(rtype: int, payload: bytes) -> tuple[Any, bytes]:
    if rtype != BATCH:
        return json.loads(payload), b""
    n = int.from_bytes(payload[:4], "little")
    return json.loads(payload[4:4 + n]), payload[4 + n:]


def _join(rtype: int, body: Any, data: bytes) -> bytes:
    return batch(body, data) if rtype == BATCH else js(body)


def absurd_cases() -> Iterator[tuple[str, list[tuple[int, bytes]]]]:
    """Every agent field and every JSON number of the aggregate base, one absurd value at a time,
    and the structural lies (masks, counts, ids)."""
    agent = _aggregate_records()
    for i, rec in enumerate(agent):
        _, names = AGENT_LAYOUTS[rec["record"]]
        for name in names[1:]:
            for v in U64_ABSURD:
                changed = [dict(r) for r in agent]
                changed[i][name] = v
                if name in ("nframes", "nvalues"):
                    continue        # framing, not values: the structural cases below
                yield f"agent-{i}-{rec['record']}-{name}={v}", aggregate_base(changed)
        for key in ("frames", "values"):
            for v in U64_ABSURD:
                if key in rec:
                    changed = [dict(r) for r in agent]
                    changed[i][key] = [v] * len(rec[key])
                    yield f"agent-{i}-{rec['record']}-{key}={v}", aggregate_base(changed)
    yield from _structural(agent)
    for name, make in (("json", aggregate_base), ("events", lambda: base("purgeable"))):
        for r, (rtype, payload) in enumerate(make()):
            body, data = _split(rtype, payload)
            for at in _numbers(body):
                for v in JSON_ABSURD:
                    recs = make()
                    recs[r] = (rtype, _join(rtype, _set(body, at, v), data))
                    yield f"{name}-{r}-{rtype}-{'.'.join(map(str, at))}={v}", recs


def _structural(agent: list[dict[str, Any]]) -> Iterator[tuple[str, list[tuple[int, bytes]]]]:
    def with_(i: int, **values: Any) -> list[dict[str, Any]]:
        changed = [dict(r) for r in agent]
        changed[i].update(values)
        return changed

    yield "agg-mask-beyond-fields", aggregate_base(with_(3, mask=0b11 | 1 << 31))
    yield "agg-mask-all-bits", aggregate_base(with_(3, mask=0xFFFFFFFF))
    yield "agg-more-bits-than-values", aggregate_base(with_(3, mask=0b111))
    yield "agg-more-values-than-bits", aggregate_base(with_(3, mask=0b1))
    yield "agg-no-values", aggregate_base(with_(3, nvalues=0, mask=0, values=[]))
    yield "agg-255-values", aggregate_base(with_(3, nvalues=255, values=[7] * 255))
    yield "agg-undefined-stack", aggregate_base(with_(3, stack_id=77))
    yield "peak-head-2^32-1-stacks", aggregate_base(with_(4, nstacks=(1 << 32) - 1))
    yield "peak-head-more-stacks-than-follow", aggregate_base(with_(4, nstacks=3))
    yield "peak-undefined-stack", aggregate_base(with_(5, stack_id=77))
    yield "peak-without-head", aggregate_base([r for i, r in enumerate(agent) if i != 4])
    yield "peak-same-stack-twice", aggregate_base(with_(6, stack_id=1))
    yield "live-undefined-stack", aggregate_base(with_(7, stack_id=77))
    yield "alloc-undefined-stack", aggregate_base(with_(9, stack_id=77))
    yield "alloc-unknown-kind", aggregate_base(with_(9, kind=200))
    yield "free-unknown-kind", aggregate_base(with_(10, kind=200))
    yield "stack-0-frames", aggregate_base(with_(1, nframes=0, frames=[]))
    yield "stack-defined-twice", aggregate_base(with_(1, stack_id=1))
    yield "stack-id-no-stack", aggregate_base(with_(1, stack_id=0xFFFFFFFF))
    base_recs = aggregate_base()
    leak_at = next(i for i, (t, _) in enumerate(base_recs) if t == RESULT)
    for what, rows in (("undefined", [[77, 1, 1000]]), ("huge", [[1, (1 << 64) - 1, (1 << 64) - 1]]),
                       ("negative-free", [[1, 1, 1 << 70]])):
        recs = aggregate_base()
        body = json.loads(recs[leak_at][1])
        recs[leak_at] = (RESULT, js({**body, "leaked_by_stack": rows}))
        yield f"leaks-{what}-stack", recs
    yield "sample-top-undefined", aggregate_base(body={**AGG_BODY, "sample": {**AGG_BODY["sample"],
                                                                            "top": [[77, 1 << 64]]}})
    yield "counters-all-2^64-1", aggregate_base(body={**AGG_BODY, "counters": [(1 << 64) - 1] * 72})
    yield "counters-all-2^63", aggregate_base(body={**AGG_BODY, "counters": [1 << 63] * 72})


def random_absurd(seed: int) -> list[tuple[int, bytes]]:
    """Several absurd values at once, chosen by ``seed`` (the same seed, the same capture)."""
    import random

    rng = random.Random(seed)
    agent = _aggregate_records()
    for _ in range(rng.randint(1, 4)):
        rec = rng.choice(agent)
        _, names = AGENT_LAYOUTS[rec["record"]]
        name = rng.choice([n for n in names[1:] if n not in ("nframes", "nvalues")] + ["values", "frames"])
        if name in ("values", "frames"):
            if name in rec:
                rec[name] = [rng.choice(U64_ABSURD) for _ in rec[name]]
        elif name == "mask":
            rec["mask"] = rng.choice([rng.getrandbits(32), rec["mask"] ^ 1 << rng.randrange(32)])
        else:
            rec[name] = rng.choice(U64_ABSURD + (rng.getrandbits(64),))
    recs = aggregate_base(agent)
    for _ in range(rng.randint(0, 3)):
        r = rng.randrange(len(recs))
        rtype, payload = recs[r]
        body, data = _split(rtype, payload)
        spots = list(_numbers(body))
        if spots:
            recs[r] = (rtype, _join(rtype, _set(body, rng.choice(spots), rng.choice(JSON_ABSURD)), data))
    return recs


def write_records(path: Path, recs: list[tuple[int, bytes]], version: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header(version) + b"".join(frame(t, p, version) for t, p in recs))
    return path
