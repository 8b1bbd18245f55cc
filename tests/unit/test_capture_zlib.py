"""BATCH agent records stored zlib-compressed (capture format 3): smaller captures, the same records."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from memtrace import capture, layout
from memtrace.capture import (
    CaptureInfo,
    CaptureWriter,
    RecordType,
    StackRecord,
    decode_agent_records,
    encode_agent_records,
    read_records,
)


def stacks(n: int) -> bytes:
    """n STACK records of 64 return addresses each, as a complete capture ships them."""
    return encode_agent_records(0, [StackRecord(0, i, tuple(0x7F00_0000_0000 + 0x40 * ((i + k) % 500)
                                                            for k in range(64))) for i in range(n)])


def write(path: Path, data: bytes) -> None:
    with CaptureWriter(path) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        w.write(RecordType.BATCH, {"t": 1, "counters": [0] * layout.N_COUNTERS}, data)
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})


def test_a_large_batch_is_stored_compressed_and_reads_back_the_same(tmp_path: Path) -> None:
    data = stacks(2000)
    p = tmp_path / "c.mtc"
    write(p, data)
    assert p.stat().st_size < len(data) / 4
    info = CaptureInfo(p)
    (batch,) = [r for r in read_records(p, info) if r.type == RecordType.BATCH]
    assert info.problem is None and info.version == capture.FORMAT_VERSION == 3
    assert batch.data == data
    assert len([r for r in decode_agent_records(batch.data) if isinstance(r, StackRecord)]) == 2000


def test_a_small_batch_is_stored_as_it_is(tmp_path: Path) -> None:
    data = encode_agent_records(0, [StackRecord(0, 1, (0x1000, 0x2000))])
    assert len(data) < capture.BATCH_ZLIB_MIN
    p = tmp_path / "c.mtc"
    write(p, data)
    assert data in p.read_bytes()


def batch_record(payload_data: bytes, flagged: bool) -> bytes:
    blob = b'{"t":1}'
    payload = struct.pack("<I", len(blob) | (capture.BATCH_ZLIB if flagged else 0)) + blob + payload_data
    head = capture.RECORD_HEADER_V1.pack(int(RecordType.BATCH), 0,
                                         zlib.crc32(struct.pack("<BBI", int(RecordType.BATCH), 0, len(payload))) & 0xFFFF,
                                         len(payload))
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


@pytest.mark.parametrize("what, data, why", [
    ("garbage", b"not zlib data at all", "bad zlib data"),
    ("cut short", zlib.compress(stacks(100))[:-40], "cut short"),
])
def test_bad_compressed_agent_records_are_damage_not_numbers(tmp_path: Path, what: str, data: bytes,
                                                             why: str) -> None:
    p = tmp_path / "c.mtc"
    p.write_bytes(capture.header_bytes() + batch_record(data, True))
    info = CaptureInfo(p)
    assert list(read_records(p, info)) == []
    assert info.problem is not None and why in info.problem, (what, info.problem)


def test_a_compressed_batch_cannot_claim_unbounded_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "BATCH_MAX_BYTES", 1 << 20)
    p = tmp_path / "c.mtc"
    p.write_bytes(capture.header_bytes() + batch_record(zlib.compress(bytes(4 << 20)), True))
    info = CaptureInfo(p)
    assert list(read_records(p, info)) == []
    assert info.problem is not None and "inflates past" in info.problem
