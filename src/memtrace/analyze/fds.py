"""The file-descriptor line, offline: what was opened, by whom, what is still open, and the peak.

Pure: capture records in, an :class:`FdsSummary` out.  The agent reports every hooked creation
(``open`` events carry the descriptors, the call, a path where the call has one, and the
creating stack), every release (``close``), failed creations with their errno, and censuses
of every open descriptor (at start, at the end, and past the threshold).

Descriptors open before the window (the start census) are the baseline: never blamed on a
stack.  The end census is reconciled with the hooks: a descriptor it lists that no hook saw
opened was "opened out of sight" (an entry memtrace does not hook), and one the hooks think
is open but the census does not list was closed out of sight.
"""

from __future__ import annotations

import errno as errno_names
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import msgspec
from msgspec import Struct

from memtrace.analyze.context import CaptureContext, JsonRow, event_frames, fold_events
from memtrace.capture import Event, Record
from memtrace.frames import Frame
from memtrace.schema import UNSET, Count, Maybe, Row

# Frames in these modules are the C library's own plumbing (fopen -> open); the caller is the
# first frame outside them.
_LIBC_PREFIXES = ("libc.", "libc-", "libsystem_")


class OpenFd(Struct):
    fd: int
    call: str
    path: str | None
    frames: tuple[int, ...]
    t: int | None
    from_fd: int | None = None


class Census(JsonRow):
    """The descriptors open at one instant, as the agent listed them (at the start, on a step, at the end)."""

    t: int | None
    trigger: str
    count: int                  # the target's own (Frida's left out)
    frida: int
    by_kind: dict[str, int]
    fds: dict[int, str | None]

    json_omit: ClassVar[frozenset[str]] = frozenset({"fds"})     # the descriptors stay in the capture


class UnseenFd(JsonRow):
    fd: int
    path: str | None
    kind: str


class Reconciliation(JsonRow):
    """The last census against what the hooks saw."""

    census_count: int
    opened_out_of_sight: list[UnseenFd]     # open at the end, and no hooked entry opened it
    closed_out_of_sight: list[int]          # opened in the window, gone at the end, and no hooked entry closed it


class OpenGroup(JsonRow):
    """Descriptors opened in the window and still open at its end, with one opening stack."""

    count: int
    calls: dict[str, int]
    caller: str | None
    fds: list[int]
    paths: list[str]            # the first 10, sorted
    frames: list[Frame]


class FailureGroup(JsonRow):
    """Failed creations by one call with one errno from one stack."""

    call: str
    errno: int
    error: str
    count: int
    caller: str | None
    frames: list[Frame]


class FdsSummary(CaptureContext):
    tracer_name: ClassVar[str] = "fds"
    count_views: ClassVar[Mapping[str, tuple[str, str]]] = {
        "open": ("open_at_end.by_stack", "descriptors open at the end, by the stack that opened them"),
        "failed": ("failures_by_stack", "failed opens (EMFILE, ENFILE, ...), by stack"),
    }
    calls: Counter[str] = msgspec.field(default_factory=Counter)          # successful creating calls
    opened: int = 0                                               # descriptors they created
    closes: Counter[str] = msgspec.field(default_factory=Counter)         # releases of an open descriptor
    closes_unknown: int = 0             # releases of a descriptor not open as far as we knew
    replaced: int = 0                   # dup2/dup3 onto an open descriptor (an implicit close)
    failures: dict[str, Counter[int]] = msgspec.field(default_factory=dict)   # call -> errno -> count
    failure_stacks: Counter[tuple[str, int, tuple[int, ...]]] = msgspec.field(default_factory=Counter)
    baseline: dict[int, str | None] = msgspec.field(default_factory=dict)
    baseline_closed: int = 0
    open: dict[int, OpenFd] = msgspec.field(default_factory=dict)         # opened in the window, still open
    censuses: list[Census] = msgspec.field(default_factory=list)
    peak: int = 0
    peak_t: int | None = None
    frida_fds: set[int] = msgspec.field(default_factory=set)   # Frida's own (cloaked) descriptors
    _now_open: set[int] = msgspec.field(default_factory=set)

    def _note_count(self, t: int | None) -> None:
        if len(self._now_open) > self.peak:
            self.peak, self.peak_t = len(self._now_open), t

    def fold_event(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        t = ev.get("t")
        if kind == "open":
            call = str(ev.get("call", "?"))
            fds = [int(fd) for fd in ev.get("fds") or ()]
            self.calls[call] += 1
            self.opened += len(fds)
            frames = event_frames(ev)
            for fd in fds:
                if fd in self._now_open:
                    # Opened over a descriptor we think is open: dup2/dup3 closed it first, or
                    # it was closed by an entry we do not hook.
                    self.replaced += 1
                    self._release(fd)
                self.open[fd] = OpenFd(fd, call, ev.get("path"), frames, t, ev.get("from"))
                self._now_open.add(fd)
            self._note_count(t)
        elif kind == "close":
            fd = int(ev.get("fd", -1))
            if fd in self._now_open:
                self.closes[str(ev.get("call", "?"))] += 1
                self._release(fd)
            else:
                self.closes_unknown += 1
        elif kind == "open-failed":
            call = str(ev.get("call", "?"))
            err = int(ev.get("errno") or 0)
            self.failures.setdefault(call, Counter())[err] += 1
            self.failure_stacks[(call, err, event_frames(ev))] += 1
        elif kind == "census":
            self._census(ev)

    def _release(self, fd: int) -> None:
        self._now_open.discard(fd)
        if self.open.pop(fd, None) is None and self.baseline.pop(fd, None) is not None:
            self.baseline_closed += 1

    def _census(self, ev: dict[str, Any]) -> None:
        entries = {int(fd): path for fd, path in ev.get("fds") or ()}
        trigger = ev.get("trigger", "?")
        frida = {int(fd) for fd in ev.get("frida") or ()}
        self.frida_fds |= frida
        # Frida's own descriptors (cloaked, or its spawn helper's memfd) are not the target's:
        # not in the baseline, the peak or a census's count; listed apart as "frida".
        own = {fd: p for fd, p in entries.items() if fd not in frida}
        if trigger == "start" and not self.censuses:
            self.baseline = dict(own)
            self._now_open |= set(own)
            self._note_count(ev.get("t"))
        self.censuses.append(Census(ev.get("t"), trigger, len(own), len(entries) - len(own),
                                    dict(Counter(fd_kind(p) for p in own.values()).most_common()), own))

    # ---- views ---------------------------------------------------------------------------------

    def reconciliation(self) -> Reconciliation | None:
        ends = [c for c in self.censuses if c.trigger == "end"]
        if not ends:
            return None
        final = ends[-1].fds
        unseen = {fd: p for fd, p in final.items()
                  if fd not in self.open and fd not in self.baseline and fd not in self.frida_fds}
        closed_unseen = sorted(fd for fd in self.open if fd not in final)
        return Reconciliation(len(final), [UnseenFd(fd, p, fd_kind(p)) for fd, p in sorted(unseen.items())],
                              closed_unseen)

    def open_groups(self, top: int = 20) -> list[OpenGroup]:
        """Still open at the end, by opening stack, most first."""
        by_stack = [OpenGroup(len(g), dict(Counter(o.call for o in g)), self.caller(frames, _LIBC_PREFIXES),
                              sorted(o.fd for o in g), sorted({o.path for o in g if o.path is not None})[:10], frames)
                    for frames, g in self.by_stack((o.frames, o) for o in self.open.values())]
        by_stack.sort(key=lambda r: (-r.count, r.caller or ""))
        return by_stack[:top] if top else by_stack

    def counted_stacks(self, view: str) -> list[tuple[list[Frame], int]] | None:
        groups = self.open_groups(0) if view == "open" else self.failure_groups(0)
        return [(g.frames, g.count) for g in groups]

    def open_by_kind(self) -> dict[str, int]:
        return dict(Counter(fd_kind(o.path) if o.path else o.call for o in self.open.values()).most_common())

    def failure_groups(self, top: int = 20) -> list[FailureGroup]:
        fails: Counter[tuple[str, int, tuple[int, ...]]] = self.failure_stacks
        failures = [FailureGroup(call, err, errno_names.errorcode.get(err, str(err)), sum(fails[k] for k in keys),
                                 self.caller(frames, _LIBC_PREFIXES), frames)
                    for (call, err), groups in _by_call(fails).items()
                    for frames, keys in self.by_stack((k[2], k) for k in groups)]
        failures.sort(key=lambda r: (-r.count, r.call, r.errno))
        return failures[:top] if top else failures

    @property
    def baseline_count(self) -> int:
        """Descriptors open before the window (those closed in it included)."""
        return len(self.baseline) + self.baseline_closed

    def to_json(self, capture: str | None = None, top: int = 20) -> dict[str, Any]:
        return {
            **self.header_json(self.tracer_name, capture),
            "calls": dict(sorted(self.calls.items())),
            "opened": self.opened,
            "closed": dict(sorted(self.closes.items())),
            "closes_of_unknown_fds": self.closes_unknown,
            "replaced": self.replaced,
            "failed": {call: {errno_names.errorcode.get(e, str(e)): n for e, n in sorted(c.items())}
                       for call, c in sorted(self.failures.items())},
            "failures_by_stack": [f.to_json() for f in self.failure_groups(top)],
            "baseline": {"count": self.baseline_count, "closed_in_window": self.baseline_closed},
            "peak": {"count": self.peak, "t_ms": self.peak_t},
            "open_at_end": {"count": len(self.open), "by_stack": [g.to_json() for g in self.open_groups(top)],
                            "by_kind": self.open_by_kind()},
            "censuses": [c.to_json() for c in self.censuses],
            "reconciliation": None if (rec := self.reconciliation()) is None else rec.to_json(),
            "missing": self.missing,
            "census_at": self.info.get("census_at"),
            "census_step": self.info.get("census_step"),
            **self.timing_json(),
        }


def _by_call(fails: Counter[tuple[str, int, tuple[int, ...]]]) -> dict[tuple[str, int], list[tuple[str, int, tuple[int, ...]]]]:
    out: dict[tuple[str, int], list[tuple[str, int, tuple[int, ...]]]] = {}
    for key in fails:
        out.setdefault((key[0], key[1]), []).append(key)
    return out


def fd_kind(path: str | None) -> str:
    """What a descriptor is, from its /proc/self/fd link (or the Darwin census's type prefix)."""
    if not path:
        return "unknown"
    if path.startswith("/"):
        return "device" if path.startswith("/dev/") else "file"
    if path.startswith("anon_inode:"):
        return "anon_inode:" + path[len("anon_inode:"):].strip("[]")
    head = path.split(":", 1)[0]
    return head or "unknown"



def summarize(records: Iterable[Record]) -> FdsSummary:
    return fold_events(FdsSummary(), records)


# ---- the events the capture reader checks (registered by tracers/fds.py's TRACER.events) ---------


class OpenEvent(Event):
    TYPE: ClassVar[str] = "open"
    call: Maybe[str] = UNSET
    fds: Maybe[list[int]] = UNSET
    path: str | None = None
    from_: int | None = msgspec.field(default=None, name="from")
    replaced: Maybe[list[int]] = UNSET


class CloseEvent(Event):
    TYPE: ClassVar[str] = "close"
    call: Maybe[str] = UNSET
    fd: Maybe[int] = UNSET
    known: Maybe[bool] = UNSET


class OpenFailedEvent(Event):
    TYPE: ClassVar[str] = "open-failed"
    call: Maybe[str] = UNSET
    errno: int | None = None
    path: str | None = None
    from_: int | None = msgspec.field(default=None, name="from")


class _OpenFd(Row):
    fd: int
    what: str | None


class CensusEvent(Event):
    TYPE: ClassVar[str] = "census"
    trigger: Maybe[str] = UNSET
    count: Maybe[Count] = UNSET
    tracked: Maybe[Count] = UNSET
    fds: Maybe[list[_OpenFd]] = UNSET
    frida: Maybe[list[int]] = UNSET
    activity: Maybe[bool] = UNSET


EVENTS = (OpenEvent, CloseEvent, OpenFailedEvent, CensusEvent)
