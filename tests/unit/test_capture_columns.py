"""Capture format 7: a group of COLUMNS_FROM records or more stores their JSON bodies column by
column (integers and integer lists as differences from the record before), each record's agent
records after -- the same records read back, and a damaged group still costs that group alone."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from tests.unit.test_capture_groups import frames

from memtrace import capture, layout
from memtrace.capture import (
    RECORD_HEADER,
    AggRecord,
    CaptureInfo,
    CaptureWriter,
    RecordType,
    StackRecord,
    encode_agent_records,
    header_bytes,
    read_records,
)

pytestmark = pytest.mark.skipif(capture._zstd is None or not capture.BATCH_ZLIB_ON,
                                reason="grouping needs zstd and compression on")


def drain(i: int) -> tuple[dict[str, Any], bytes]:
    counters = [0] * layout.N_COUNTERS
    counters[0], counters[16], counters[3] = 1000 * i + 7, 65536 * i, 999 - i      # one going down
    body: dict[str, Any] = {
        "type": "events:batch", "t": 100 * i, "mode": "aggregate", "final": i == 11, "counters": counters,
        "lost": 0, "live": 40 + i, "stacks": 3, "clock": [10 ** 12 + 100_003 * i, 100 * i],
        "tracked": {"bytes": 4096 * i, "blocks": i}, "peak": {"bytes": 8192 * i, "epoch": i, "t": None},
        "x": {"y": i},
        "sample": {"t": 100 * i + 0.5, "in_use": None, "top": [[0, 4096 * i], [2, 17]]}}
    if i % 3 == 0:
        body["x"] = None                        # a leaf here, an object in the others
    if i % 4 == 1:
        del body["lost"]                        # a key some records lack
        body["note"] = {"nested": {"deep": [True, 1, "x"]}, "empty": {}}
    if i == 5:
        body["counters"] = counters + [5, 6]    # a list of another length
        body["live"] = 3
        body["big"] = 2 ** 70                   # past 64 bits: JSON's integers are exact
    data = encode_agent_records(0, [AggRecord(s, {"allocs": i * 10 + s, "bytes": i * 4096}) for s in range(3)])
    return body, data


def write(path: Path, n: int = 12) -> list[tuple[RecordType, dict[str, Any], bytes]]:
    records: list[tuple[RecordType, dict[str, Any], bytes]] = []
    for i in range(n):
        body, data = drain(i)
        records.append((RecordType.BATCH, body, data))
        if i == 6:
            records.append((RecordType.SNAPSHOT, {"t": 6.5, "calls": 12, "counters": [3] * layout.N_COUNTERS}, b""))
            records.append((RecordType.SYMBOLS, {"rows": [["0x401000", "t", 4096, "main"]]}, b""))
    with CaptureWriter(path) as w:
        w.write(RecordType.META, {"tracer": "malloc"})
        w.write(RecordType.BATCH, {"type": "events:batch", "t": 0},
                encode_agent_records(0, [StackRecord(0, s, (0x401000 + s,)) for s in range(3)]))
        for rtype, body, data in records:
            w.write(rtype, body, data)
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    return records


def groups(path: Path) -> list[tuple[int, int]]:
    """(offset, payload length) of each GROUP record in the file, read by hand."""
    return [(at, length) for at, rtype, length in frames(path) if rtype == RecordType.GROUP]


def test_a_column_group_reads_back_every_record_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    records = write(p)
    info = CaptureInfo(p)
    read = [(r.type, r.body, bytes(r.data)) for r in read_records(p, info)][2:-1]
    assert info.problem is None and info.version == capture.FORMAT_VERSION == 8
    assert read == records
    # One group, in columns: its first sub-record the column table.
    [(at, length)] = groups(p)
    raw = capture._unzstd(p.read_bytes()[at + RECORD_HEADER.size:at + RECORD_HEADER.size + length], 1 << 20, "GROUP")
    assert raw[0] == 0
    # The counters stored as differences: drain 2's counter 0 is 1000 more than drain 1's.
    table = capture._loads(RecordType.GROUP, raw[8:8 + struct.unpack_from("<I", raw, 4)[0]])
    [counters] = [col for col in table if col[:2] == [RecordType.BATCH, ["counters"]]]
    assert counters[3] == "r"       # (one list of another length: as they are)
    [t] = [col for col in table if col[:2] == [RecordType.BATCH, ["t"]]]
    assert t[3] == "d" and t[4][:3] == [0, 100, 100]


def test_counters_of_one_length_are_differences(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = [{"counters": [5, 0, 9], "x": 1}, {"counters": [7, 0, 9]}, {"counters": [7, 0, 9], "x": 1}]
    table = capture._columns([(4, body) for body in bodies] + [(9, {"x": 2.5})])
    assert table == [[4, ["counters"], None, "D", [[5, 0, 9], [2, 0, 0], 0]], [4, ["x"], [0, 2], "d", [1, 0]],
                     [9, ["x"], None, "r", [2.5]]]
    assert capture._uncolumns(table, [4, 4, 4, 9]) == [*bodies, {"x": 2.5}]
    with pytest.raises(capture._Damaged):
        capture._uncolumns(table, [4, 4, 9, 9])         # a column's row of another type


def test_a_small_group_is_not_in_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    records = write(p, n=capture.COLUMNS_FROM - 1 - 2)     # (with the snapshot and symbols: one short)
    [(at, length)] = groups(p)
    raw = capture._unzstd(p.read_bytes()[at + RECORD_HEADER.size:at + RECORD_HEADER.size + length], 1 << 20, "GROUP")
    assert raw[0] == RecordType.BATCH
    assert [(r.type, r.body, bytes(r.data)) for r in read_records(p)][2:-1] == records


def regroup(raw: bytes) -> bytes:
    assert capture._zstd is not None
    payload = capture._compress(raw, 3, capture.FORMAT_VERSION)
    head = capture.RECORD_HEADER_V1.pack(int(RecordType.GROUP), 0, capture._head_check(int(RecordType.GROUP),
                                                                                     len(payload)), len(payload))
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


def column_group() -> bytes:
    return capture.group_bytes([(RecordType.BATCH, *drain(i)) for i in range(1, 10)])


def table_end(raw: bytes) -> int:
    return 8 + struct.unpack_from("<I", raw, 4)[0]


def flag_off(raw: bytes) -> bytes:
    """The first record's SUB_COLUMNS flag cleared."""
    at = table_end(raw)
    return raw[:at + 1] + bytes([raw[at + 1] & ~capture.SUB_COLUMNS]) + raw[at + 2:]


@pytest.mark.parametrize("damage", [
    lambda raw: raw.replace(b'"d"', b'"q"', 1),                         # an unknown code
    lambda raw: raw.replace(b'[4,["type"]', b'[4,[7]', 1),              # a path not of keys
    lambda raw: raw[:4] + struct.pack("<I", 10 ** 6) + raw[8:],         # a table past the group's end
    flag_off,                                                           # a record not in the columns
    lambda raw: raw[:table_end(raw)] + raw[table_end(raw) + 8 + struct.unpack_from("<I", raw, table_end(raw) + 4)[0]:],
    lambda raw: raw[:1] + b"\x01" + raw[2:],                            # the table's header not 0
])
def test_a_damaged_column_group_is_skipped_and_counted_and_the_rest_read(tmp_path: Path, damage: Any) -> None:
    good = [(RecordType.BATCH, *drain(i)) for i in range(1, 10)]
    raw = column_group()
    assert raw[0] == 0 and capture._decode_group(raw, capture.FORMAT_VERSION) is not None
    p = tmp_path / "c.mtc"
    second = capture.encode_group(good)
    p.write_bytes(header_bytes() + capture.encode_record(RecordType.META, {"tracer": "malloc"})
                  + regroup(damage(raw)) + second
                  + capture.encode_record(RecordType.END, {"ended": "completed", "reason": "done"}))
    info = CaptureInfo(p)
    read = list(read_records(p, info))
    assert [r.type for r in read] == [RecordType.META] + [RecordType.BATCH] * 9 + [RecordType.END]
    assert [(r.type, r.body, bytes(r.data)) for r in read[1:-1]] == good
    assert info.n_skipped == 1 and "GROUP record" in info.skipped[0], info.skipped


def test_a_version_6_group_in_columns_is_damage(tmp_path: Path) -> None:
    """A version-6 writer never wrote columns: a group starting with one in a version-6 file is damage."""
    p = tmp_path / "c.mtc"
    p.write_bytes(header_bytes(6) + regroup(column_group()))
    info = CaptureInfo(p)
    assert list(read_records(p, info)) == [] and info.n_skipped == 1, info.skipped


def test_a_flipped_byte_in_a_column_group_costs_that_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "GROUP_S", 0.0)
    p = tmp_path / "c.mtc"
    with CaptureWriter(p) as w:
        w.write(RecordType.META, {"tracer": "malloc"})
        for i in range(30):
            w.write(RecordType.BATCH, *drain(i))
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    clean = [(r.type, r.body) for r in read_records(p)]
    # Rewrite with groups of ten drains, then flip a byte in the middle one.
    records = [(RecordType.BATCH, *drain(i)) for i in range(30)]
    p.write_bytes(header_bytes() + capture.encode_record(RecordType.META, {"tracer": "malloc"})
                  + b"".join(capture.encode_group(records[k:k + 10]) for k in range(0, 30, 10))
                  + capture.encode_record(RecordType.END, {"ended": "completed", "reason": "done"}))
    at, length = groups(p)[1]
    b = bytearray(p.read_bytes())
    b[at + RECORD_HEADER.size + length // 2] ^= 0x10
    p.write_bytes(bytes(b))
    info = CaptureInfo(p)
    read = [(r.type, r.body) for r in read_records(p, info)]
    assert read == clean[:11] + clean[21:]
    assert info.n_skipped == 1 and "GROUP record: checksum mismatch" in info.skipped[0], info.skipped


def test_counters_all_zero_at_first_keep_their_width() -> None:
    """A quiet process's first drain: every counter 0.  Its difference from nothing was written as
    the bare 0 of "no element changed", which the reader cannot take the width from: every group of
    a small child process read as damaged (the fresh-clone run's followed-children tests)."""
    bodies = [{"counters": [0, 0, 0]}, {"counters": [0, 0, 0]}, {"counters": [0, 4, 0]}]
    table = capture._columns([(4, body) for body in bodies])
    assert table == [[4, ["counters"], None, "D", [[0, 0, 0], 0, [0, 4, 0]]]]
    assert capture._uncolumns(table, [4, 4, 4]) == bodies
