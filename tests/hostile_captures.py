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
