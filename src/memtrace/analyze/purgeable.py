"""The purgeable line, offline: the transition matrix, who drives it, the reusable line.

Pure: capture records in, a :class:`PurgeableSummary` out.  Transitions come from the state
machine's own entries (``vm_purgable_control`` / ``mach_vm_purgable_control`` SET, and
``IOSurfaceSetPurgeable``, which IOKit applies in the kernel where a trap hook cannot see it).
Framework entries (Core Animation) are reported as calls with their callers: the transitions
they cause are already counted underneath, so counting them again would double the matrix.
``madvise`` is its own "reusable" line, never a transition (docs/domain/iosurface-purgeable.md, "madvise").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import msgspec
from msgspec import Struct

from memtrace.analyze.context import CaptureContext, event_frames, fold_context, frames_json
from memtrace.capture import Event, Record, RecordType
from memtrace.frames import Frame, stack_key
from memtrace.schema import UNSET, Addr, Count, Maybe

STATE_NAMES = {0: "NONVOLATILE", 1: "VOLATILE", 2: "EMPTY", 3: "DENY"}
MADVISE_NAMES = {
    "darwin": {5: "MADV_FREE", 6: "MADV_ZERO_WIRED_PAGES", 7: "MADV_FREE_REUSABLE", 8: "MADV_FREE_REUSE",
               9: "MADV_CAN_REUSE", 10: "MADV_PAGEOUT"},
    "linux": {4: "MADV_DONTNEED", 8: "MADV_FREE", 20: "MADV_COLD", 21: "MADV_PAGEOUT"},
}
STATE_MACHINE_ENTRIES = ("vm_purgable_control", "mach_vm_purgable_control")


class Group(Struct):
    """Events sharing a key and a stack."""

    count: int = 0
    bytes: int = 0
    unknown_bytes: int = 0          # events whose object size was not seen (created before attach)
    frames: tuple[int, ...] = ()


class PurgeableSummary(CaptureContext):
    tracer_name: ClassVar[str] = "purgeable"
    counts: dict[str, Any] = msgspec.field(default_factory=dict)
    transitions: dict[str, int] = msgspec.field(default_factory=dict)
    transition_bytes: dict[str, int] = msgspec.field(default_factory=dict)
    by_entry: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)
    by_caller: dict[tuple[str, str, tuple[int, ...]], Group] = msgspec.field(default_factory=dict)
    keep_current: int = 0
    failed_sets: int = 0
    set_events: int = 0
    created: dict[tuple[str, tuple[int, ...]], Group] = msgspec.field(default_factory=dict)
    madvise: dict[tuple[str, int, tuple[int, ...]], Group] = msgspec.field(default_factory=dict)
    madvise_platform: dict[str, str] = msgspec.field(default_factory=dict)
    calls: dict[tuple[str, tuple[int, ...]], Group] = msgspec.field(default_factory=dict)

    # -- derived ----------------------------------------------------------------

    def _controls(self) -> dict[str, dict[str, int]]:
        controls: dict[str, dict[str, int]] = self.counts.get("controls", {})
        return controls

    @property
    def set_calls(self) -> int:
        """SET calls into the state machine's trap entries (exact, counted in C)."""
        return sum(c.get("set", 0) + c.get("set_from_kernel", 0) for c in self._controls().values())

    @property
    def get_calls(self) -> int:
        return sum(c.get("get", 0) for c in self._controls().values())

    def caller(self, frames: list[Frame], skip_modules: tuple[str, ...] = ()) -> str | None:
        """The direct caller's function name (the first frame outside ``skip_modules``), without its
        parameter list (C++ nested names)."""
        outside = [f for f in frames if not skip_modules or f.module is None or not f.module.startswith(skip_modules)]
        first = (outside or frames)[0] if frames else None
        return None if first is None else first.short_function() or first.name()

    def groups(self, table: dict[Any, Group], top: int = 50) -> list[CallerGroup]:
        """A table's events, one group per key and whole symbolized stack, most first: several call
        sites on one source line merge, two business paths through one wrapper stay two groups.
        (A key's last member is the stack; the others are what the table is keyed by.)"""
        merged: dict[tuple[Any, ...], tuple[list[Frame], Group, int]] = {}
        for key, g in table.items():
            frames = self.stack(g.frames)
            k = (*key[:-1], stack_key(frames))
            if k not in merged:
                merged[k] = (frames, Group(), 0)
            first, total, n = merged[k]
            total.count += g.count
            total.bytes += g.bytes
            total.unknown_bytes += g.unknown_bytes
            merged[k] = (first, total, n + 1)
        rows = [CallerGroup(k[:-1], self.caller(frames), g.count, g.bytes if g.unknown_bytes < g.count else None,
                            n, frames, g.unknown_bytes if g.unknown_bytes < g.count else 0)
                for k, (frames, g, n) in merged.items()]
        rows.sort(key=lambda r: (-r.count, -(r.bytes or 0), str(r.caller)))
        return rows[:top] if top else rows

    def framework_calls(self, top: int = 50) -> dict[str, FrameworkEntry]:
        """Framework entries (IOSurface, Core Animation) and who called them; their transitions are
        counted underneath, at the state machine."""
        out: dict[str, FrameworkEntry] = {}
        for row in self.groups(self.calls, top):
            e = out.setdefault(row.key[0], FrameworkEntry(0, []))
            e.calls += row.count
            e.by_caller.append(row)
        return out

    def madvise_figures(self) -> Madvise:
        counts: dict[str, int] = {}
        nbytes: dict[str, int] = {}
        standin: dict[str, int] = {}
        for (entry, advice, _), g in self.madvise.items():
            target = standin if entry == "mtdarwin_madvise" else counts
            target[str(advice)] = target.get(str(advice), 0) + g.count
            if entry != "mtdarwin_madvise":
                nbytes[str(advice)] = nbytes.get(str(advice), 0) + g.bytes
        platform = self.madvise_platform.get("madvise") or self.counts.get("madvise_platform") or "linux"
        names = {a: MADVISE_NAMES.get(platform, {}).get(int(a)) for a in counts}
        return Madvise(counts, nbytes, standin, platform, names)

    @property
    def stolen(self) -> tuple[int, int]:
        """(count, bytes) of 2->0: EMPTY objects the kernel took, found on reacquire."""
        return self.transitions.get("2->0", 0), self.transition_bytes.get("2->0", 0)

    @property
    def created_purgeable(self) -> int:
        return sum(g.count for g in self.created.values())

    @property
    def created_bytes(self) -> int:
        return sum(g.bytes for g in self.created.values())

    def to_json(self, capture: str | None = None, top: int = 50) -> dict[str, Any]:
        mad = self.madvise_figures()
        stolen = self.stolen
        return {
            **self.header_json(self.tracer_name, capture),
            "transitions": dict(sorted(self.transitions.items())),
            "transition_bytes": dict(sorted(self.transition_bytes.items())),
            "set_calls": self.set_calls,
            "get_calls": self.get_calls,
            "purge_all_calls": sum(c.get("purge_all", 0) for c in self._controls().values()),
            "controls": self._controls(),
            "by_entry": self.by_entry,
            "keep_current": self.keep_current,
            "failed_sets": self.failed_sets,
            "stolen": {"count": stolen[0], "bytes": stolen[1]},
            "created_purgeable": self.created_purgeable,
            "created_bytes": self.created_bytes,
            "created_by": [r.to_json(("entry",)) for r in self.groups(self.created, top)],
            "creation_calls": self.counts.get("creation_calls", {}),
            # Calls made inside another traced entry (xnu: vm_allocate -> mach_vm_allocate): each call
            # counts once, at its outermost entry, so these are apart and never in the figures above.
            "nested_calls": {k: v for k, v in self.counts.get("nested_calls", {}).items() if v},
            "madvise_allocator_internal": self.counts.get("madvise_allocator_internal", 0),
            # Streamed calls (SET transitions, purgeable creations, reusable-line madvise) whose event
            # the agent's ring had no room for: in the counts above, missing from the events' figures.
            "events_dropped": self.counts.get("events_dropped", 0),
            "madvise": mad.counts,
            "madvise_bytes": mad.bytes,
            "madvise_platform": mad.platform,
            "madvise_names": mad.names,
            "madvise_all_advice": self.counts.get("madvise_all", {}),
            "madvise_standin": mad.standin,
            "madvise_by_caller": [r.to_json(MADVISE_KEY) for r in self.groups(self.madvise, top)],
            "by_caller": [r.to_json(TRANSITION_KEY) for r in self.groups(self.by_caller, top)],
            "framework_calls": {entry: {"calls": e.calls, "by_caller": [r.to_json((), with_bytes=False)
                                                                        for r in e.by_caller]}
                                for entry, e in self.framework_calls(top).items()},
            "missing": self.missing,
            **self.timing_json(),
        }


TRANSITION_KEY = ("entry", "transition")
MADVISE_KEY = ("entry", "advice")


class CallerGroup(Struct):
    """Events with one key (an entry, and its transition or advice) from one symbolized stack."""

    key: tuple[Any, ...]            # the table's key values, without the stack
    caller: str | None
    count: int
    bytes: int | None               # None when most events' object size was not seen
    stacks: int                     # stack ids merged into this stack
    frames: list[Frame]
    events_without_size: int = 0

    def to_json(self, keys: tuple[str, ...], with_bytes: bool = True) -> dict[str, Any]:
        row: dict[str, Any] = dict(zip(keys, self.key[len(self.key) - len(keys):], strict=True))
        row.update({"caller": self.caller, "count": self.count})
        if with_bytes:
            row["bytes"] = self.bytes
        row.update({"stacks": self.stacks, "frames": frames_json(self.frames)})
        if self.events_without_size:
            row["events_without_size"] = self.events_without_size
        return row


class FrameworkEntry(Struct):
    calls: int
    by_caller: list[CallerGroup]


class Madvise(Struct):
    """The reusable-page line: madvise calls by advice value (never a purgeable transition)."""

    counts: dict[str, int]
    bytes: dict[str, int]
    standin: dict[str, int]         # the Linux stand-in's madvise, reported apart
    platform: str
    names: dict[str, str | None]


def _bump(table: dict[Any, Group], key: Any, frames: tuple[int, ...], nbytes: int | None) -> None:
    g = table.get(key)
    if g is None:
        g = table[key] = Group(frames=frames)
    g.count += 1
    if nbytes is None:
        g.unknown_bytes += 1
    else:
        g.bytes += nbytes


def _fold_event(s: PurgeableSummary, ev: dict[str, Any]) -> None:
    kind = ev.get("type")
    if kind == "counts":
        s.counts = ev                       # cumulative: the last one wins
        return
    frames = event_frames(ev)
    if kind == "set":
        entry = ev.get("entry", "?")
        if ev.get("control") == "keep-current":
            s.keep_current += 1             # IOSurface query: reads the state, moves nothing
            s.by_entry.setdefault(entry, {})["keep_current"] = s.by_entry.get(entry, {}).get("keep_current", 0) + 1
            return
        s.set_events += 1
        old = ev.get("old_state")
        if old is None:
            s.failed_sets += 1
            return
        key = f"{old}->{ev.get('new_state')}"
        s.transitions[key] = s.transitions.get(key, 0) + 1
        nbytes = ev.get("bytes")
        s.transition_bytes[key] = s.transition_bytes.get(key, 0) + (nbytes or 0)
        per = s.by_entry.setdefault(entry, {})
        per[key] = per.get(key, 0) + 1
        _bump(s.by_caller, (entry, key, frames), frames, nbytes)
    elif kind == "create":
        if ev.get("kr") == 0:
            _bump(s.created, (ev.get("entry", "?"), frames), frames, ev.get("bytes"))
    elif kind == "madvise":
        entry = ev.get("entry", "madvise")
        s.madvise_platform[entry] = ev.get("platform", "linux")
        _bump(s.madvise, (entry, int(ev.get("advice", -1)), frames), frames, ev.get("len"))
    elif kind == "call":
        _bump(s.calls, (ev.get("entry", "?"), frames), frames, None)


def summarize(records: Iterable[Record]) -> PurgeableSummary:
    s = PurgeableSummary()
    for rec in records:
        t = rec.type
        if t == RecordType.EVENTS:
            for ev in rec.body.get("events", []):
                _fold_event(s, ev)
        else:
            fold_context(s, rec)
    return s


# ---- the events the capture reader checks (registered by tracers/purgeable.py's TRACER.events) ---


class SetEvent(Event):
    TYPE: ClassVar[str] = "set"
    entry: Maybe[str] = UNSET
    control: str | int | None = None
    addr: Maybe[Addr] = UNSET
    new_state: int | None = None
    old_state: int | None = None
    kr: int | None = None
    bytes: Count | None = None


class MadviseEvent(Event):
    TYPE: ClassVar[str] = "madvise"
    entry: Maybe[str] = UNSET
    advice: Maybe[int] = UNSET
    advice_name: str | None = None
    platform: Maybe[str] = UNSET
    addr: Maybe[Addr] = UNSET
    len: Count | None = None


class CountsEvent(Event):
    TYPE: ClassVar[str] = "counts"
    controls: Maybe[dict[str, dict[str, Count]]] = UNSET
    creation_calls: Maybe[dict[str, Count]] = UNSET
    madvise_all: Maybe[dict[str, Count]] = UNSET
    madvise_standin_all: Maybe[dict[str, Count]] = UNSET
    madvise_allocator_internal: Maybe[Count] = UNSET
    madvise_platform: Maybe[str] = UNSET


class CallEvent(Event):
    TYPE: ClassVar[str] = "call"
    entry: Maybe[str] = UNSET
    store: Maybe[str] = UNSET
    shmem: Maybe[str] = UNSET
    volatile: Maybe[bool] = UNSET
    size: Count | None = None


class CreateEvent(Event):
    TYPE: ClassVar[str] = "create"
    entry: Maybe[str] = UNSET
    addr: Maybe[Addr] = UNSET
    size: Count | None = None
    bytes: Count | None = None
    flags: Maybe[int] = UNSET
    kr: int | None = None


EVENTS = (SetEvent, MadviseEvent, CountsEvent, CallEvent, CreateEvent)
