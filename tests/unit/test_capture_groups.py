"""GROUP records (capture format 5, SYMBOLS too from 6): the agent's drains and the snapshots of up to GROUP_S seconds
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
    assert info.problem is None and info.version == capture.FORMAT_VERSION == 8
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
        w.write(RecordType.MODULES, {"modules": []})             # written at once, ahead of them
        w.write(RecordType.SYMBOLS, {"rows": [["0x401000", "t", 4096, "main"]]})    # (version 6) grouped too
        w.write(RecordType.BATCH, *drain(3))
        w.write(RecordType.WARNING, {"message": "w", "t": 350})  # after what is held
        w.write(RecordType.BATCH, *drain(4))
        w.write(RecordType.BATCH, *drain(5))
    # No END: close() still writes what it held.
    assert [(r.type, r.body.get("t")) for r in read_records(p)] == [
        (RecordType.BATCH, 0), (RecordType.MODULES, None), (RecordType.BATCH, 100), (RecordType.BATCH, 200),
        (RecordType.SNAPSHOT, 250), (RecordType.SYMBOLS, None), (RecordType.BATCH, 300), (RecordType.WARNING, 350),
        (RecordType.BATCH, 400), (RecordType.BATCH, 500)]
    assert [rtype for _, rtype, _ in frames(p)] == [RecordType.BATCH, RecordType.MODULES, RecordType.GROUP,
                                                    RecordType.WARNING, RecordType.GROUP]


def test_a_format_5_group_holds_no_symbols(tmp_path: Path) -> None:
    """A version-5 writer never grouped SYMBOLS: such a group in a version-5 file is damage."""
    assert capture._zstd is not None
    subs = b"".join(sub(RecordType.SYMBOLS, b'{"rows":[]}') for _ in range(2))
    assert_group_damage_until(tmp_path, capture._zstd.compress(subs), 5, [RecordType.SYMBOLS, RecordType.SYMBOLS])


def assert_group_damage_until(tmp_path: Path, payload: bytes, version: int, read_after: list[RecordType]) -> None:
    """A GROUP record of ``payload`` (its frame, compressed) is damage in a file of ``version`` (skipped,
    nothing read) and reads as ``read_after`` in the version after it."""
    import zlib

    head = capture.RECORD_HEADER_V1.pack(int(RecordType.GROUP), 0, capture._head_check(int(RecordType.GROUP),
                                                                                     len(payload)), len(payload))
    record = head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload
    for v, read in ((version, []), (version + 1, read_after)):
        p = tmp_path / f"c{v}.mtc"
        p.write_bytes(header_bytes(v) + record)
        info = CaptureInfo(p)
        assert [r.type for r in read_records(p, info)] == read
        assert info.n_skipped == (v == version)


def test_resymbolizing_replaces_the_grouped_symbols(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    drains = [drain(i) for i in range(4)]
    with CaptureWriter(p) as w:
        w.write(RecordType.BATCH, *drains[0])
        w.write(RecordType.SYMBOLS, {"rows": [["0x401000", "t", 4096, "old0"]]})        # (version 8) grouped
        w.write(RecordType.BATCH, *drains[1])
        w.write(RecordType.SYMBOLS, {"rows": [["0x401001", "t", 4097, "old1"]]})        # grouped
        w.write(RecordType.BATCH, *drains[2])
        w.write(RecordType.WARNING, {"message": "w"})
        w.write(RecordType.SYMBOLS, {"rows": [["0x402000", "t", 8192, "old2"]]})        # grouped ...
        w.write(RecordType.BATCH, *drains[3])                                           # ... with one drain
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    assert [rtype for _, rtype, _ in frames(p)] == [RecordType.BATCH, RecordType.GROUP,
                                                    RecordType.WARNING, RecordType.GROUP, RecordType.END]
    capture.replace_records(p, RecordType.SYMBOLS, [{"rows": [["0x401000", "t", 4096, "new"]]}])
    info = CaptureInfo(p)
    records = list(read_records(p, info))
    assert info.problem is None
    assert [r.body["rows"][0][3] for r in records if r.type == RecordType.SYMBOLS] == ["new"]
    assert [(r.body, bytes(r.data)) for r in records if r.type == RecordType.BATCH] == drains
    assert [r.type for r in records] == [RecordType.BATCH, RecordType.SYMBOLS, RecordType.BATCH, RecordType.BATCH,
                                         RecordType.WARNING, RecordType.BATCH, RecordType.END]


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


def sub(rtype: int, payload: bytes, flag: int = 0) -> bytes:
    return capture.RECORD_HEADER_V1.pack(rtype, flag, 0, len(payload)) + payload


def test_a_groups_agg_values_are_stored_as_deltas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(version 6) Each AGG value in a group is its difference from the same stack's same
    field earlier in the group: drain i's "allocs" of stack s is 10 i + s, so every drain after the
    group's first stores 10 -- and reads back as the running total."""
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    drains = write(p)
    at, _, length = frames(p)[2]
    assert capture._zstd is not None
    raw = capture._unzstd(p.read_bytes()[at + RECORD_HEADER.size:at + RECORD_HEADER.size + length], 1 << 20, "GROUP")
    # (version 7) the group's JSON in columns first, then each drain's agent records alone
    rtype, _, _, n = capture.RECORD_HEADER_V1.unpack_from(raw)
    stored, pos = [], 8 + n
    assert rtype == 0
    while pos < len(raw):
        rtype, flag, _, n = capture.RECORD_HEADER_V1.unpack_from(raw, pos)
        payload = raw[pos + 8:pos + 8 + n]
        assert (rtype, flag) == (RecordType.BATCH, capture.SUB_AGG_DELTAS | capture.SUB_COLUMNS)
        stored.append(list(decode_agent_records(payload)))
        pos += 8 + n
    assert stored[0] == [AggRecord(s, {"allocs": 10 + s, "bytes": 4096}) for s in range(3)]     # drain 1: as it is
    assert all(agg == [AggRecord(s, {"allocs": 10, "bytes": 4096}) for s in range(3)] for agg in stored[1:])
    assert [(r.body, bytes(r.data)) for r in read_records(p) if r.type == RecordType.BATCH] == drains


@pytest.mark.parametrize("inside", [
    b"",                                                                    # one record only
    sub(RecordType.SNAPSHOT, b"{}")[:-1],                                   # a length past the frame's end
    sub(RecordType.BATCH, struct.pack("<I", 2 | capture.BATCH_ZSTD) + b"{}"),   # a BATCH compressed again
    sub(RecordType.END, b"{}"),                                             # a type no group holds
    sub(RecordType.GROUP, b"{}"),                                           # a group in a group
    sub(RecordType.SNAPSHOT, b"{}", flag=capture.SUB_AGG_DELTAS),          # deltas in a JSON record
    sub(RecordType.BATCH, struct.pack("<I", 2) + b"{}" + b"\x01\x02", flag=capture.SUB_AGG_DELTAS),  # unframed deltas
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


def test_frames_are_made_with_the_shipped_dictionary(tmp_path: Path) -> None:
    """(version 6) zstd frames name the shipped dictionary; one naming another reads as damaged,
    saying which dictionary it needs."""
    assert capture._zstd is not None
    shipped = capture._dictionary()
    assert shipped is not None, f"{capture.DICTIONARY_FILE} missing: a broken installation"
    frame = encode_record(RecordType.RECON, {"symbols": [{"name": "malloc", "status": "hooked"}] * 20})
    payload = frame[RECORD_HEADER.size:]
    assert capture._zstd.get_frame_info(payload).dictionary_id == shipped.dict_id
    other = capture._zstd.train_dict([f'{{"k{i}": "v{i * i}"}}'.encode() * 20 for i in range(200)], 1024)
    alien = capture._zstd.compress(capture._dumps({"message": "w" * 200}), 19, zstd_dict=other)
    head = capture.RECORD_HEADER_V1.pack(int(RecordType.WARNING), 0, capture._head_check(int(RecordType.WARNING),
                                                                                       len(alien)), len(alien))
    import zlib

    p = tmp_path / "c.mtc"
    p.write_bytes(header_bytes() + frame + head + struct.pack("<I", zlib.crc32(alien, zlib.crc32(head))) + alien)
    info = CaptureInfo(p)
    assert [r.type for r in read_records(p, info)] == [RecordType.RECON]
    assert info.n_skipped == 1 and f"made with dictionary {other.dict_id}, which this memtrace does not have" \
        in info.skipped[0], info.skipped


def test_a_large_symbols_round_is_written_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round of symbols past SYMBOLS_ALONE_FROM is written at once, ahead of the drains held
    (alone it is compressed harder than a busy group is); a small one is grouped."""
    monkeypatch.setattr(capture, "GROUP_S", 3600.0)
    p = tmp_path / "c.mtc"
    many = [[hex(0x401000 + i), "t", 4096 + i, f"f{i}"] for i in range(capture.SYMBOLS_ALONE_FROM // 100)]
    with CaptureWriter(p) as w:
        for i in range(3):
            w.write(RecordType.BATCH, *drain(i))
        w.write(RecordType.SYMBOLS, {"rows": many})
        w.write(RecordType.SYMBOLS, {"rows": many[:1]})
        w.write(RecordType.BATCH, *drain(3))
    assert [rtype for _, rtype, _ in frames(p)] == [RecordType.BATCH, RecordType.SYMBOLS, RecordType.GROUP]
    assert [len(r.body["rows"]) for r in read_records(p) if r.type == RecordType.SYMBOLS] == [len(many), 1]


def test_a_batch_field_out_of_range_costs_that_field_not_the_batchs_stacks(tmp_path: Path) -> None:
    """A drain read while 256 threads churned said -1 live blocks (2^64 - 1 as the agent's u64):
    the reader refused the batch, and with it the group's stack definitions and symbols -- the run's
    one stack read "<stack 0 not in capture>".  admit_body takes the bad field out and says so."""
    drains = [drain(i) for i in range(DRAINS)]
    bad = dict(drains[0][0], live=2**64 - 1, tracked={"bytes": 64, "blocks": 2**64 - 1})
    said = capture.admit_body(RecordType.BATCH, bad)
    assert said == [".live: expected a count below 2^63, got 18446744073709551615",
                    ".tracked.blocks: expected a count below 2^63, got 18446744073709551615"], said
    assert "live" not in bad and "tracked" not in bad and bad["counters"] == drains[0][0]["counters"]
    path = tmp_path / "c.mtc"
    with CaptureWriter(path) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        w.write(RecordType.BATCH, bad, drains[0][1])
        for body, data in drains[1:]:
            w.write(RecordType.BATCH, body, data)
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    info = CaptureInfo(path)
    batches = [r for r in read_records(path, info) if r.type == RecordType.BATCH]
    assert info.n_skipped == 0 and len(batches) == DRAINS
    assert [r.stack_id for r in decode_agent_records(batches[0].data) if isinstance(r, StackRecord)] == [0, 1, 2]


def test_a_body_wrong_as_a_whole_is_left_for_the_reader_to_say() -> None:
    """Only fields are taken out: a body that is not an object is written as it came."""
    body: list[object] = ["not", "an", "object"]
    assert capture.admit_body(RecordType.BATCH, body) == [] and body == ["not", "an", "object"]  # type: ignore[arg-type]
    fine = {"live": 1, "counters": [0] * layout.N_COUNTERS}
    assert capture.admit_body(RecordType.BATCH, fine) == [] and fine["live"] == 1


def test_a_refused_record_of_a_group_costs_that_record_alone(tmp_path: Path) -> None:
    """Written as it came (before admit_body), a drain whose live count read -1 made the reader
    skip its whole GROUP: the drain before it (the stacks' definitions) and the SYMBOLS beside
    it too.  The group's framing and checksum hold, so only the refused record is skipped."""
    drains = [drain(i) for i in range(DRAINS)]
    path = tmp_path / "c.mtc"
    with CaptureWriter(path) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        w.write(RecordType.BATCH, *drains[0])
        w.write(RecordType.BATCH, dict(drains[1][0], live=2**64 - 1), drains[1][1])
        w.write(RecordType.SYMBOLS, {"rows": [["0x401000", "m", 0, "f", None, None]]})
        for body, data in drains[2:]:
            w.write(RecordType.BATCH, body, data)
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    offsets = {at for at, rtype, _ in frames(path) if rtype == RecordType.GROUP}
    info = CaptureInfo(path)
    records = list(read_records(path, info))
    batches = [r for r in records if r.type == RecordType.BATCH]
    assert info.n_skipped == 1 and len(info.skipped) == 1, info.skipped
    assert "its record" in info.skipped[0] and "BATCH" in info.skipped[0] and ".live" in info.skipped[0]
    assert int(info.skipped[0].split()[1].rstrip(":")) in offsets      # said at its group's byte
    assert [r.body["t"] for r in batches] == [100 * i for i in range(DRAINS) if i != 1]
    assert [r.stack_id for r in decode_agent_records(batches[0].data) if isinstance(r, StackRecord)] == [0, 1, 2]
    assert any(r.type == RecordType.SYMBOLS for r in records)


def _group_with_a_refused_drain(path: Path, symbols: str = "OLD") -> list[tuple[dict[str, object], bytes]]:
    drains = [drain(i) for i in range(DRAINS)]
    with CaptureWriter(path) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        w.write(RecordType.BATCH, *drains[0])
        w.write(RecordType.BATCH, dict(drains[1][0], live=2**64 - 1), drains[1][1])
        w.write(RecordType.SYMBOLS, {"rows": [["0x401000", "m", 0, symbols, None, None]]})
        for body, data in drains[2:]:
            w.write(RecordType.BATCH, body, data)
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    return drains


def test_symbols_rewritten_past_a_refused_record_leave_no_stale_rows(tmp_path: Path) -> None:
    """`memtrace symbolize` rewrites SYMBOLS (replace_records): a group holding a refused record
    was copied as it was, and once the reader read past refused records its old SYMBOLS came back
    beside the new ones.  The group is written again without them, the refused record kept (and
    still said)."""
    path = tmp_path / "c.mtc"
    _group_with_a_refused_drain(path)
    capture.replace_records(path, RecordType.SYMBOLS, [{"rows": [["0x401000", "m", 0, "NEW", None, None]]}])
    info = CaptureInfo(path)
    records = list(read_records(path, info))
    names = [row[3] for r in records if r.type == RecordType.SYMBOLS for row in r.body["rows"]]
    assert names == ["NEW"]
    assert info.n_skipped == 1 and ".live" in info.skipped[0]
    assert len([r for r in records if r.type == RecordType.BATCH]) == DRAINS - 1


def test_a_drain_keeps_its_place_in_its_group_past_a_refused_one(tmp_path: Path) -> None:
    """A bad agent record is said "of drain N of the group": N is the drain's place in the group,
    counting the refused record before it."""
    path = tmp_path / "c.mtc"
    _group_with_a_refused_drain(path)
    places = {r.body["t"]: r.data.drain for r in read_records(path) if r.type == RecordType.BATCH}
    # Drain 0 alone in the opening group; the next group: drain 1 (refused) at place 0, SYMBOLS at
    # 1, drain 2 at place 2, and so on.
    assert places == {0: 0, **{100 * i: i for i in range(2, DRAINS)}}, places
