"""GROUP records (capture format 5): the agent's drains and the snapshots of up to GROUP_S seconds
in one zstd frame -- a smaller capture, the same records, and a flipped byte still costs one record."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from memtrace import capture, layout
from memtrace.capture import (
    RECORD_HEADER,
    AggRecord,
    CaptureInfo,
    CaptureWriter,
    RecordType,
    StackRecord,
    decode_agent_records,
    encode_agent_records,
    encode_record,
    header_bytes,
    read_records,
)

pytestmark = pytest.mark.skipif(capture._zstd is None or not capture.BATCH_ZLIB_ON,
                                reason="grouping needs zstd and compression on")

DRAINS = 30


def drain(i: int) -> tuple[dict[str, object], bytes]:
    """A quiet drain as the agent sends ten a second: running counters and a few stacks' totals."""
    counters = [0] * layout.N_COUNTERS
    counters[0], counters[16] = 1000 * i, 65536 * i
    body = {"type": "events:batch", "t": 100 * i, "mode": "aggregate", "final": False, "counters": counters,
            "lost": 0, "live": 40 + i, "stacks": 3}
    if i == 0:      # the first drain defines the stacks
        return body, encode_agent_records(0, [StackRecord(0, s, (0x401000 + s, 0x402000)) for s in range(3)])
    return body, encode_agent_records(0, [AggRecord(s, {"allocs": i * 10 + s, "bytes": i * 4096}) for s in range(3)])


def write(path: Path) -> list[tuple[dict[str, object], bytes]]:
    drains = [drain(i) for i in range(DRAINS)]
    with CaptureWriter(path) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        for body, data in drains:
            w.write(RecordType.BATCH, body, data)
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    return drains


def frames(path: Path) -> list[tuple[int, int, int]]:
    """(offset, type, payload length) of each record in the file, read by hand."""
    b, at, out = path.read_bytes(), capture.HEADER.size, []
    while at < len(b):
        rtype, _, _, length, _ = RECORD_HEADER.unpack_from(b, at)
        out.append((at, rtype, length))
        at += RECORD_HEADER.size + length
    return out


def test_drains_are_grouped_and_read_back_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    drains = write(p)
    info = CaptureInfo(p)
    batches = [r for r in read_records(p, info) if r.type == RecordType.BATCH]
    assert info.problem is None and info.version == capture.FORMAT_VERSION == 5
    assert [(r.body, bytes(r.data)) for r in batches] == drains
    assert list(decode_agent_records(batches[7].data)) == [AggRecord(s, {"allocs": 70 + s, "bytes": 7 * 4096}) for s in range(3)]
    # The first drain alone (written at once: its stack definitions), the other 29 in one record.
    kinds = [rtype for _, rtype, _ in frames(p)]
    assert kinds == [RecordType.META, RecordType.BATCH, RecordType.GROUP, RecordType.END]
    grouped = frames(p)[2]
    # Each drain alone (format 4) takes several times the room.
    alone = sum(len(encode_record(RecordType.BATCH, body, data)) for body, data in drains[1:])
    assert RECORD_HEADER.size + grouped[2] < alone / 4


def test_a_group_spans_at_most_group_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "GROUP_S", 0.0)       # every drain is its group's last: none held
    p = tmp_path / "c.mtc"
    drains = write(p)
    assert [rtype for _, rtype, _ in frames(p)].count(RecordType.BATCH) == DRAINS
    assert [(r.body, bytes(r.data)) for r in read_records(p) if r.type == RecordType.BATCH] == drains


def test_held_records_keep_their_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    with CaptureWriter(p) as w:
        for i in range(3):
            w.write(RecordType.BATCH, *drain(i))
        w.write(RecordType.SNAPSHOT, {"t": 250})                 # grouped with the drains
        w.write(RecordType.SYMBOLS, {"rows": []})                # written at once, ahead of them
        w.write(RecordType.BATCH, *drain(3))
        w.write(RecordType.WARNING, {"message": "w", "t": 350})  # after what is held
        w.write(RecordType.BATCH, *drain(4))
        w.write(RecordType.BATCH, *drain(5))
    # No END: close() still writes what it held.
    assert [(r.type, r.body.get("t")) for r in read_records(p)] == [
        (RecordType.BATCH, 0), (RecordType.SYMBOLS, None), (RecordType.BATCH, 100), (RecordType.BATCH, 200),
        (RecordType.SNAPSHOT, 250), (RecordType.BATCH, 300), (RecordType.WARNING, 350), (RecordType.BATCH, 400),
        (RecordType.BATCH, 500)]
    assert [rtype for _, rtype, _ in frames(p)] == [RecordType.BATCH, RecordType.SYMBOLS, RecordType.GROUP,
                                                    RecordType.WARNING, RecordType.GROUP]


def test_a_flipped_byte_in_a_group_costs_that_record_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    write(p)
    grouped = frames(p)[2]
    b = bytearray(p.read_bytes())
    b[grouped[0] + RECORD_HEADER.size + grouped[2] // 2] ^= 0x10
    p.write_bytes(bytes(b))
    info = CaptureInfo(p)
    records = list(read_records(p, info))
    assert [r.type for r in records] == [RecordType.META, RecordType.BATCH, RecordType.END]
    assert info.n_skipped == 1 and info.skipped == [f"byte {grouped[0]}: GROUP record: checksum mismatch"]


def sub(rtype: int, payload: bytes) -> bytes:
    return capture.RECORD_HEADER_V1.pack(rtype, 0, 0, len(payload)) + payload


@pytest.mark.parametrize("inside", [
    b"",                                                                    # one record only
    sub(RecordType.SNAPSHOT, b"{}")[:-1],                                   # a length past the frame's end
    sub(RecordType.BATCH, struct.pack("<I", 2 | capture.BATCH_ZSTD) + b"{}"),   # a BATCH compressed again
    sub(RecordType.END, b"{}"),                                             # a type no group holds
    sub(RecordType.GROUP, b"{}"),                                           # a group in a group
])
def test_a_malformed_group_is_skipped_and_said(tmp_path: Path, inside: bytes) -> None:
    import zlib

    body, data = drain(1)
    blob = capture._dumps(body)
    assert capture._zstd is not None
    payload = capture._zstd.compress(sub(RecordType.BATCH, struct.pack("<I", len(blob)) + blob + data) + inside)
    head = capture.RECORD_HEADER_V1.pack(int(RecordType.GROUP), 0, capture._head_check(int(RecordType.GROUP),
                                                                                     len(payload)), len(payload))
    record = head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload
    p = tmp_path / "c.mtc"
    p.write_bytes(header_bytes() + encode_record(RecordType.META, {"tracer": "malloc"}) + record
                  + encode_record(RecordType.END, {"ended": "completed", "reason": "done"}))
    info = CaptureInfo(p)
    assert [r.type for r in read_records(p, info)] == [RecordType.META, RecordType.END]
    assert info.n_skipped == 1 and "GROUP record" in info.skipped[0], info.skipped


def test_a_format_4_capture_still_reads(tmp_path: Path) -> None:
    p = tmp_path / "c.mtc"
    drains = [drain(i) for i in range(3)]
    p.write_bytes(header_bytes(4) + b"".join(encode_record(RecordType.BATCH, body, data, version=4)
                                             for body, data in drains))
    info = CaptureInfo(p)
    assert [(r.body, bytes(r.data)) for r in read_records(p, info)] == drains and info.version == 4
