"""The one schema mechanism (memtrace/schema.py, msgspec Structs): each tracer's events and results
are its own and registered through its Tracer; a mismatch is said in one phrase naming the place and
the value; the value types hold their bounds."""

from __future__ import annotations

from typing import Any

import pytest

from memtrace import capture, schema, tracers
from memtrace.analyze import fds as fds_analysis
from memtrace.analyze import purgeable as purgeable_analysis
from memtrace.analyze import threads as threads_analysis
from memtrace.analyze.leaks import LeakResult
from memtrace.analyze.probe import ProbeResult
from memtrace.capture import RecordType


def events_problem(*events: dict[str, Any]) -> str | None:
    found = capture._body_problem(RecordType.EVENTS, {"events": list(events)})
    return None if found is None else "".join(found) if not found[0] else f"{found[0]}: {found[1]}"


def test_every_tracers_event_types_come_from_its_tracer() -> None:
    by_type, results = capture._tracer_schemas()
    declared = {t: {e.__module__ for e in types} for t, types in by_type.items()}
    # Each type an agent writes is declared by the analyzer of a tracer that writes it, nowhere else.
    assert declared["open"] == {"memtrace.analyze.fds"}
    assert declared["set"] == {"memtrace.analyze.purgeable"}
    assert declared["surface"] == {"memtrace.analyze.iosurface"}
    assert declared["rename"] == {"memtrace.analyze.threads"}
    # Two tracers write "create" (purgeable's creation entries, threads' pthread_create): both check it.
    assert declared["create"] == {"memtrace.analyze.purgeable", "memtrace.analyze.threads"}
    assert results == {"malloc": LeakResult, "probe": ProbeResult}
    for tracer in tracers.all_tracers().values():
        for event_type in tracer.event_types:
            assert issubclass(event_type, capture.Event) and event_type.TYPE, (tracer.name, event_type)
    assert tracers.get("fds").event_types == fds_analysis.EVENTS      # type: ignore[union-attr]
    assert tracers.get("threads").event_types == threads_analysis.EVENTS      # type: ignore[union-attr]
    assert tracers.get("purgeable").event_types == purgeable_analysis.EVENTS      # type: ignore[union-attr]


def test_an_event_is_checked_by_the_type_its_tracer_declares() -> None:
    frames = ["0x1010"]
    assert events_problem({"type": "open", "call": "open", "fds": [3], "from": 4, "frames": frames}) is None
    assert events_problem({"type": "open", "call": "open", "from": "4"}) == \
        ".events[0].from: expected an integer, got '4'"
    assert events_problem({"type": "census", "fds": [[3, "file"], [4]]}) == \
        ".events[0].fds[1]: expected at least 2 elements, got 1"
    # The first bad one, in order, whatever its type.
    assert events_problem({"type": "set", "addr": "0x10"}, {"type": "rename", "name": 5},
                          {"type": "set", "addr": "nowhere"}) == ".events[1].name: expected a string, got 5"
    # Both tracers' "create": purgeable's flags and threads' stack_size are each checked.
    assert events_problem({"type": "create", "flags": "x"}) == ".events[0].flags: expected an integer, got 'x'"
    assert events_problem({"type": "create", "stack_size": -1}) == \
        ".events[0].stack_size: expected a non-negative integer, got -1"
    # A type no tracer declares (a newer agent): what every event has is still checked.
    assert events_problem({"type": "brand-new", "anything": [1]}) is None
    assert events_problem({"type": "brand-new", "frames": ["0xZZ"]}) == \
        ".events[0].frames[0]: expected an address, got '0xZZ'"
    assert events_problem({"type": 7, "tid": "x"}) == ".events[0].type: expected a string, got 7"


def test_a_result_is_checked_by_its_tracers_type() -> None:
    def result(body: Any) -> tuple[str, str] | None:
        return capture._body_problem(RecordType.RESULT, body)

    assert result({"tracer": "probe", "rows": [{"entry": "x", "ledger_delta": {"a": None, "b": 1.5}}]}) is None
    assert result({"tracer": "probe", "rows": [{"entry": "x", "ledger_delta": {"a": 1, "b": "c"}}]}) == \
        (".rows[0].ledger_delta.b", "expected a finite number, got 'c'")
    assert result({"tracer": "malloc", "definitely_by_stack": [[1, 2, 3], [1, 2]]}) == \
        (".definitely_by_stack[1]", "expected at least 3 elements, got 2")
    assert result({"tracer": "someone-else", "rows": 5}) is None


@pytest.mark.parametrize(("value", "said"), [
    (-1, "expected a non-negative integer, got -1"),
    (1 << 63, "expected a count below 2^63, got 9223372036854775808"),
    (1 << 64, "expected a count below 2^63, got 18446744073709551616"),
    (True, "expected a non-negative integer, got True"),
    (2.0, "expected a non-negative integer, got 2.0"),
    ("1", "expected a non-negative integer, got '1'"),
])
def test_a_count_holds_its_bounds(value: Any, said: str) -> None:
    assert capture._body_problem(RecordType.BATCH, {"lost": value}) == (".lost", said)


def test_value_types() -> None:
    class Doc(schema.Shape):
        at: schema.Maybe[schema.Addr] = schema.UNSET
        t: schema.Time | None = None
        amount: schema.Maybe[schema.Amount] = schema.UNSET
        line: schema.Maybe[schema.Line] = schema.UNSET

    ok = [{"at": "0x7fb5b893c75e"}, {"at": "FFFF"}, {"at": 4096}, {"t": None}, {"t": 1.5}, {"amount": 0},
          {"line": (1 << 32) - 1}, {"unknown": [1, 2]}]
    for doc in ok:
        assert schema.problem(doc, Doc) is None, doc
    bad = {
        "at": ["0x", "0x1\n", "0x12345678901234567", -1, None, 1.0],
        "t": [float(1 << 53), "now", True],
        "amount": [-1, float(1 << 63), None],
        "line": [1 << 32, -1],
    }
    for key, values in bad.items():
        for v in values:
            found = schema.problem({key: v}, Doc)
            assert found is not None and found[0] == f".{key}", (key, v, found)


class _ProcessRow(schema.Shape):
    pid: int
    footprint: int | None = None


class _Document(schema.Shape):
    rows: list[_ProcessRow]
    counts: schema.Maybe[dict[str, int]] = schema.UNSET


def test_a_document_problem_reads_as_a_report_says_it() -> None:
    Doc = _Document
    assert schema.document_problem({"rows": []}, Doc) is None
    assert schema.document_problem({}, Doc) == "document: missing 'rows'"
    assert schema.document_problem([1], Doc) == "document: expected an object, got [1]"
    assert schema.document_problem({"rows": [{"pid": 1, "footprint": "x"}]}, Doc) == \
        "rows[0].footprint: expected an integer or null, got 'x'"
    assert schema.document_problem({"rows": [], "counts": {"a": 1, "b": True}}, Doc) == \
        "counts.b: expected an integer, got True"


def test_bodies_stay_the_json_they_were() -> None:
    """The Structs only check: what the analyzers get is the decoded JSON, unknown keys and all."""
    body = {"counters": [0] * 64, "lost": 0, "newer_key": {"x": [1]}, "sample": {"top": [[1, 2, "extra"]]}}
    payload = capture.encode_record(RecordType.BATCH, body)
    record = capture._decode(RecordType.BATCH, payload[capture.RECORD_HEADER.size:], 3)
    assert record is not None and isinstance(record.body, dict)
    assert record.body["newer_key"] == {"x": [1]} and record.body["sample"]["top"] == [[1, 2, "extra"]]


def test_the_one_pass_events_check_agrees_with_the_event_by_event_one() -> None:
    """An EVENTS record is checked in one msgspec pass over its text; only when that fails is each
    event checked by its tracers' types, which says which one and why.  Both say the same."""
    import json

    cases: list[list[Any]] = [
        [{"type": "open", "call": "open", "fds": [3], "from": 4, "frames": ["0x1"]}, {"type": "exit", "tid": 3}],
        [{"type": "create", "entry": "x", "addr": "0x10", "flags": 0, "routine": "0x20", "stack_size": 8}],
        [{"type": "create", "flags": "x"}], [{"type": "create", "stack_size": -1}],
        [{"type": "create-failed", "via": 5}], [{"type": "create-failed", "errno": "x"}],
        [{"type": "brand-new", "x": 1}], [{"type": "brand-new", "frames": ["0xZZ"]}], [{"frames": []}],
        [{"type": "counts", "controls": {"a": {"b": 1}}}], [{"type": "counts", "controls": {"a": {"b": -1}}}],
        [{"type": "census", "fds": [[3, None], [4, "x", "extra"]]}], [{"type": "census", "fds": [[3]]}],
        [{"type": "set", "t": None, "tid": None, "control": "c"}], [{"type": "set", "control": True}],
        [{"type": "use", "surface": None}], [1], [{"type": None}],
    ]
    assert capture._events_decoder() is not None
    for events in cases:
        body = {"events": events}
        one_pass = capture._body_problem(RecordType.EVENTS, body, json.dumps(body).encode())
        assert one_pass == capture._body_problem(RecordType.EVENTS, body), events
    assert capture._body_problem(RecordType.EVENTS, {"events": [{"type": "set", "control": True}]}) == \
        (".events[0].control", "expected a string or an integer, got True")
