"""CaptureWriter.observer and frame_records: the records of what a writer appends, decoded as
they are written, are the records a read of the finished file yields (memtrace.fold folds the
tracer command's summary from them) -- grouped drains, large records alone, a failed write."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from memtrace import capture, layout
from memtrace.capture import (
    AggRecord,
    CaptureWriteError,
    CaptureWriter,
    RecordType,
    StackRecord,
    encode_agent_records,
    frame_records,
    read_records,
)


def drain(i: int) -> tuple[dict[str, object], bytes]:
    counters = [0] * layout.N_COUNTERS
    counters[0], counters[16] = 1000 * i, 65536 * i
    body = {"type": "events:batch", "t": 100 * i, "mode": "aggregate", "final": False, "counters": counters,
            "lost": 0, "live": 40 + i, "stacks": 3}
    if i == 0:
        return body, encode_agent_records(0, [StackRecord(0, s, (0x401000 + s, 0x402000)) for s in range(3)])
    return body, encode_agent_records(0, [AggRecord(s, {"allocs": i * 10 + s, "bytes": i * 4096}) for s in range(3)])


def test_observed_records_are_the_read_ones(tmp_path: Path) -> None:
    pieces: list[bytes] = []
    path = tmp_path / "c.mtc"
    with CaptureWriter(path, observer=pieces.append) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        for i in range(40):
            w.write(RecordType.BATCH, *drain(i))
            if i % 7 == 3:
                w.write(RecordType.SYMBOLS, {"rows": [[0x401000 + i, "f", "m", 0]] * (300 if i == 10 else 2)})
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    assert b"".join(pieces) == path.read_bytes()
    read = list(read_records(path))
    folded = list(frame_records(pieces, path))
    assert folded == read
    assert len({r.offset for r in read if r.type == RecordType.BATCH}) < 40, "no group: the test tests too little"


def test_observed_records_after_a_failed_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pieces: list[bytes] = []
    path = tmp_path / "c.mtc"
    w = CaptureWriter(path, observer=pieces.append)
    w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
    w.write(RecordType.BATCH, *drain(0))
    w.write(RecordType.BATCH, *drain(1))       # held for a group
    real = capture._pwrite_all

    def full(fd: int, data: bytes, offset: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(capture, "_pwrite_all", full)
    with pytest.raises(CaptureWriteError):
        w.write(RecordType.CALIBRATION, {"phase": "after"})     # the group goes first, and fails
    w.write(RecordType.SYMBOLS, {"rows": [[0x401000, "f", "m", 0]]})     # held for after the failure
    monkeypatch.setattr(capture, "_pwrite_all", real)
    w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    w.close()
    assert b"".join(pieces) == path.read_bytes()
    read = list(read_records(path))
    assert read[-1].type == RecordType.END and "capture_error" in read[-1].body
    assert list(frame_records(pieces, path)) == read


def test_a_fold_says_what_it_skipped_as_a_read_would(tmp_path: Path) -> None:
    """A record the writer wrote and the reader refuses (a drain whose live count read -1) cost
    the summary its stacks without a word: the fold now keeps the read's CaptureInfo, and the
    tracer command says what was skipped (commands/trace.py)."""
    from memtrace.analyze.malloc import summarize
    from memtrace.capture import CaptureInfo
    from memtrace.fold import SummaryFold

    path = tmp_path / "c.mtc"
    fold = SummaryFold(summarize, path)
    fold.start()
    with CaptureWriter(path, observer=fold.feed) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        body, data = drain(0)
        w.write(RecordType.BATCH, {**body, "live": 2**64 - 1}, data)     # not admitted: as before the fix
        for i in range(1, 5):
            w.write(RecordType.BATCH, *drain(i))
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    assert fold.result() is not None
    info = CaptureInfo(path)
    summarize(read_records(path, info))
    said = fold.damage()
    assert info.n_skipped == 1 and said == info.problem, (said, info.problem)
    assert "live: expected a count below 2^63" in said and "stack id 0 is used but no STACK record" in said
    # A capture read whole says nothing.
    clean = tmp_path / "clean.mtc"
    fold = SummaryFold(summarize, clean)
    fold.start()
    with CaptureWriter(clean, observer=fold.feed) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        for i in range(5):
            w.write(RecordType.BATCH, *drain(i))
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    assert fold.result() is not None and fold.damage() is None
