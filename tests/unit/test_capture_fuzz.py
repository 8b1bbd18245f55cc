"""Damage at every byte (issue 10.7, issue 14): flips and truncations of real captures.

In a checksummed capture (format 2) every flip is detected -- reported with the byte offset of
the record it hit -- or changes nothing; in a version-1 capture (no checksums) a flip may go
unseen, but nothing ever raises a traceback: not the reader, not `export`'s JSON view, not the
report's collection, not any tracer's analyzer.  Wrong JSON types anywhere in a record's body are
refused by the reader's shape checks before an analyzer sees them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.hostile_captures import base, frame, header, js, scratch_dir

from memtrace import tracers
from memtrace.analyze.families import load_rules
from memtrace.capture import CaptureError, CaptureInfo, CaptureWriter, Record, read_records, record_to_json
from memtrace.report.collect import analyze_capture

DATA = Path(__file__).resolve().parents[1] / "data" / "report" / "captures"
SMALL = ("alpha-malloc", "camera-iosurface", "camera-purgeable")     # 1.8 to 3 KB each
RULES = load_rules(None)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    with scratch_dir(tmp_path) as d:
        yield d


def as_v2(src: Path, dst: Path) -> Path:
    """The same records written by this memtrace's writer (format 2, checksummed)."""
    with CaptureWriter(dst, reserve=0) as w:
        for r in read_records(src):
            w.write(r.type, r.body, r.data)
    return dst


def records_of(p: Path) -> tuple[list[tuple[Any, ...]], str | None]:
    """Every record as comparable values, and the reader's complaint (None: read in full)."""
    info = CaptureInfo(p)
    try:
        recs = [(r.type, json.dumps(r.body, sort_keys=True), r.data) for r in read_records(p, info)]
    except CaptureError as e:
        return [], str(e)
    return recs, info.problem


def consume(p: Path) -> None:
    """Everything a user can run on a capture; only a CaptureError (one line) may come out."""
    try:
        for r in read_records(p):
            for _ in record_to_json(r):
                pass
        analyze_capture(p, p.parent, RULES)
        for tracer in tracers.all_tracers().values():
            tracer.summarize(read_records(p)).to_json()
    except CaptureError:
        pass


@pytest.mark.parametrize("name", SMALL)
def test_every_bit_flip_of_a_checksummed_capture_is_detected_or_harmless(scratch: Path, name: str) -> None:
    tmp_path = scratch
    p = as_v2(DATA / name / "capture.mtc", tmp_path / "orig.mtc")
    blob = p.read_bytes()
    original, problem = records_of(p)
    assert problem is None
    v = tmp_path / "v.mtc"
    detected = 0
    for off in range(len(blob)):
        for bit in (off % 8,):
            b = bytearray(blob)
            b[off] ^= 1 << bit
            v.write_bytes(b)
            got, problem = records_of(v)
            if problem is None:
                assert got == original, f"flip at byte {off} bit {bit} changed records silently"
            else:
                detected += 1
                assert problem.startswith("corrupt at byte") or ": corrupt header" in problem or "bad magic" in problem
    assert detected == len(blob)      # the format has no byte a flip leaves unchecked


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_multi_byte_damage_is_detected_or_harmless(tmp_path: Path, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(SMALL))
    p = tmp_path / f"{name}.mtc"
    if not p.exists():
        as_v2(DATA / name / "capture.mtc", p)
    blob = bytearray(p.read_bytes())
    original, _ = records_of(p)
    off = data.draw(st.integers(0, len(blob) - 1))
    junk = data.draw(st.binary(min_size=1, max_size=16))
    blob[off:off + len(junk)] = junk
    v = tmp_path / "v.mtc"
    v.write_bytes(blob)
    got, problem = records_of(v)
    assert problem is not None or got == original
    consume(v)


class Consumer:
    """consume() once per distinct thing the reader returns: what follows depends on nothing else."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def __call__(self, p: Path) -> tuple[list[tuple[Any, ...]], str | None]:
        got, problem = records_of(p)
        key = hash((tuple(got), problem is None))
        if key not in self.seen:
            self.seen.add(key)
            consume(p)
        return got, problem


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.slow
def test_flips_of_version_1_captures_never_traceback(scratch: Path, name: str) -> None:
    tmp_path = scratch
    blob = (DATA / name / "capture.mtc").read_bytes()
    v = tmp_path / name / "capture.mtc"
    v.parent.mkdir()
    check = Consumer()
    for off in range(len(blob)):
        b = bytearray(blob)
        b[off] ^= 1 << (off % 8)
        v.write_bytes(b)
        check(v)
    assert len(check.seen) > 100


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("name", SMALL)
def test_every_truncation_reads_the_prefix_and_says_so(scratch: Path, name: str, version: int) -> None:
    tmp_path = scratch
    src = DATA / name / "capture.mtc"
    p = src if version == 1 else as_v2(src, tmp_path / "orig.mtc")
    blob = p.read_bytes()
    original, _ = records_of(p)
    v = tmp_path / "cut" / "capture.mtc"
    v.parent.mkdir()
    check = Consumer()
    for cut in range(16, len(blob)):
        v.write_bytes(blob[:cut])
        got, problem = check(v)
        assert got == original[:len(got)] and problem is not None
    assert len(check.seen) == len(original)     # each complete prefix


def paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every node of a JSON value (first element only of long lists: siblings share a shape)."""
    yield at
    if isinstance(value, dict):
        for k, x in value.items():
            yield from paths(x, (*at, k))
    elif isinstance(value, list):
        for i, x in enumerate(value[:2]):
            yield from paths(x, (*at, i))


def replaced(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[at[0]] = replaced(value[at[0]], at[1:], new)
    return copy


WRONG = (None, True, -1, 2.5, "0xZZ", "", [], {}, [[]])


@pytest.mark.parametrize("tracer", ["malloc", "purgeable"])
def test_any_json_node_of_any_type_never_reaches_an_analyzer_malformed(scratch: Path, tracer: str) -> None:
    """Each node of each record replaced by each JSON type (checksums valid): the reader refuses
    the record or the analyzers cope; nothing raises."""
    recs = base(tracer)
    v = scratch / "c" / "capture.mtc"
    v.parent.mkdir()
    tried = 0
    for i, (rtype, payload) in enumerate(recs):
        is_batch = rtype == 4
        body = json.loads(payload[4:4 + int.from_bytes(payload[:4], "little")] if is_batch else payload)
        for at in paths(body):
            for new in WRONG:
                changed = js(replaced(body, at, new))
                if is_batch:
                    changed = len(changed).to_bytes(4, "little") + changed + payload[4 + len(js(body)):]
                crafted = [*recs[:i], (rtype, changed), *recs[i + 1:]]
                v.write_bytes(header() + b"".join(frame(t, pl) for t, pl in crafted))
                consume(v)
                tried += 1
    assert tried > 300


def test_real_records_with_wrong_types_never_traceback(scratch: Path) -> None:
    """The same over the records of the real-shaped captures in tests/data (one node of each kind)."""
    v = scratch / "c" / "capture.mtc"
    v.parent.mkdir()
    for name in SMALL:
        recs: list[Record] = list(read_records(DATA / name / "capture.mtc"))
        for i, rec in enumerate(recs):
            for at in list(paths(rec.body))[:40]:
                for new in (None, "0xZZ", [], {}):
                    with CaptureWriter(v, reserve=0) as w:
                        for j, r in enumerate(recs):
                            w.write(r.type, replaced(r.body, at, new) if j == i else r.body, r.data)
                    consume(v)
                    v.unlink()
