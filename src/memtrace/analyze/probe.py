"""The routing probe's truth table, offline, and its Markdown rendering.

Pure: capture records in (the agent's RESULT record), a :class:`ProbeSummary` out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import msgspec
from msgspec import Struct

from memtrace.analyze.context import CaptureContext, fold_context
from memtrace.capture import Record, RecordType, Result
from memtrace.reporters.markdown import Markup, code, join, table, text
from memtrace.schema import UNSET, Count, Maybe, Num, Shape
from memtrace.units import fmt_exact

STATE_NAMES = {0: "NONVOLATILE", 1: "VOLATILE", 2: "EMPTY", 3: "DENY"}
LEDGER_KEYS = ("footprint", "purgeable_volatile", "purgeable_nonvolatile", "reusable")


class ProbeRow(Struct):
    """One entry the probe drove: did it move the purgeable state machine, and the ledger's moves."""

    entry: str | None = None
    drives_state_machine: bool | None = None
    state_before: int | None = None
    state_after: int | None = None
    ledger_delta: dict[str, int | float | None] | None = None
    error: str | None = None


class ProbeTable(Struct):
    """The probe's result, typed: what the console prints (the JSON keeps the agent's rows as sent)."""

    platform: str | None
    bytes: int | None
    madvise_entry: str | None
    rows: list[ProbeRow]
    errors: list[str]


class ProbeSummary(CaptureContext):
    tracer_name: ClassVar[str] = "probe"
    result: dict[str, Any] | None = None

    def failure(self) -> str | None:
        return failure(self)

    def table(self) -> ProbeTable:
        r = self.result or {}
        errors = [str(e) for e in r.get("errors", [])]
        if self.result is None:
            errors.append("the agent sent no probe result")
        # The capture reader checked the RESULT against ProbeResult: these rows convert.
        return ProbeTable(r.get("platform"), r.get("bytes"), r.get("madvise_entry"),
                          msgspec.convert(r.get("rows", []), list[ProbeRow]), errors)

    def to_json(self, capture: str | None = None, top: int = 0) -> dict[str, Any]:
        r = self.result or {}
        errors = list(r.get("errors", []))
        if self.result is None:
            errors.append("the agent sent no probe result")
        return {
            **self.header_json(self.tracer_name, capture),
            "platform": r.get("platform"),
            "bytes": r.get("bytes"),
            "madvise_entry": r.get("madvise_entry"),
            "ledger_available": r.get("ledger_available", False),
            "rows": r.get("rows", []),
            "errors": errors,
            "missing": self.missing,
        }


def failure(summary: ProbeSummary) -> str | None:
    """Why the probe could not run (so the command exits non-zero), or None when it ran."""
    r = summary.result
    if r is None:
        return "the agent sent no probe result"
    if r.get("errors"):
        return str(r["errors"][0]).removeprefix("cannot run: ")
    if not r.get("rows"):
        return "no entry could be probed"
    return None


def summarize(records: Iterable[Record]) -> ProbeSummary:
    s = ProbeSummary()
    for rec in records:
        if rec.type == RecordType.RESULT and rec.body.get("tracer") == ProbeSummary.tracer_name:
            s.result = rec.body
        else:
            fold_context(s, rec)
    return s


def _state(v: Any) -> str:
    return "—" if v is None else f"{v} {STATE_NAMES.get(v, '?')}"


def render_markdown(probe: dict[str, Any]) -> str:
    """The truth table: entry | drives the state machine? | state | ledger moves in bytes."""
    lines = [f"## Purgeable routing probe — {text(probe.get('target') or '')}", ""]
    size = probe.get("bytes")
    if size:
        lines.append(f"One {size:,}-byte purgeable mapping (`mach_vm_allocate(ANYWHERE|PURGABLE)`); "
                     f"madvise entry: {code(probe.get('madvise_entry'))}; platform: {text(probe.get('platform'))}.")
        lines.append("")
    for e in probe.get("errors", []):
        lines.append(f"> **error:** {text(e)}")
    if probe.get("missing"):
        lines.append(f"> **MISSING:** {join(probe['missing'])}")
    if probe.get("errors") or probe.get("missing"):
        lines.append("")
    if probe.get("rows"):
        rows = []
        for row in probe["rows"]:
            drives = row.get("drives_state_machine")
            d = row.get("ledger_delta") or {}
            cells: list[Any] = [code(row.get("entry")),
                                "—" if drives is None else (Markup("**yes**") if drives else "no"),
                     f"{_state(row.get('state_before'))} → {_state(row.get('state_after'))}"]
            cells += [fmt_exact(d.get(k), signed=True) for k in LEDGER_KEYS]
            if row.get("error"):
                cells[1] = row["error"]
            rows.append(cells)
        lines += table(["entry", "drives the state machine?", "state before → after", "Δ footprint",
                        "Δ purgeable volatile", "Δ purgeable nonvolatile", "Δ reusable"], "lllrrrr", rows)
    else:
        lines.append("")
    return "\n".join(lines)


# ---- the RESULT the capture reader checks (registered by tracers/probe.py's TRACER.result) --------


class _ProbeRow(Shape):
    entry: Maybe[str] = UNSET
    drives_state_machine: bool | None = None
    state_before: int | None = None
    state_after: int | None = None
    ledger_delta: dict[str, Num | None] | None = None
    error: str | None = None


class ProbeResult(Result):
    platform: str | None = None
    bytes: Count | None = None
    madvise_entry: str | None = None
    ledger_available: Maybe[bool] = UNSET
    rows: Maybe[list[_ProbeRow]] = UNSET
    errors: Maybe[list[str]] = UNSET
