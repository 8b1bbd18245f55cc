"""The probe analyzer and its Markdown table, from a synthetic RESULT record."""

from __future__ import annotations

from pathlib import Path

from memtrace.analyze.probe import render_markdown, summarize
from memtrace.capture import CaptureWriter, RecordType, read_records


def test_table_and_missing(tmp_path: Path) -> None:
    p = tmp_path / "c.mtc"
    row = {"entry": "SET_STATE EMPTY", "drives_state_machine": True, "state_before": 0, "state_after": 2,
           "ledger_delta": {"footprint": -4096, "purgeable_volatile": 0, "purgeable_nonvolatile": -4096,
                            "reusable": 0}}
    alloc = {"entry": "mach_vm_allocate(ANYWHERE|PURGABLE)", "drives_state_machine": None, "state_before": None,
             "state_after": 0, "ledger_delta": {"footprint": 4096, "purgeable_volatile": 0,
                                                "purgeable_nonvolatile": 4096, "reusable": 0}}
    with CaptureWriter(p) as w:
        w.write(RecordType.META, {"target": {"label": "t"}})
        w.write(RecordType.RECON, {"symbols": [{"name": "task_info", "status": "MISSING"}]})
        w.write(RecordType.RESULT, {"type": "result", "tracer": "probe", "bytes": 4096, "rows": [alloc, row],
                                    "errors": [], "madvise_entry": "madvise", "platform": "darwin"})
    s = summarize(read_records(p)).to_json()
    assert s["rows"] == [alloc, row]
    assert s["missing"] == ["task_info"]
    assert s["ended"] == "truncated"
    md = render_markdown(s)
    assert "| `SET_STATE EMPTY` | **yes** | 0 NONVOLATILE → 2 EMPTY | −4,096 B | 0 B | −4,096 B | 0 B |" in md
    assert "| `mach_vm_allocate(ANYWHERE\\|PURGABLE)` | — | — → 0 NONVOLATILE | +4,096 B | 0 B | +4,096 B | 0 B |" in md
    assert "**MISSING:** task_info" in md


def test_no_result_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "c.mtc"
    with CaptureWriter(p) as w:
        w.write(RecordType.END, {"ended": "anti-debug", "reason": "script load hung"})
    s = summarize(read_records(p)).to_json()
    assert s["errors"] == ["the agent sent no probe result"]
    assert s["rows"] == []
    assert "the agent sent no probe result" in render_markdown(s)
