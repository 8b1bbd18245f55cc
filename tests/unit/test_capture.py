"""The capture format: round trips, torn tails at every byte, versions, garbage (C agreement: test_layout.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtrace import capture, layout
from memtrace.analyze.malloc import summarize
from memtrace.capture import (
    NO_END,
    AllocRecord,
    CaptureError,
    CaptureInfo,
    CaptureWriteError,
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
        (RecordType.BATCH, {"t": 1, "counters": [0] * layout.N_COUNTERS}),
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


def test_counters_of_an_older_capture_read_as_zero_past_its_end(tmp_path: Path) -> None:
    """Captures from before the counters grew hold MIN_COUNTERS of them: the rest read as 0."""
    p = tmp_path / "old.mtc"
    with CaptureWriter(p) as w:
        w.write(RecordType.BATCH, {"counters": list(range(1, layout.MIN_COUNTERS + 1))})
    (batch,) = read_records(p)
    assert batch.body["counters"] == [*range(1, layout.MIN_COUNTERS + 1), *[0] * (layout.N_COUNTERS - layout.MIN_COUNTERS)]
    short = tmp_path / "short.mtc"
    with CaptureWriter(short) as w:
        w.write(RecordType.BATCH, {"counters": [0] * (layout.MIN_COUNTERS - 1)})
    info = capture.CaptureInfo(short)
    assert list(read_records(short, info)) == [] and "BATCH record" in (info.problem or "")


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
    p.write_bytes(capture.header_bytes(capture.FORMAT_VERSION + 1))
    v = capture.FORMAT_VERSION
    with pytest.raises(CaptureError, match=rf"new\.mtc: capture format version {v + 1} is newer than this memtrace "
                                           rf"reads \(up to {v}\); upgrade memtrace$"):
        list(read_records(p))
    # The same version field with a header checksum that does not hold is damage, not a newer format.
    damaged = tmp_path / "damaged.mtc"
    damaged.write_bytes(capture.HEADER.pack(capture.MAGIC, 3, 0, 0))
    with pytest.raises(CaptureError, match=r"damaged\.mtc: corrupt header \(checksum mismatch; format version "
                                           r"field reads 3\)"):
        list(read_records(damaged))


def test_version_1_captures_still_read_in_full() -> None:
    """The captures memtrace 0.1 wrote (no checksums) read record for record, END included."""
    root = Path(__file__).resolve().parents[2]
    folders = sorted((root / "tests/data/captures-v1").glob("*/")) + sorted((root / "tests/data/report/captures").glob("*/"))
    assert len(folders) == 15
    for folder in folders:
        info = CaptureInfo(folder)
        records = list(read_records(folder, info))
        assert info.version == 1
        if folder.name == "delta-truncated":
            assert info.truncated and not info.corrupt and info.problem.startswith("truncated at byte 58171")
            continue
        assert info.problem is None and info.ended and records[-1].type == RecordType.END
        assert records[0].type == RecordType.META and len(records) == info.records


def test_version_1_without_checksums_and_records_of_unknown_types(tmp_path: Path) -> None:
    from tests.hostile_captures import META, frame, header

    v1 = tmp_path / "v1.mtc"
    v1.write_bytes(header(1) + frame(META, b'{"tracer":"malloc"}', 1) + frame(40, b"{}", 1))
    info = CaptureInfo(v1)
    assert [r.type for r in read_records(v1, info)] == [RecordType.META]
    # Version 1 writers wrote types 1 to 11 only: anything else is damage.
    assert info.corrupt and info.skipped == ["byte 43: unknown record type 40"]
    v2 = tmp_path / "v2.mtc"
    v2.write_bytes(header(2) + frame(META, b'{"tracer":"malloc"}') + frame(40, b"{}") + frame(40, b"{}"))
    info = CaptureInfo(v2)
    assert [r.type for r in read_records(v2, info)] == [RecordType.META]
    # In version 2 the checksum holds, so it is a newer writer's record: skipped, counted, said.
    assert not info.truncated and info.unknown == {40: 2}
    assert info.problem == f"{NO_END}; records of a type this memtrace does not know were skipped (2 of type 40): " \
                           "upgrade memtrace"


def test_every_record_type_has_a_shape() -> None:
    assert set(capture.RECORD_SCHEMAS) == set(RecordType) - {RecordType.GROUP}     # a container, never read as one


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
    p.write_bytes(capture.header_bytes() + tail)
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
    assert s.stack_stats[5].count == 4


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


def test_export_of_a_capture_without_end_exits_1(tmp_path: Path) -> None:
    from tests.conftest import run_memtrace

    p = tmp_path / "noend.mtc"
    with CaptureWriter(p) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        w.write(RecordType.BATCH, {"counters": [0] * 64})
    r = run_memtrace("export", p, check=False)
    assert r.returncode == 1
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["record"] for x in lines] == ["meta", "batch", "truncated"]
    assert lines[-1]["detail"] == NO_END
    assert r.stderr == f"memtrace: warning: {p}: {NO_END}\n"


def test_a_flipped_byte_is_reported_with_file_and_offset(tmp_path: Path) -> None:
    from tests.conftest import run_memtrace

    p = tmp_path / "c.mtc"
    write_sample(p)
    blob = bytearray(p.read_bytes())
    meta_end = capture.HEADER.size + capture.RECORD_HEADER.size + struct.unpack_from("<I", blob, 20)[0]
    blob[meta_end + 40] ^= 0x04          # inside the BATCH record's agent data
    p.write_bytes(blob)
    r = run_memtrace("export", p, check=False)
    assert r.returncode == 1
    # The damaged record is skipped and named; the records after it are read (issue 20.8).
    assert [json.loads(x)["record"] for x in r.stdout.splitlines()] == ["meta", "end", "truncated"]
    assert r.stderr == (f"memtrace: warning: {p}: corrupt at byte {meta_end}: BATCH record: checksum mismatch; "
                        f"skipped (the rest was read)\n")


def test_export_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    import os

    from tests.conftest import run_memtrace

    fifo = tmp_path / "pipe.mtc"
    os.mkfifo(fifo)
    r = run_memtrace("export", fifo, check=False, timeout=30)     # a blocking open would time out
    assert r.returncode == 2
    assert r.stderr == (f"memtrace: error: {fifo}: not a regular file (a capture is a file, not a FIFO, "
                        f"device or socket)\n")


def test_a_huge_record_length_is_refused_without_reading_it(tmp_path: Path) -> None:
    """A record claiming 1 GiB (in a sparse 1 GiB file, so the bytes are really there) is refused
    from its header: reading never holds more than a few megabytes."""
    import tracemalloc

    from tests.hostile_captures import META, frame, header, record_head

    p = tmp_path / "huge.mtc"
    with open(p, "wb") as f:
        f.write(header() + frame(META, b'{"tracer":"malloc"}'))
        f.write(record_head(RecordType.WARNING, 1 << 30))
        f.truncate(1 << 31)
    info = CaptureInfo(p)
    tracemalloc.start()
    try:
        records = list(read_records(p, info))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r.type for r in records] == [RecordType.META]
    assert info.corrupt and info.truncation == (
        f"corrupt at byte 47: record length {1 << 30} is larger than any memtrace writes ({capture.MAX_RECORD})")
    assert peak < 1 << 20
    # Within the bound but longer than the file: cut short, still without reading it.
    p.write_bytes(header() + frame(META, b'{"tracer":"malloc"}')
                  + record_head(RecordType.WARNING, capture.MAX_RECORD) + b"{}")
    info = CaptureInfo(p)
    tracemalloc.start()
    try:
        list(read_records(p, info))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.truncation == f"truncated at byte 47: record cut short (2 of {capture.MAX_RECORD} bytes)"
    assert peak < 1 << 20


def test_the_writer_writes_no_nan_and_frames_appended_records_by_the_file_version(tmp_path: Path) -> None:
    from tests.hostile_captures import META, frame, header

    from memtrace.capture import append_record

    p = tmp_path / "c.mtc"
    with CaptureWriter(p) as w:
        w.write(RecordType.META, {"tracer": "malloc", "options": {"window": float("nan")}})
        w.write(RecordType.END, {"ended": "completed", "reason": "x", "rate": float("inf")})
    append_record(p, RecordType.END, {"ended": "perpetual-stream", "reason": "y"})
    info = CaptureInfo(p)
    records = list(read_records(p, info))
    assert info.problem is None
    assert records[0].body["options"] == {"window": None}
    assert [r.body["ended"] for r in records[1:]] == ["completed", "perpetual-stream"]
    old = tmp_path / "old.mtc"
    old.write_bytes(header(1) + frame(META, b'{"tracer":"malloc"}', 1))
    append_record(old, RecordType.END, {"ended": "perpetual-stream", "reason": "y"})
    info = CaptureInfo(old)
    assert [r.type for r in read_records(old, info)] == [RecordType.META, RecordType.END]
    assert info.version == 1 and info.problem is None


def test_the_writer_leaves_no_reserve_behind(tmp_path: Path) -> None:
    p = tmp_path / "c.mtc"
    w = CaptureWriter(p)
    reserve = tmp_path / ".c.mtc.reserve"
    assert reserve.stat().st_size == capture.END_RESERVE and reserve.stat().st_blocks * 512 >= capture.END_RESERVE
    w.write(RecordType.META, {"tracer": "malloc"})
    w.write(RecordType.END, {"ended": "completed", "reason": "x"})
    assert not reserve.exists()         # freed for the END record
    w.close()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["c.mtc"]


def test_replace_records_keeps_every_other_byte_in_either_version(tmp_path: Path) -> None:
    """The SYMBOLS table rewritten in place (memtrace symbolize): framed for the file's own version,
    everything else byte for byte, a newer writer's record and a torn tail included."""
    from tests.hostile_captures import MODULES, SYMBOLS, WARNING, frame, header, js

    from memtrace.capture import replace_records

    for version in (1, 2):
        p = tmp_path / f"v{version}.mtc"
        kept = [frame(1, js({"tracer": "malloc"}), version), frame(MODULES, js({"modules": []}), version)]
        old = frame(SYMBOLS, js({"rows": [["0x10", "app", 16, "old", None, None]]}), version)
        later = [frame(WARNING, js({"message": "between"}), version), frame(10, js({"ended": "completed",
                                                                                   "reason": "x"}), version)]
        newer = frame(200, b"new", 2) if version == 2 else b""
        torn = frame(9, js({"t": 1}), version)[:-3]
        p.write_bytes(header(version) + b"".join(kept) + old + b"".join(later) + old + newer + torn)
        replace_records(p, RecordType.SYMBOLS, [{"rows": [["0x10", "app", 16, "f", "/a.c", 3]], "by": "test"}])
        fresh = frame(SYMBOLS, js({"rows": [["0x10", "app", 16, "f", "/a.c", 3]], "by": "test"}).replace(b" ", b""),
                      version)
        assert p.read_bytes() == header(version) + b"".join(kept) + fresh + b"".join(later) + newer + torn
        info = CaptureInfo(p)
        assert [r.type for r in read_records(p, info)] == [RecordType.META, RecordType.MODULES, RecordType.SYMBOLS,
                                                            RecordType.WARNING, RecordType.END]
        assert info.truncated and not info.corrupt
        assert sorted(x.name for x in tmp_path.iterdir() if x.name.startswith(".")) == []
    with pytest.raises(ValueError, match="BATCH"):
        replace_records(p, RecordType.BATCH, [])
    with pytest.raises(CaptureError, match="no such capture"):
        replace_records(tmp_path / "none.mtc", RecordType.SYMBOLS, [])


def _batch_naming_stack(path: Path, defined: bool) -> None:
    """A BATCH whose JSON sample names stack 5 among its top stacks; its agent records define it
    (or, `defined` False, use it without defining it)."""
    records = [StackRecord(1, 5, (0x10,))] if defined else []
    records.append(AllocRecord(1, 0, capture.FLAG_LIVE, 5, 0xB000, 9000, 9000))
    with CaptureWriter(path) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        w.write(RecordType.BATCH, {"t": 1, "counters": [0] * layout.N_COUNTERS, "sample": {"top": [[5, 9000]]}},
                encode_agent_records(1, records))
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})


def test_a_stack_the_batch_json_names_is_checked_against_its_agent_records(tmp_path: Path) -> None:
    """The sample's top stacks are defined by the same BATCH's agent records: a read that decodes
    them finds the definition (no problem); one that never decodes them (a quick look at the
    records) cannot tell, and says nothing -- it once called every capture's stack 0 undefined.
    An id the decoded records use and nothing defines is still said, by its BATCH's byte."""
    for defined in (True, False):
        p = tmp_path / f"c{defined}.mtc"
        _batch_naming_stack(p, defined)
        glance = CaptureInfo(p)
        assert len(list(read_records(p, glance))) == 3 and glance.problem is None
        info = CaptureInfo(p)
        for r in read_records(p, info):
            if r.type == RecordType.BATCH:
                list(decode_agent_records(r.data))
        if defined:
            assert info.problem is None
        else:
            assert info.undefined_stacks() == [5]
            assert info.problem is not None and "stack id 5 is used but no STACK record defines it" in info.problem


def _full_once(failed: list[int]):  # noqa: ANN202
    """A _pwrite_all whose first write finds the disk full (its offset noted in ``failed``)."""
    import errno

    real = capture._pwrite_all

    def full_once(fd: int, data: bytes, offset: int) -> None:
        if not failed:
            failed.append(offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data, offset)
    return full_once


def test_a_failed_write_of_the_drains_held_before_the_end_is_raised(tmp_path: Path, monkeypatch) -> None:
    """The drains held for a group are written right before the END: when that write is the one
    that fails (disk full), the END still goes into the space held back for it and says so -- and
    the write raises, as any failed write does, so the run does not end as if it had succeeded."""
    p = tmp_path / "c.mtc"
    failed: list[int] = []
    full_once = _full_once(failed)
    w = CaptureWriter(p)
    w.write(RecordType.BATCH, {"t": 1, "counters": [0] * layout.N_COUNTERS})
    w.write(RecordType.BATCH, {"t": 2, "counters": [0] * layout.N_COUNTERS})     # held for a group
    monkeypatch.setattr(capture, "_pwrite_all", full_once)
    with pytest.raises(capture.CaptureWriteError, match="No space left on device"):
        w.write(RecordType.END, {"t": 3, "ended": "completed", "reason": "window ended"})
    w.close()
    assert failed, "the held drains were not written before the END"
    end = [r.body for r in read_records(p) if r.type == RecordType.END]
    assert len(end) == 1 and end[0]["ended"] == "write-failed", end
    assert end[0]["capture_error"]["lost_records"] >= 1, end


def test_a_capture_appears_with_its_header_whole_and_never_over_another(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is linked in place once its header is written: a folder watched while a capture
    starts holds no capture or a readable one, never an empty file; and an existing capture is
    refused, not overwritten, with nothing left behind."""
    path = tmp_path / "capture.mtc"
    seen: list[bool] = []
    set_aside = capture._set_aside

    def look_then_set_aside(reserve: Path, size: int) -> None:     # runs before the header is written
        seen.append(path.exists())
        set_aside(reserve, size)

    monkeypatch.setattr(capture, "_set_aside", look_then_set_aside)
    writer = CaptureWriter(path)
    assert seen == [False], "the capture was visible before its header was written"
    assert path.read_bytes() == capture.header_bytes()
    writer._release_reserve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture.mtc"]
    writer.write(RecordType.META, {"tracer": "malloc"})
    writer.close()
    before = path.read_bytes()
    with pytest.raises(CaptureWriteError, match="cannot start the capture: File exists"):
        CaptureWriter(path, reserve=0)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture.mtc"]


def _written(p: Path) -> list[tuple[RecordType, object, bytes]]:
    return [(r.type, r.body, r.data) for r in read_records(p)]


def _some_records() -> list[tuple[RecordType, dict, bytes]]:
    stack = encode_agent_records(0, [StackRecord(0, 1, (0x401000, 0x402000))])
    return [(RecordType.MODULES, {"modules": [{"name": "a", "base": "0x400000", "size": 4096}]}, b""),
            *((RecordType.BATCH, {"t": t, "counters": [t] * layout.N_COUNTERS}, stack if t == 1 else b"")
              for t in range(1, 6)),
            (RecordType.SYMBOLS, {"rows": [["0x401000", "a", 0, "f", None, None]], "by": "host"}, b"")]


def test_a_held_capture_is_written_at_release_as_it_would_have_been(tmp_path: Path) -> None:
    """CaptureWriter.hold (a short local target's quiet start): nothing but the header is written
    until release, and then the same records, in the same order, as a writer that never held."""
    plain, held = tmp_path / "plain.mtc", tmp_path / "held.mtc"
    with CaptureWriter(plain) as w:
        for rec in _some_records():
            w.write(*rec)
        w.write(RecordType.END, {"ended": "completed", "reason": "window ended"})
    w = CaptureWriter(held)
    w.hold()
    assert w.holding
    for rec in _some_records():
        w.write(*rec)
    assert held.read_bytes() == capture.header_bytes()        # all of it held
    w.release()
    assert not w.holding
    w.write(RecordType.END, {"ended": "completed", "reason": "window ended"})
    w.close()
    assert _written(held) == _written(plain) and len(_written(plain)) == 8


def test_an_end_or_a_close_writes_what_was_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ended, closed, full = tmp_path / "ended.mtc", tmp_path / "closed.mtc", tmp_path / "full.mtc"
    w = CaptureWriter(ended)
    w.hold()
    for rec in _some_records():
        w.write(*rec)
    w.write(RecordType.END, {"ended": "completed", "reason": "window ended"})
    w.close()
    assert [t for t, _, _ in _written(ended)] == [t for t, _, _ in _some_records()] + [RecordType.END]
    w = CaptureWriter(closed)
    w.hold()
    for rec in _some_records():
        w.write(*rec)
    w.close()                       # (memtrace failing with no END: what it held is not lost)
    assert [t for t, _, _ in _written(closed)] == [t for t, _, _ in _some_records()]
    # Past HOLD_MAX bytes held, the writer writes them and holds no more.
    monkeypatch.setattr(capture, "HOLD_MAX", 8)
    w = CaptureWriter(full)
    w.hold()
    for rec in _some_records():
        w.write(*rec)
    assert not w.holding and full.stat().st_size > len(capture.header_bytes())
    w.close()
    assert [t for t, _, _ in _written(full)] == [t for t, _, _ in _some_records()]


def test_a_failed_write_of_what_was_held_ends_the_capture_there(tmp_path: Path, monkeypatch) -> None:
    """The disk fills while the held records are written at the END: the END still goes into the
    space set aside for it, says so, and the write raises as any failed write does."""
    p = tmp_path / "c.mtc"
    failed: list[int] = []
    full_once = _full_once(failed)
    w = CaptureWriter(p)
    w.hold()
    for rec in _some_records():
        w.write(*rec)
    monkeypatch.setattr(capture, "_pwrite_all", full_once)
    with pytest.raises(capture.CaptureWriteError, match="No space left on device"):
        w.write(RecordType.END, {"t": 3, "ended": "completed", "reason": "window ended"})
    w.close()
    assert failed
    end = [r.body for r in read_records(p) if r.type == RecordType.END]
    assert len(end) == 1 and end[0]["ended"] == "write-failed" and end[0]["capture_error"]["lost_records"] >= 1, end


def test_held_deferred_data_is_made_once_in_order_as_it_is_written(tmp_path: Path) -> None:
    """A BATCH's agent records handed over as DeferredBytes (the capture loop's stacks made whole
    only when written): not made while held, made once each in the order written, and written."""
    made: list[int] = []

    def maker(t: int):  # noqa: ANN202
        def make() -> bytes:
            made.append(t)
            return encode_agent_records(0, [StackRecord(0, t, (0x401000 + t, 0x402000))])
        return make

    p = tmp_path / "c.mtc"
    w = CaptureWriter(p)
    w.hold()
    deferred = [capture.DeferredBytes(maker(t), 24) for t in range(1, 5)]
    for t, d in enumerate(deferred, 1):
        w.write(RecordType.BATCH, {"t": t, "counters": [t] * layout.N_COUNTERS}, d)
    assert made == [] and len(deferred[0]) == 24
    assert bytes(deferred[0]) == bytes(deferred[0]) and made == [1]     # made once, by whoever asks first
    w.release()
    assert made == [1, 2, 3, 4]
    w.close()
    stacks = [s.stack_id for r in read_records(p) if r.type == RecordType.BATCH for s in decode_agent_records(r.data)]
    assert stacks == [1, 2, 3, 4]


def test_a_hold_is_bounded_by_its_bodies_and_by_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A JSON tracer's records have no agent bytes: their events count against HOLD_MAX too; and a
    hold the capture loop never ends (a source too busy to let it look) ends after HOLD_S."""
    monkeypatch.setattr(capture, "HOLD_MAX", 5000)
    w = CaptureWriter(tmp_path / "events.mtc")
    w.hold()
    events = [{"type": "fd:open", "t": i, "fd": i} for i in range(20)]
    w.write(RecordType.EVENTS, {"type": "events:json", "t": 1, "events": events})
    assert w.holding                                         # ~2,256 bytes: held
    w.write(RecordType.EVENTS, {"type": "events:json", "t": 2, "events": events})
    w.write(RecordType.EVENTS, {"type": "events:json", "t": 3, "events": events})
    assert not w.holding                                     # past 5,000: written
    w.close()
    assert [r.body["t"] for r in read_records(tmp_path / "events.mtc")] == [1, 2, 3]
    monkeypatch.setattr(capture, "HOLD_S", 0.0)
    w = CaptureWriter(tmp_path / "timed.mtc")
    w.hold()
    w.write(RecordType.EVENTS, {"type": "events:json", "t": 1, "events": []})
    assert not w.holding
    w.close()
