"""What every analyzer reads the same way: who/what/how it ended, recon, calibration, symbols."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from memtrace.analyze.symbols import SymbolTable
from memtrace.capture import Record, RecordType
from memtrace.frames import Frame, stack_key

T = TypeVar("T")


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


NO_END = "the capture ends without an END record (memtrace or the machine died)"
# The version of every summary's --json shape (docs/json-schema.md); bumped on incompatible change.
SCHEMA_VERSION = 1


@dataclass
class CaptureContext:
    """The fields :func:`fold_context` fills, for analyzers to inherit, and the stack views they share."""

    meta: dict[str, Any] = field(default_factory=dict)
    end: dict[str, Any] = field(default_factory=dict)
    recon: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    symbols: SymbolTable = field(default_factory=SymbolTable)
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def header_json(self, tracer: str, capture: str | None) -> dict[str, Any]:
        """What every summary's JSON opens with: which capture, which target, how it ended."""
        out = {"schema_version": SCHEMA_VERSION, "capture": capture, "tracer": tracer,
               "target": self.meta.get("target", {}).get("label"),
               "ended": self.end.get("ended", "truncated"), "reason": self.end.get("reason", NO_END)}
        if self.info.get("covers"):
            out["recorded_by"] = self.info["covers"]      # --backend dvt: what the device's service recorded
        return out

    def timing_json(self) -> dict[str, Any]:
        return {"window_s": self.meta.get("options", {}).get("window"),
                "captured_s": self.end.get("timing", {}).get("captured_s")}

    def stack(self, addresses: tuple[int, ...]) -> list[Frame]:
        return self.symbols.stack(addresses)

    def by_stack(self, items: Iterable[tuple[tuple[int, ...], T]]) -> list[tuple[list[Frame], list[T]]]:
        """Items grouped by their whole symbolized stack: the same frames (function and source
        position) are one group, however many return addresses led there."""
        groups: dict[Any, tuple[list[Frame], list[T]]] = {}
        for addresses, item in items:
            frames = self.stack(addresses)
            key = stack_key(frames)
            g = groups.get(key)
            if g is None:
                g = groups[key] = (frames, [])
            g[1].append(item)
        return list(groups.values())

    def caller(self, frames: list[Frame], skip_modules: tuple[str, ...] = ()) -> str | None:
        """The first frame outside ``skip_modules`` (module name prefixes), by function name."""
        for f in frames:
            if f.module is None or not f.module.startswith(skip_modules) or not skip_modules:
                return f.function or f.name()
        return frames[0].name() if frames else None


def frames_json(frames: list[Frame]) -> list[dict[str, Any]]:
    return [f.to_json() for f in frames]


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
