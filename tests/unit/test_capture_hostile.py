"""Crafted captures (issue 14): well-framed records that say impossible things.

Each one, in format version 1 (no checksums) and 2 (valid checksums, so only the reader's shape
checks stand in the way), must give `export` and `report` one line naming the file and the byte
where the bad record starts, exit status 1 with everything before it, and no traceback from any
tracer's analyzer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.hostile_captures import CASES, base, frame, header, write_case

from memtrace import cli, tracers
from memtrace.capture import CaptureInfo, Record, decode_agent_records, read_records


def bad_offset(name: str, version: int) -> int:
    """Where the crafted record starts: the first record that differs from the valid capture."""
    good, crafted = base(), CASES[name]()
    good_tracer = base("purgeable") if any(t == 7 for t, _ in crafted) else good
    offset = len(header(version))
    for i, rec in enumerate(crafted):
        if i >= len(good_tracer) or rec != good_tracer[i]:
            return offset
        offset += len(frame(*rec, version=version))
    raise AssertionError(f"{name}: nothing crafted")


def run_cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_crafted_record_is_skipped_and_named_at_its_offset(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           name: str, version: int) -> None:
    """The bad record is skipped and named; every record after it is still read (issue 20.8)."""
    p = write_case(tmp_path / "case" / "capture.mtc", name, version)
    at = bad_offset(name, version)
    crafted = CASES[name]()
    info = CaptureInfo(p)
    records = list(read_records(p, info))
    for r in records:                   # what every analyzer does: decode the agent records
        list(decode_agent_records(r.data))
    said = info.problem
    assert info.corrupt and said is not None and said.startswith(f"corrupt at byte {at}: "), said
    if version == 2 and name in DECODED_LATER:
        # The checksum holds, so the agent's records are checked as they are decoded: only the
        # bad agent record is skipped, its BATCH is read.
        assert len(records) == len(crafted) and said.startswith(f"corrupt at byte {at}: BATCH agent record at ")
    else:
        assert at not in [r.offset for r in records] and len(records) == len(crafted) - 1

    rc, out, err = run_cli(capsys, "export", p)
    assert rc == 1 and '"record": "truncated"' in out.splitlines()[-1]
    assert err.startswith(f"memtrace: warning: {p}: corrupt at byte {at}: ") and err.count("\n") == 1

    rc, _, err = run_cli(capsys, "report", tmp_path / "case", "--out", tmp_path / "out")
    assert rc == 1 and f"capture.mtc: corrupt at byte {at}: " in err or f"(corrupt at byte {at}: " in err, err
    assert "Traceback" not in err

    for tracer in tracers.all_tracers().values():     # every analyzer sees only well-formed records
        tracer.summarize(read_records(p)).to_json()


# Agent records inside a BATCH whose checksum holds: checked by the decoder (cheaper than a walk).
DECODED_LATER = {"batch-stack-overruns", "batch-unknown-agent-record", "batch-alloc-cut"}


def at_index(records: list[Record], offset: int) -> int:
    return next(i for i, r in enumerate(records) if r.offset == offset)


def test_the_valid_base_captures_read_in_full(tmp_path: Path) -> None:
    from tests.hostile_captures import write_base

    for tracer in ("malloc", "purgeable"):
        for version in (1, 2):
            p = write_base(tmp_path / f"{tracer}{version}.mtc", tracer, version)
            info = CaptureInfo(p)
            assert len(list(read_records(p, info))) == len(base(tracer)) and info.problem is None


def test_some_cases_are_named_in_their_messages(tmp_path: Path) -> None:
    """What the one line says, for the shapes issue 14 lists."""
    said = {}
    for name in ("batch-stack-overruns", "symbols-bad-address", "symbols-rows-objects", "meta-list", "end-number",
                 "modules-missing-base", "calibration-list", "nan-in-end", "deep-nesting"):
        p = write_case(tmp_path / f"{name}.mtc", name, version=1 if name.startswith("batch") else 2)
        info = CaptureInfo(p)
        list(read_records(p, info))
        said[name] = info.skipped[0].split(": ", 1)[1]
    assert said == {
        "batch-stack-overruns": "BATCH agent records: agent record overruns its chunk (ends at offset 1616, chunk "
                                "at 32)",
        "symbols-bad-address": "SYMBOLS record.rows[0][0]: expected an address, got '0xq1'",
        "symbols-rows-objects": "SYMBOLS record.rows[0]: expected a list, got {'address': '0x1010'}",
        "meta-list": "META record: expected an object, got [1, 2]",
        "end-number": "END record: expected an object, got 3",
        "modules-missing-base": "MODULES record.modules[0]: missing 'base'",
        "calibration-list": "CALIBRATION record: expected an object, got [100]",
        "nan-in-end": "END record is not valid JSON: NaN is not a JSON number",
        "deep-nesting": "WARNING record nests too deeply to be JSON memtrace wrote",
    }


def test_one_batch_saying_live_minus_one_costs_that_batch_only(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 27: one BATCH with ``live: -1`` (valid checksum) made 89 % of a capture unreadable.
    Now that batch alone is skipped and named; the 99 after it and the END are read."""
    from tests.hostile_captures import ALLOC as ALLOC_REC
    from tests.hostile_captures import BATCH, COUNTERS, batch, chunk, frame, header
    from tests.hostile_captures import STACK as STACK_REC

    recs = base()
    end = recs.pop()
    good = batch({"counters": COUNTERS, "live": 1}, chunk(7, STACK_REC + ALLOC_REC))
    batches = [good] * 100
    batches[0] = batch({"counters": COUNTERS, "live": -1}, chunk(7, STACK_REC + ALLOC_REC))
    p = tmp_path / "c" / "capture.mtc"
    p.parent.mkdir()
    blob = header() + b"".join(frame(t, pl) for t, pl in recs)
    at = len(blob)
    p.write_bytes(blob + b"".join(frame(BATCH, b) for b in batches) + frame(*end))
    info = CaptureInfo(p)
    read = list(read_records(p, info))
    assert sum(r.type == 4 for r in read) == 100 and read[-1].type == 10     # the base's own BATCH + 99
    assert info.problem == (f"corrupt at byte {at}: BATCH record.live: expected a non-negative integer, got -1; "
                            f"skipped (the rest was read)")
    rc, _, err = run_cli(capsys, "show", p)
    assert rc == 1 and err == f"memtrace: warning: {p}: {info.problem}\n"


def test_a_damaged_record_header_is_skipped_to_the_next_intact_record(tmp_path: Path) -> None:
    """A flipped length cannot be trusted: the reader finds the next record whose header check and
    checksum hold (no traceback, no misreading) and reads on from there."""
    from tests.hostile_captures import frame, header

    recs = base()
    frames = [frame(t, pl) for t, pl in recs]
    p = tmp_path / "c.mtc"
    at = len(header()) + sum(map(len, frames[:2]))
    damaged = bytearray(frames[2])
    damaged[4] ^= 0x40                    # the MODULES record's length
    p.write_bytes(header() + b"".join(frames[:2]) + bytes(damaged) + b"".join(frames[3:]))
    info = CaptureInfo(p)
    read = list(read_records(p, info))
    assert [r.offset for r in read] == [o for o in _offsets(frames) if o != at]
    assert info.skipped == [f"byte {at}: record header checksum mismatch; {len(frames[2])} bytes skipped to the "
                            f"next intact record"]


def _offsets(frames: list[bytes]) -> list[int]:
    from tests.hostile_captures import header

    out, at = [], len(header())
    for f in frames:
        out.append(at)
        at += len(f)
    return out
