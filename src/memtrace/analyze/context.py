"""What every analyzer reads the same way: who/what/how it ended, recon, calibration, symbols."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from memtrace.analyze.symbols import SymbolTable
from memtrace.capture import Record, RecordType


class HasContext(Protocol):
    meta: dict[str, Any]
    end: dict[str, Any]
    recon: list[dict[str, Any]]
    missing: list[str]
    symbols: SymbolTable
    warnings: list[dict[str, Any]]


def fold_context(s: HasContext, rec: Record) -> bool:
    """Fold a record every tracer shares into ``s``; False when the record is the tracer's own."""
    t = rec.type
    if t == RecordType.SYMBOLS:
        s.symbols.add_rows(rec.body.get("rows", []))
    elif t == RecordType.MODULES:
        s.symbols.add_modules(rec.body.get("modules", []))
    elif t == RecordType.META:
        s.meta = rec.body
    elif t == RecordType.RECON:
        s.recon = rec.body.get("symbols", [])
        s.missing = [r["name"] for r in s.recon if r.get("status") == "MISSING"]
        if hasattr(s, "info"):
            s.info = rec.body.get("info", {})
    elif t == RecordType.CALIBRATION:
        if hasattr(s, "calibration"):
            s.calibration[rec.body.get("phase", "?")] = rec.body
    elif t == RecordType.END:
        s.end = rec.body      # the last END wins (a batch may append its verdict)
    elif t == RecordType.WARNING:
        s.warnings.append(rec.body)
    else:
        return False
    return True


@dataclass
class CaptureContext:
    """The fields :func:`fold_context` fills, for analyzers to inherit."""

    meta: dict[str, Any] = field(default_factory=dict)
    end: dict[str, Any] = field(default_factory=dict)
    recon: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    symbols: SymbolTable = field(default_factory=SymbolTable)
    warnings: list[dict[str, Any]] = field(default_factory=list)


class FoldsEvents(HasContext, Protocol):
    def fold_event(self, ev: dict[str, Any]) -> None: ...


S = TypeVar("S", bound=FoldsEvents)


def fold_events(s: S, records: Iterable[Record]) -> S:
    """A JSON-event tracer's whole capture: its own events to ``s.fold_event``, the rest shared."""
    for rec in records:
        if rec.type == RecordType.EVENTS:
            for ev in rec.body.get("events", []):
                s.fold_event(ev)
        else:
            fold_context(s, rec)
    return s


def event_frames(ev: dict[str, Any]) -> tuple[int, ...]:
    """A JSON event's stack ("frames": ["0x...", ...]) as addresses."""
    return tuple(int(f, 16) if isinstance(f, str) else int(f) for f in ev.get("frames") or ())
