"""What every analyzer reads the same way: who/what/how it ended, recon, calibration, symbols."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

import msgspec
from msgspec import Struct

from memtrace.analyze.profile import ALL_ROWS, Profile, Sample, named_stack_lists, rows_at, samples_of
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


class CaptureContext(Struct):
    """The fields :func:`fold_context` fills, for analyzers to inherit, and the stack views they share.

    Every summary answers the views protocol: :meth:`profile` makes one of its tracer's views
    (``Tracer.views``), :meth:`measured_views` names those it holds per stack id (the flame graph
    and parquet read those in one pass), :meth:`snapshot_counters` says what a SNAPSHOT record
    counts.  The defaults fit a tracer whose summary lists stack rows; a summary class overrides
    what its tracer does otherwise.
    """

    tracer_name: ClassVar[str] = "?"
    # Views whose stacks weigh objects, not bytes: {view: (dotted path of a stack-row list in the
    # summary's JSON, weighed by its rows' "count"; what the view is)}.  Empty: the one "gross"
    # view, the summary's first stack-row list.
    count_views: ClassVar[Mapping[str, tuple[str, str]]] = {}

    meta: dict[str, Any] = msgspec.field(default_factory=dict)
    end: dict[str, Any] = msgspec.field(default_factory=dict)
    recon: list[dict[str, Any]] = msgspec.field(default_factory=list)
    info: dict[str, Any] = msgspec.field(default_factory=dict)
    missing: list[str] = msgspec.field(default_factory=list)
    symbols: SymbolTable = msgspec.field(default_factory=SymbolTable)
    warnings: list[dict[str, Any]] = msgspec.field(default_factory=list)

    # -- what every capture says about itself (the console's header and footer read these) --------

    @property
    def target_label(self) -> str | None:
        label = self.meta.get("target", {}).get("label")
        return None if label is None else str(label)

    @property
    def ended(self) -> str:
        return str(self.end.get("ended", "truncated"))

    @property
    def reason(self) -> str:
        return str(self.end.get("reason", NO_END))

    @property
    def recorded_by(self) -> str | None:
        """--backend dvt: what the device's service recorded (None: memtrace's own agent)."""
        covers = self.info.get("covers")
        return str(covers) if covers else None

    def header_json(self, tracer: str, capture: str | None) -> dict[str, Any]:
        """What every summary's JSON opens with: which capture, which target, how it ended."""
        out = {"schema_version": SCHEMA_VERSION, "capture": capture, "tracer": tracer,
               "target": self.meta.get("target", {}).get("label"),
               "ended": self.end.get("ended", "truncated"), "reason": self.end.get("reason", NO_END)}
        if self.recorded_by:
            out["recorded_by"] = self.info["covers"]
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

    def to_json(self, capture: str | None = None, top: int = 10) -> dict[str, Any]:
        """The summary as ``--json`` and report.json carry it (docs/json-schema.md)."""
        raise NotImplementedError(f"{type(self).__name__} has no JSON form")

    # -- the views protocol ------------------------------------------------------------------

    def profile(self, view: str, capture_version: int | None = None) -> Profile:
        """One of this tracer's views (the registry checked ``view``) as stack samples.
        ``capture_version``: the capture file's format version, for saying why a view is missing."""
        p = Profile(tracer=self.tracer_name, view=view, target=self.meta.get("target", {}).get("label"))
        if self.count_views:
            path, meaning = self.count_views[view]
            p.unit = "count"
            counted = self.counted_stacks(view)
            if counted is None:         # no typed rows: the JSON's, at the view's path
                counted = [([Frame.from_json(f) for f in r["frames"]], int(r.get("count") or 0))
                           for r in rows_at(self.to_json(capture=None, top=0), path) or []]
            counted = [(frames, n) for frames, n in counted if frames]
            if not counted:
                p.missing = f"no {meaning} in this capture"
                return p
            p.samples = [Sample(frames, n, n) for frames, n in counted]
            return p
        lists = named_stack_lists(self.to_json(capture=None, top=ALL_ROWS))
        if not lists:
            p.missing = f"this {self.tracer_name} capture has no stacks"
            return p
        p.samples = samples_of(lists[0][1])
        return p

    def counted_stacks(self, view: str) -> list[tuple[list[Frame], int]] | None:
        """A count view's (frames, count) per stack, every row, from the summary's typed rows;
        None: read them from its JSON at the ``count_views`` path."""
        return None

    def measured_views(self) -> list[str]:
        """The views this summary holds as totals per stack id (none by default: :meth:`profile`)."""
        return []

    def snapshot_counters(self, body: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """A SNAPSHOT record's figures as (counter name, value): the events so far."""
        return [("events", body.get("events", 0))]


def frames_json(frames: list[Frame]) -> list[dict[str, Any]]:
    return [f.to_json() for f in frames]


class JsonRow(Struct):
    """A result row whose --json form is its fields in declaration order, less ``json_omit``:
    frames and nested rows as their own JSON, lists and dicts of them likewise."""

    json_omit: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {name: _json_value(getattr(self, name)) for name in self.__struct_fields__
                if name not in self.json_omit}


def _json_value(value: Any) -> Any:
    if isinstance(value, (JsonRow, Frame)):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value


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
