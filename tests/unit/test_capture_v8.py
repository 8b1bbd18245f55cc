"""Capture format 8: a run's opening records (META, RECON, CALIBRATION, MODULES, a SNAPSHOT) held
and written as one group, the first round of symbols grouped with the drains after it, columns
that name an earlier column they repeat, frames made with a dictionary named in one byte -- the
same records read back, a damaged group still costs that group alone, older formats read as they
were written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.unit.test_capture_columns import drain
from tests.unit.test_capture_groups import assert_group_damage_until, frames

from memtrace import capture, layout
from memtrace.capture import (
    RECORD_HEADER,
    CaptureInfo,
    CaptureWriter,
    RecordType,
    StackRecord,
    encode_agent_records,
    encode_record,
    header_bytes,
    read_records,
)

pytestmark = pytest.mark.skipif(capture._zstd is None or not capture.BATCH_ZLIB_ON,
                                reason="grouping needs zstd and compression on")

OPENING: list[tuple[RecordType, dict[str, Any], bytes]] = [
    (RecordType.META, {"tracer": "malloc", "target": {"label": "t"}}, b""),
    (RecordType.RECON, {"symbols": [{"name": "malloc", "status": "found"}], "info": {}}, b""),
    (RecordType.CALIBRATION, {"phase": "before", "allocator": {"in_use": 31264}}, b""),
    (RecordType.MODULES, {"modules": [{"name": "t", "path": "/t", "base": "0x400000", "size": 4096}]}, b""),
    (RecordType.SNAPSHOT, {"t": 0.02, "calls": 0, "counters": [0] * layout.N_COUNTERS}, b""),
]
FIRST = (RecordType.BATCH, {"type": "events:batch", "t": 0},
         encode_agent_records(0, [StackRecord(0, s, (0x401000 + s,)) for s in range(3)]))
SYMBOLS = (RecordType.SYMBOLS, {"rows": [["0x401000", "t", 4096, "main"]]}, b"")


def write(path: Path, drains: int = 3) -> list[tuple[RecordType, Any, bytes]]:
    records = [*OPENING, FIRST, SYMBOLS, *[(RecordType.BATCH, *drain(i)) for i in range(1, drains + 1)]]
    with CaptureWriter(path) as w:
        for r in records:
            w.write(*r)
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    return records


def test_the_opening_records_are_one_group_and_the_first_symbols_ride_with_the_drains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    records = write(p)
    info = CaptureInfo(p)
    read = [(r.type, r.body, bytes(r.data)) for r in read_records(p, info)]
    assert info.problem is None and info.version == capture.FORMAT_VERSION == 8
    assert read[:-1] == records and read[-1][0] == RecordType.END
    # The opening five in one group; the first drain alone, at once (its stack definitions); the
    # symbols and the later drains in one group.
    assert [rtype for _, rtype, _ in frames(p)] == [RecordType.GROUP, RecordType.BATCH, RecordType.GROUP,
                                                    RecordType.END]
    # Smaller than each opening record alone.
    (at, _, length), *_ = frames(p)
    assert RECORD_HEADER.size + length < sum(len(encode_record(*r)) for r in OPENING)


def test_the_opening_group_closes_at_the_first_drain_and_holds_nothing_after(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """What comes after the opening (a RESULT, a WARNING after the first group) is written as
    before: the opening is held once, for the first group only."""
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    with CaptureWriter(p) as w:
        w.write(*OPENING[0])
        w.write(*OPENING[1])
        w.write(RecordType.RESULT, {"tracer": "x"})           # not an opening record: the group goes first
        w.write(RecordType.WARNING, {"message": "w"})         # after it: written at once
        w.write(*FIRST)
    assert [rtype for _, rtype, _ in frames(p)] == [RecordType.GROUP, RecordType.RESULT, RecordType.WARNING,
                                                    RecordType.BATCH]
    assert [r.type for r in read_records(p)] == [RecordType.META, RecordType.RECON, RecordType.RESULT,
                                                 RecordType.WARNING, RecordType.BATCH]


def test_a_flipped_byte_in_the_opening_group_costs_that_group_only(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    records = write(p)
    (at, _, length), *_ = frames(p)
    b = bytearray(p.read_bytes())
    b[at + RECORD_HEADER.size + length // 2] ^= 0x04
    p.write_bytes(bytes(b))
    info = CaptureInfo(p)
    read = [(r.type, r.body, bytes(r.data)) for r in read_records(p, info)]
    assert read[:-1] == records[len(OPENING):]
    assert info.n_skipped == 1 and info.skipped[0].startswith(f"byte {at}: GROUP record: checksum mismatch"), \
        info.skipped


def test_a_column_repeating_another_names_it() -> None:
    """ "=": a column of the same type with the same rows and values; "<": each value that column's in
    the latest record before (a SNAPSHOT's counters: the drain's before it).  Short ones are
    written as they are (naming another costs as much)."""
    bodies: list[tuple[int, Any]] = []
    for i in range(1, 5):
        body, _ = drain(i)
        body["sample"]["tracked_bytes"] = body["tracked"]["bytes"]
        bodies.append((int(RecordType.BATCH), body))
        if i == 2:
            bodies.append((int(RecordType.SNAPSHOT), {"counters": list(body["counters"]),
                                                      "tracked_bytes": body["tracked"]["bytes"], "x": 7}))
    table = capture._columns(bodies)
    by_path = {(col[0], tuple(col[1])): col for col in table}
    index = {(col[0], tuple(col[1])): i for i, col in enumerate(table)}
    same = by_path[(RecordType.BATCH, ("sample", "tracked_bytes"))]
    assert same[3:] == ["=", index[(RecordType.BATCH, ("tracked", "bytes"))]]
    before = by_path[(RecordType.SNAPSHOT, ("counters",))]
    assert before[3:] == ["<", index[(RecordType.BATCH, ("counters",))]]
    assert by_path[(RecordType.SNAPSHOT, ("x",))][3:] == ["d", [7]]
    types = [t for t, _ in bodies]
    back = capture._uncolumns(table, types)
    assert back == [body for _, body in bodies]
    # No two records share a list: changing one changes no other.
    back[2]["counters"][0] += 1
    assert back[1]["counters"][0] == bodies[1][1]["counters"][0]
    # Version 7 wrote no such columns: read so, they are damage; as is a name pointing nowhere.
    with pytest.raises(capture._Damaged):
        capture._uncolumns(table, types, version=7)
    at = index[(RecordType.BATCH, ("sample", "tracked_bytes"))]
    # (itself; before the table; a string; a later column; one of other rows; one of its own type for "<")
    for bad in (["=", at], ["=", -1], ["=", str(at - 1)], ["<", index[(RecordType.SNAPSHOT, ("x",))]],
                ["=", index[(RecordType.BATCH, ("x", "y"))]], ["<", index[(RecordType.SNAPSHOT, ("counters",))]]):
        broken = [list(col) for col in table]
        broken[at if bad[0] == "=" else index[(RecordType.SNAPSHOT, ("counters",))]][3:] = bad
        with pytest.raises(capture._Damaged):
            capture._uncolumns(broken, types)


def test_a_snapshot_before_any_drain_of_its_group_is_written_as_it_is() -> None:
    """ "<" needs a record before each of the column's rows: a SNAPSHOT first in its group has none
    (its counters are written as they are; the drain after it repeats them: it names them)."""
    counters = [5] * 40
    bodies = [(int(RecordType.SNAPSHOT), {"counters": list(counters)}), (int(RecordType.BATCH), {"counters": counters}),
              (int(RecordType.SNAPSHOT), {"counters": list(counters)})]
    table = capture._columns(bodies)
    assert [col[3:] for col in table][1:] == [["<", 0]] and table[0][3] == "D"
    assert capture._uncolumns(table, [t for t, _ in bodies]) == [b for _, b in bodies]


def test_resymbolizing_a_column_group_keeps_its_other_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A column group's table has a row for each record it holds: taking its SYMBOLS out frames its
    other records again (before: the table kept the SYMBOLS' rows and the group read as damaged)."""
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    records = write(p, drains=capture.COLUMNS_FROM + 2)
    capture.replace_records(p, RecordType.SYMBOLS, [{"rows": [["0x401000", "t", 4096, "new"]]}])
    info = CaptureInfo(p)
    read = [(r.type, r.body, bytes(r.data)) for r in read_records(p, info)]
    assert info.problem is None, info.skipped
    new = (RecordType.SYMBOLS, {"rows": [["0x401000", "t", 4096, "new"]]}, b"")
    assert read[:-1] == [*records[:len(OPENING) + 1], new, *records[len(OPENING) + 2:]]


def test_resymbolizing_a_version_7_capture_writes_version_7_groups(tmp_path: Path) -> None:
    """A group framed again keeps its capture's format: a version-7 reader's columns, its dictionary."""
    records = [(RecordType.BATCH, *drain(i)) for i in range(1, capture.COLUMNS_FROM + 2)]
    records.insert(3, SYMBOLS)
    p = tmp_path / "c.mtc"
    end = encode_record(RecordType.END, {"ended": "completed", "reason": "done"}, version=7)
    p.write_bytes(header_bytes(7) + encode_record(*FIRST, version=7) + capture.encode_group(records, version=7) + end)
    capture.replace_records(p, RecordType.SYMBOLS, [])
    info = CaptureInfo(p)
    read = [(r.type, r.body, bytes(r.data)) for r in read_records(p, info)]
    assert info.problem is None and info.version == 7
    assert read[:-1] == [FIRST] + [r for r in records if r[0] != RecordType.SYMBOLS]
    payload = p.read_bytes()[16 + len(encode_record(*FIRST, version=7)) + RECORD_HEADER.size:]
    assert capture._zstd is not None and capture._zstd.get_frame_info(payload).dictionary_id != 8


def test_frames_name_the_format_8_dictionary_in_one_byte() -> None:
    frame = encode_record(RecordType.RECON, {"symbols": [{"name": "malloc", "status": "found"}] * 20})
    payload = frame[RECORD_HEADER.size:]
    assert capture._zstd is not None and capture._zstd.get_frame_info(payload).dictionary_id == 8
    assert payload[4] & 3 == 1          # the frame header's dictionary id field: one byte


def test_a_version_7_group_holding_an_opening_record_is_damage(tmp_path: Path) -> None:
    """A version-7 writer never grouped META: such a group in a version-7 file is damage."""
    raw = capture.group_bytes([OPENING[0], OPENING[1]], version=7)
    assert_group_damage_until(tmp_path, capture._compress(raw, 3, 7), 7, [RecordType.META, RecordType.RECON])


def test_replacing_an_opening_record_takes_it_out_of_the_opening_group(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    records = write(p)
    fresh = {"modules": [{"name": "t", "path": "/new", "base": "0x400000", "size": 8192}]}
    capture.replace_records(p, RecordType.MODULES, [fresh])
    info = CaptureInfo(p)
    read = [(r.type, r.body, bytes(r.data)) for r in read_records(p, info)]
    assert info.problem is None, info.skipped
    assert [r for r in read if r[0] == RecordType.MODULES] == [(RecordType.MODULES, fresh, b"")]
    assert [r for r in read[:-1] if r[0] != RecordType.MODULES] == [r for r in records if r[0] != RecordType.MODULES]
