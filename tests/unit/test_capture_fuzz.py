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
from tests.hostile_captures import (
    absurd_cases,
    aggregate_base,
    base,
    frame,
    header,
    js,
    random_absurd,
    scratch_dir,
    write_records,
)

from memtrace import tracers
from memtrace.analyze.families import load_rules
from memtrace.capture import CaptureError, CaptureInfo, CaptureWriter, Record, read_records, record_to_json
from memtrace.errors import MemtraceError
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
    # Each complete prefix: one a stored record (a group of records -- format 8's opening records,
    # a stretch of drains -- is read whole or not at all).
    stored, at = 0, 16
    while at < len(blob):
        at += (8 if version == 1 else 12) + int.from_bytes(blob[at + 4:at + 8], "little")
        stored += 1
    assert len(check.seen) == stored


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


@pytest.mark.slow
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


@pytest.mark.slow
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


# ---- absurd values through every command (issue 26) -----------------------------------------------

ABSURD = dict(absurd_cases())
STRUCTURAL = [n for n in ABSURD if not n.startswith(("agent-", "json-", "events-"))]
SEEDS = range(40)               # random mixes: the seed names the capture, so a failure reproduces
CLI_COMMANDS: list[list[str]] = [
    ["show", "{cap}"], ["show", "--json", "{cap}"], ["export", "{cap}"],
    *[["export", "--format", f, "--view", v, "-o", "{out}/x", "{cap}"]
      for f in ("collapsed", "speedscope", "pprof", "chrome-trace") for v in ("gross", "live", "peak", "leaked")],
    ["flamegraph", "-o", "{out}/f.html", "{cap}"], ["report", "{dir}", "--out", "{out}/r"],
    ["diff", "{base}", "{cap}"], ["symbolize", "{cap}"],
]


def run_every_command(recs: list[tuple[int, bytes]], where: Path) -> list[tuple[str, int, str]]:
    """Every command on the crafted capture, in process: (command, exit status, stderr) each; a
    traceback fails the test where it happens, naming the command."""
    import contextlib
    import io
    import shutil

    from memtrace import cli

    shutil.rmtree(where, ignore_errors=True)
    cap = write_records(where / "case" / "capture.mtc", recs)
    base_cap = write_records(where / "base" / "capture.mtc", aggregate_base())
    out = where / "out"
    out.mkdir()
    done = []
    for cmd in CLI_COMMANDS:
        args = [a.format(cap=cap, dir=cap.parent, out=out, base=base_cap) for a in cmd]
        err = io.StringIO()
        stdout = io.TextIOWrapper(io.BytesIO())
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
            try:
                cli.main(args)
                code = 0
            except SystemExit as e:
                code = int(e.code or 0)
        text = err.getvalue()
        assert "Traceback" not in text, (args, text)
        done.append((cmd[0], code, text))
    return done


def _names_the_bad_record(results: list[tuple[str, int, str]]) -> None:
    for command, code, text in results:
        if command in ("show", "export", "report", "flamegraph", "symbolize"):
            # One warning or error naming where the capture went wrong, and a non-zero exit.
            assert code != 0, (command, text)
            assert "corrupt at byte" in text or "first record is" in text, (command, text)


def test_the_aggregate_base_reads_clean(scratch: Path) -> None:
    results = run_every_command(aggregate_base(), scratch / "w")
    assert [(c, code) for c, code, _ in results if code != 0] == []


# Structural cases that are true to the format (an AGG with no values, a stack of no frames).
TRUE_TO_FORMAT = {"agg-no-values", "stack-0-frames"}


@pytest.mark.parametrize("name", sorted(TRUE_TO_FORMAT))
def test_structural_oddities_the_format_allows_read_clean(scratch: Path, name: str) -> None:
    results = run_every_command(ABSURD[name], scratch / "w")
    assert [(c, code) for c, code, _ in results if code != 0] == []


@pytest.mark.parametrize("name", sorted(set(STRUCTURAL) - TRUE_TO_FORMAT))
def test_structural_lies_through_every_command(scratch: Path, name: str) -> None:
    """AGG masks beyond the fields or with more bits than values, PEAK_HEADs naming 2^32-1 stacks
    that never follow, stack ids pointing nowhere ...: skipped and named, every command exits 1."""
    _names_the_bad_record(run_every_command(ABSURD[name], scratch / "w"))


@pytest.mark.parametrize("seed", SEEDS)
def test_random_absurd_values_through_every_command(scratch: Path, seed: int) -> None:
    """Several absurd values at once (seeded: ``random_absurd(seed)`` rebuilds the capture)."""
    run_every_command(random_absurd(seed), scratch / "w")


@pytest.mark.slow
def test_every_absurd_value_of_every_record_never_tracebacks(scratch: Path) -> None:
    """Each agent field and each JSON number of every record type at 0, 2^31, 2^32-1, 2^63-1,
    2^63, 2^64-1 (and -1, 2^64, 10^30, 1e308 in JSON): the reader skips what cannot be, the
    summary, every export format and view, the JSON-lines view and the report's collection cope."""
    from memtrace.exports import FORMATS
    from memtrace.views import load

    v = scratch / "c" / "capture.mtc"
    refused = 0
    for name, recs in ABSURD.items():
        write_records(v, recs)
        try:
            loaded = load(v)
        except (CaptureError, MemtraceError):
            refused += 1
            continue
        loaded.summary.to_json(capture=str(v), top=10)
        for fmt, writer in FORMATS.items():
            for view in loaded.tracer.views:
                try:
                    writer(loaded, view)
                except MemtraceError as e:
                    assert "\n" not in str(e), (name, fmt, view)
        consume(v)
        refused += loaded.info.problem is not None
    assert len(ABSURD) > 700 and refused > 300


@pytest.mark.slow
def test_every_absurd_case_through_every_command(scratch: Path) -> None:
    """All of them (about 1000 captures, 21 commands each) through the real CLI: no traceback."""
    codes: dict[tuple[str, int], int] = {}
    for recs in ABSURD.values():
        for command, code, _ in run_every_command(recs, scratch / "w"):
            codes[(command, code)] = codes.get((command, code), 0) + 1
    print(sorted(codes.items()))
    assert sum(codes.values()) == len(ABSURD) * len(CLI_COMMANDS)


# ---- writers with limits (issue 26, item 2) ----------------------------------------------------------


def test_pprof_clamps_a_sum_past_int64_and_says_so_in_one_line(scratch: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Two stacks with the same frames, 1.5 x 2^62 bytes each (each a total the reader accepts):
    their row's sum does not fit pprof's int64.  Clamped, one warning line, exit 1, a whole file."""
    import gzip

    from tests.hostile_captures import _aggregate_records
    from tests.unit.test_capture_hostile import run_cli

    from memtrace.exports.pprof import Profile

    agent = _aggregate_records()
    agent[1].update(nframes=2, frames=[0x1010, 0x1020])        # stack 2 symbolizes as stack 1
    big = 3 << 61
    agent[2]["values"] = [3, big, *agent[2]["values"][2:]]
    agent[3]["values"] = [1, big]
    cap = write_records(scratch / "c" / "capture.mtc", aggregate_base(agent))
    out = scratch / "p.pb.gz"
    rc, _, err = run_cli(capsys, "export", "--format", "pprof", "--view", "gross", "-o", out, cap)
    assert rc == 1
    # One line per sample type that overflowed (the blocks are live: alloc_space and inuse_space).
    lines = err.splitlines()
    assert lines[0] == (f"memtrace: warning: {cap}: pprof: a sample's alloc_space: {2 * big} does not fit a 64-bit "
                        f"signed integer; written as {(1 << 63) - 1}")
    assert all(line.startswith(f"memtrace: warning: {cap}: pprof: a sample's ") for line in lines) and len(lines) <= 2
    prof = Profile()
    prof.ParseFromString(gzip.decompress(out.read_bytes()))
    assert max(s.value[1] for s in prof.sample) == (1 << 63) - 1      # alloc_space


def test_chrome_trace_clamps_a_time_beyond_its_microseconds(scratch: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tests.hostile_captures import CALIBRATION
    from tests.unit.test_capture_hostile import run_cli

    recs = aggregate_base()
    i = max(i for i, (t, _) in enumerate(recs) if t == CALIBRATION)
    recs[i] = (CALIBRATION, js({"phase": "after", "t": 1e300, "allocator": {"source": "x", "in_use": 5},
                                "footprint": {"source": "x", "footprint": 9}}))
    cap = write_records(scratch / "c" / "capture.mtc", recs)
    out = scratch / "t.json"
    rc, _, err = run_cli(capsys, "export", "--format", "chrome-trace", "-o", out, cap)
    assert rc == 1 and err.count("\n") == 1
    assert err.startswith(f"memtrace: warning: {cap}: chrome-trace: a timestamp (microseconds): ")
    doc = json.loads(out.read_text())          # valid JSON: no Infinity
    assert max(e.get("ts", 0) for e in doc["traceEvents"]) == float(1 << 53)
