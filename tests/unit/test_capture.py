"""The capture format: round trips, torn tails at every byte, versions, garbage (C agreement: test_layout.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtrace import capture
from memtrace.analyze.malloc import summarize
from memtrace.capture import (
    AllocRecord,
    CaptureError,
    CaptureInfo,
    CaptureWriter,
    FreeRecord,
    RecordType,
    StackRecord,
    decode_agent_records,
    encode_agent_records,
    read_records,
)


def write_sample(path: Path) -> list[tuple[RecordType, object]]:
    batch = encode_agent_records(7, [
        StackRecord(7, 1, (0x1000, 0x2000)),
        AllocRecord(7, 0, capture.FLAG_LIVE, 1, 0xA000, 8192, 8192),
        FreeRecord(7, 3, 0xA000, 0),
    ])
    items: list[tuple[RecordType, object]] = [
        (RecordType.META, {"tracer": "malloc", "target": {"label": "t"}}),
        (RecordType.BATCH, {"t": 1, "counters": [0] * 64}),
        (RecordType.END, {"ended": "completed", "reason": "done"}),
    ]
    with CaptureWriter(path) as w:
        w.write(RecordType.META, items[0][1])
        w.write(RecordType.BATCH, items[1][1], batch)
        w.write(RecordType.END, items[2][1])
    return items


def test_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "c.mtc"
    items = write_sample(p)
    records = list(read_records(p))
    assert [(r.type, r.body) for r in records] == items
    decoded = list(decode_agent_records(records[1].data))
    assert decoded == [StackRecord(7, 1, (0x1000, 0x2000)),
                       AllocRecord(7, 0, capture.FLAG_LIVE, 1, 0xA000, 8192, 8192),
                       FreeRecord(7, 3, 0xA000, 0)]


def test_every_truncation_reads_back_the_complete_prefix(tmp_path: Path) -> None:
    p = tmp_path / "c.mtc"
    write_sample(p)
    blob = p.read_bytes()
    full = list(read_records(p))
    ends = []   # byte offsets where each record ends
    off = capture.HEADER.size
    for _ in full:
        (length,) = struct.unpack_from("<I", blob, off + 4)
        off += capture.RECORD_HEADER.size + length
        ends.append(off)
    for cut in range(capture.HEADER.size, len(blob)):
        torn = tmp_path / f"cut{cut}.mtc"
        torn.write_bytes(blob[:cut])
        info = CaptureInfo(torn)
        got = list(read_records(torn, info))
        complete = sum(1 for e in ends if e <= cut)
        assert len(got) == complete
        assert info.truncated == (cut not in ends and cut != capture.HEADER.size)


def test_newer_version_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    p = tmp_path / "new.mtc"
    p.write_bytes(capture.HEADER.pack(capture.MAGIC, capture.FORMAT_VERSION + 1, 0, 0))
    with pytest.raises(CaptureError, match=r"new\.mtc: capture format version 2 is newer"):
        list(read_records(p))


def test_garbage_and_missing_files(tmp_path: Path) -> None:
    g = tmp_path / "garbage.mtc"
    g.write_bytes(b"hello world, not a capture")
    with pytest.raises(CaptureError, match="garbage.mtc: not a memtrace capture"):
        list(read_records(g))
    with pytest.raises(CaptureError, match="no such capture"):
        list(read_records(tmp_path / "absent.mtc"))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_after_a_valid_header_never_crash(tmp_path_factory: pytest.TempPathFactory, tail: bytes) -> None:
    p = tmp_path_factory.mktemp("fuzz") / "f.mtc"
    p.write_bytes(capture.HEADER.pack(capture.MAGIC, capture.FORMAT_VERSION, 0, 0) + tail)
    info = CaptureInfo(p)
    try:
        for r in read_records(p, info):
            if r.type == RecordType.BATCH:
                list(decode_agent_records(r.data))
    except CaptureError:
        pass


def test_cross_thread_free_before_alloc_pairs_up(tmp_path: Path) -> None:
    """Thread B's free of a block thread A allocated can be drained first; the pair still cancels."""
    p = tmp_path / "c.mtc"
    with CaptureWriter(p) as w:
        data = (encode_agent_records(2, [FreeRecord(2, 3, 0xB000, 0)])
                + encode_agent_records(1, [StackRecord(1, 5, (0x10,)),
                                           AllocRecord(1, 0, capture.FLAG_LIVE, 5, 0xB000, 9000, 9000),
                                           AllocRecord(1, 0, capture.FLAG_LIVE, 5, 0xB000, 9000, 9000),
                                           AllocRecord(1, 0, capture.FLAG_LIVE, 5, 0xC000, 9000, 9000)]))
        w.write(RecordType.BATCH, {"counters": [0] * 64}, data)
        # Next drain: the reuse of 0xC000 proves its first block was freed; that free arrives late.
        w.write(RecordType.BATCH, {"counters": [0] * 64},
                encode_agent_records(1, [AllocRecord(1, 0, capture.FLAG_LIVE, 5, 0xC000, 9000, 9000)])
                + encode_agent_records(2, [FreeRecord(2, 3, 0xC000, 0)]))
    s = summarize(read_records(p))
    assert (s.live_count, s.live_bytes, s.unmatched_frees) == (2, 18000, 0)
    assert s.by_stack[5].count == 4


def test_export_prints_what_was_flushed_and_flags_a_torn_tail(tmp_path: Path) -> None:
    from tests.conftest import run_memtrace

    p = tmp_path / "c.mtc"
    write_sample(p)
    whole = run_memtrace("export", p)
    lines = [json.loads(x) for x in whole.stdout.splitlines()]
    assert [x["record"] for x in lines] == ["meta", "batch", "stack", "alloc", "free", "end"]
    torn = tmp_path / "torn.mtc"
    torn.write_bytes(p.read_bytes()[:-3])
    cut = run_memtrace("export", torn, check=False)
    assert cut.returncode == 1
    assert [json.loads(x)["record"] for x in cut.stdout.splitlines()] == [
        "meta", "batch", "stack", "alloc", "free", "truncated"]
    assert cut.stderr.count("\n") == 1 and "torn.mtc: truncated at byte" in cut.stderr
    empty = tmp_path / "empty.mtc"
    empty.write_bytes(b"")
    bad = run_memtrace("export", empty, check=False)
    assert bad.returncode == 2 and bad.stderr == f"memtrace: error: {empty}: not a memtrace capture (bad magic)\n"
