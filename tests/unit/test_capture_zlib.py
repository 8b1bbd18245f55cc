"""BATCH agent records stored compressed: zlib (capture format 3, still read) and zstd (format 4,
written, with large JSON records too): smaller captures, the same records."""

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
    encode_record,
    header_bytes,
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
    assert info.problem is None and info.version == capture.FORMAT_VERSION == 8
    assert batch.data == data
    assert len([r for r in decode_agent_records(batch.data) if isinstance(r, StackRecord)]) == 2000


def test_a_small_batch_is_stored_as_it_is(tmp_path: Path) -> None:
    data = encode_agent_records(0, [StackRecord(0, 1, (0x1000, 0x2000))])
    assert len(data) < capture.BATCH_ZLIB_MIN
    p = tmp_path / "c.mtc"
    write(p, data)
    assert data in p.read_bytes()


def batch_record(payload_data: bytes, flagged: bool, flag: int = capture.BATCH_ZLIB, frame: bytes | None = None) -> bytes:
    """A BATCH record, framed by hand: its agent records (zlib data when flagged), or -- ``frame``,
    with BATCH_ZSTD -- what follows the length is that (supposed) zstd frame of JSON and records."""
    blob = b'{"t":1}'
    if frame is not None:
        payload = struct.pack("<I", len(blob) | flag) + frame
    else:
        payload = struct.pack("<I", len(blob) | (flag if flagged else 0)) + blob + payload_data
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


def zstd_module():  # noqa: ANN201 -- compression.zstd or its backport
    z = capture._zstd
    if z is None:
        pytest.skip("no zstd module (backports.zstd) installed")
    return z


def test_format_4_stores_a_batch_as_one_zstd_frame(tmp_path: Path) -> None:
    zstd_module()
    data = stacks(2000)
    p = tmp_path / "c.mtc"
    write(p, data)
    raw = p.read_bytes()
    frame = capture.encode_record(RecordType.BATCH, {"t": 1, "counters": [0] * layout.N_COUNTERS}, data)
    (n,) = struct.unpack_from("<I", frame, capture.RECORD_HEADER.size)
    assert n & capture.BATCH_ZSTD and not n & capture.BATCH_ZLIB
    assert b"counters" not in frame                  # the JSON is inside the frame too
    assert len(raw) < len(zlib.compress(data, capture.BATCH_ZLIB_LEVEL)) + 400
    (batch,) = [r for r in read_records(p) if r.type == RecordType.BATCH]
    assert batch.data == data


def test_version_3_captures_with_zlib_still_read(tmp_path: Path) -> None:
    data = stacks(500)
    body = {"t": 1, "counters": [0] * layout.N_COUNTERS}
    p = tmp_path / "v3.mtc"
    p.write_bytes(capture.header_bytes(3) + capture.encode_record(RecordType.BATCH, body, data, version=3)
                  + capture.encode_record(RecordType.END, {"ended": "completed", "reason": "done"}, version=3))
    (n,) = struct.unpack_from("<I", p.read_bytes(), 16 + capture.RECORD_HEADER.size)
    assert n & capture.BATCH_ZLIB
    info = CaptureInfo(p)
    (batch, _) = list(read_records(p, info))
    assert info.version == 3 and info.problem is None and batch.data == data


def test_a_version_3_capture_with_the_zstd_bit_is_not_read_as_zstd(tmp_path: Path) -> None:
    """Bit 30 means nothing before version 4: there it is part of a (damaged) JSON length."""
    zstd = zstd_module()
    p = tmp_path / "v3.mtc"
    p.write_bytes(capture.header_bytes(3) + batch_record(b"", True, capture.BATCH_ZSTD,
                                                         zstd.compress(b'{"t":1}' + stacks(10))))
    info = CaptureInfo(p)
    assert list(read_records(p, info)) == []
    assert info.problem is not None and "overruns its record" in info.problem


def test_a_large_json_record_is_a_zstd_frame_and_reads_back(tmp_path: Path) -> None:
    zstd_module()
    rows = [[hex(0x7F0000000000 + i), "libfoo.so", i, f"function_{i}", "/src/foo.c", i, None] for i in range(2000)]
    small = [rows[0]]
    p = tmp_path / "c.mtc"
    with CaptureWriter(p) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        w.write(RecordType.SYMBOLS, {"rows": rows, "by": "host"})
        w.write(RecordType.SYMBOLS, {"rows": small, "by": "host"})
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    raw = p.read_bytes()
    assert raw.count(capture.ZSTD_MAGIC) == 1 and b"function_1999" not in raw
    assert b'"function_0"' in raw                          # the small one stays plain JSON
    info = CaptureInfo(p)
    got = [r.body["rows"] for r in read_records(p, info) if r.type == RecordType.SYMBOLS]
    assert info.problem is None and got == [rows, small]


@pytest.mark.parametrize("what, mangle, why", [
    ("garbage", lambda f: capture.ZSTD_MAGIC + b"not a zstd frame at all", "bad zstd data"),
    ("cut short", lambda f: f[:-20], "cut short"),
    ("trailing bytes", lambda f: f + b"xx", "after its zstd frame"),
])
def test_bad_zstd_records_are_damage_not_numbers(tmp_path: Path, what: str, mangle, why: str) -> None:  # noqa: ANN001
    zstd = zstd_module()
    frame = mangle(zstd.compress(b'{"t":1}' + stacks(100)))
    p = tmp_path / "c.mtc"
    p.write_bytes(capture.header_bytes() + batch_record(b"", True, capture.BATCH_ZSTD, frame))
    info = CaptureInfo(p)
    assert list(read_records(p, info)) == []
    assert info.problem is not None and why in info.problem, (what, info.problem)


def test_a_zstd_batch_cannot_claim_unbounded_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    zstd = zstd_module()
    monkeypatch.setattr(capture, "BATCH_MAX_BYTES", 1 << 20)
    p = tmp_path / "c.mtc"
    p.write_bytes(capture.header_bytes() + batch_record(b"", True, capture.BATCH_ZSTD,
                                                        zstd.compress(b'{"t":1}' + bytes(4 << 20))))
    info = CaptureInfo(p)
    assert list(read_records(p, info)) == []
    assert info.problem is not None and "inflates past" in info.problem


def test_a_small_json_record_is_stored_compressed_when_that_is_smaller(tmp_path: Path) -> None:
    """A SYMBOLS round of a few rows (a short run writes several) is a zstd frame; a record that
    zstd would not shrink (a short META) is stored as it is."""
    rows = [[hex(0x5555_0000 + 16 * i), "prog", 16 * i, f"function_{i % 3}", "prog.c", i] for i in range(6)]
    p = tmp_path / "c.mtc"
    # (each record alone: a writer holds a run's opening records for one group, format 8)
    p.write_bytes(header_bytes() + encode_record(RecordType.META, {"tracer": "malloc"})
                  + encode_record(RecordType.SYMBOLS, {"rows": rows, "by": "host"}))
    raw = p.read_bytes()
    assert b'{"tracer":"malloc"}' in raw and b"function_1" not in raw and capture.ZSTD_MAGIC in raw
    (sym,) = [r for r in read_records(p) if r.type == RecordType.SYMBOLS]
    assert sym.body["rows"] == rows
