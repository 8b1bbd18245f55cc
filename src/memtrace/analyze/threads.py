"""The thread line, offline: who creates threads, which are never joined, and the peak.

Pure: capture records in, a :class:`ThreadsSummary` out.  The agent reports creations (handle,
start routine, joinable or detached, stack size, creating stack), detaches, joins, failed
creations, and every start and exit (on the thread itself, with its handle).

A joinable thread that exited without being joined or detached is leaked: glibc and libpthread
keep its stack and descriptor until somebody joins it -- unless a join that waits for it had begun
when the window ended (``joining``: the thread exits before its joiner's pthread_join returns, and
the window can end in between).  Handles are reused once a thread is
gone (glibc caches stacks), so a handle names a series of threads, each its own record.
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
from memtrace.schema import Addr, Count


class ThreadRecord(Struct):
    handle: str
    created: bool = False
    routine: int | None = None
    frames: tuple[int, ...] = ()
    detached_at_create: bool = False
    stack_size: int | None = None
    tid: int | None = None
    name: str | None = None
    started: bool = False
    exited: bool = False
    detached: bool = False
    joined: bool = False
    joining: bool = False       # a join that waits for it had begun, and had not returned

    @property
    def complete(self) -> bool:
        """Nothing more can happen to it: its handle may now name a new thread."""
        return self.exited and (self.joined or self.detached or self.detached_at_create)

    @property
    def leaked(self) -> bool:
        # One whose joiner was still waiting when the window ended is not: the join was
        # returning (the thread exits first, then pthread_join returns).
        return (self.created and self.exited and not self.joined and not self.joining and not self.detached
                and not self.detached_at_create)


class ThreadGroup(JsonRow):
    """Threads with one creating stack and one start routine (a row of a by-stack table)."""

    count: int
    routine: str | None
    caller: str | None
    stack_bytes: int
    frames: list[Frame]


class FailureGroup(JsonRow):
    """Failed pthread_create calls with one errno, creating stack and start routine."""

    errno: int
    error: str
    count: int
    routine: str | None
    caller: str | None
    frames: list[Frame]


class ThreadSet(Struct):
    """Some of the threads created in the window: how many, their stacks' bytes, by creating stack."""

    count: int
    stack_bytes: int
    joinable: int
    by_stack: list[ThreadGroup]


class ThreadsSummary(CaptureContext):
    tracer_name: ClassVar[str] = "threads"
    count_views: ClassVar[Mapping[str, tuple[str, str]]] = {
        "created": ("created_by_stack", "threads created, by the stack that created them"),
        "running": ("running_at_end.by_stack", "threads still running at the end, by creating stack"),
        "leaked": ("leaked.by_stack", "threads never joined nor detached, by creating stack"),
    }
    records: list[ThreadRecord] = msgspec.field(default_factory=list)
    existing: int = 0                       # threads alive when the window began
    failures: Counter[tuple[int, tuple[int, ...], int | None]] = msgspec.field(default_factory=Counter)
    pthread_exits: int = 0
    unmatched: Counter[str] = msgspec.field(default_factory=Counter)   # joins/detaches of threads not seen created
    alive: int = 0
    peak: int = 0
    peak_t: int | None = None
    _by_handle: dict[str, ThreadRecord] = msgspec.field(default_factory=dict)
    _by_tid: dict[int, ThreadRecord] = msgspec.field(default_factory=dict)
    # Exits of threads whose start was not seen yet, by handle: their tid.  The start is said by the
    # creator when pthread_create returns, and a short thread may have run to its end first (its
    # exit listener got the script's lock before the creator's): CI's 13 exits of 14.
    _early_exits: dict[str, int | None] = msgspec.field(default_factory=dict)

    def _current(self, handle: str, fresh_if: str) -> ThreadRecord:
        """The record a handle names now; a new one when this event cannot belong to it."""
        r = self._by_handle.get(handle)
        if r is None or r.complete or getattr(r, fresh_if):
            r = ThreadRecord(handle)
            self.records.append(r)
            self._by_handle[handle] = r
        return r

    def fold_event(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        t = ev.get("t")
        r: ThreadRecord | None
        if kind == "create":
            r = self._current(str(ev.get("handle")), "created")
            r.created = True
            r.routine = _addr(ev.get("routine"))
            r.frames = event_frames(ev)
            r.detached_at_create = bool(ev.get("detached"))
            r.stack_size = ev.get("stack_size")
        elif kind == "start":
            handle = ev.get("handle")
            r = self._current(str(handle), "started") if handle else ThreadRecord("?")
            r.started, r.tid, r.name = True, ev.get("tid"), ev.get("name")
            if r.routine is None:
                r.routine = _addr(ev.get("routine"))
            early = self._early_exits.pop(str(handle), -1) if handle else -1
            # Its exit came first when that exit's tid is this one's, or this one's was already
            # cleared by the kernel (0: the thread had ended when its creator read it).
            if early != -1 and (not r.tid or r.tid == early):
                r.exited = True
            elif r.tid:
                self._by_tid[int(r.tid)] = r
            self._change(+1, t)
        elif kind == "existing":
            self.existing += 1
            self._change(+1, t)
        elif kind == "exit":
            tid = ev.get("tid")
            r = self._by_tid.pop(int(tid), None) if tid is not None else None
            if r is not None:
                r.exited = True
            elif ev.get("handle"):
                self._early_exits[str(ev.get("handle"))] = int(tid) if tid is not None else None
            self._change(-1, t)
        elif kind in ("detach", "join"):
            r = self._by_handle.get(str(ev.get("handle")))
            if r is None or (r.joined or r.detached):
                self.unmatched[kind] += 1
            elif kind == "join":
                r.joined = True
            else:
                r.detached = True
        elif kind == "joining":
            r = self._by_handle.get(str(ev.get("handle")))
            if r is not None and not (r.joined or r.detached):
                r.joining = True
        elif kind == "join-failed":
            r = self._by_handle.get(str(ev.get("handle")))
            if r is not None:
                r.joining = False
        elif kind == "create-failed":
            self.failures[(int(ev.get("errno") or 0), event_frames(ev), _addr(ev.get("routine")))] += 1
        elif kind == "pthread-exit":
            self.pthread_exits += 1
        elif kind == "rename":
            r = self._by_tid.get(int(ev.get("tid", -1)))
            if r is not None:
                r.name = ev.get("name")

    def _change(self, delta: int, t: int | None) -> None:
        self.alive += delta
        if self.alive > self.peak:
            self.peak, self.peak_t = self.alive, t

    # ---- views ---------------------------------------------------------------------------------

    def _symbol(self, address: int | None) -> str | None:
        if address is None:
            return None
        f = self.symbols.frame(address)
        return f.function or f.name()

    def _routine(self, address: int | None) -> str | None:
        # A start routine is a function's first byte; the symbol table (built for return
        # addresses) answers for the byte before, so ask one byte in (the session does too).
        return None if address is None else self._symbol(address + 1)

    def _group(self, records: list[ThreadRecord], top: int) -> list[ThreadGroup]:
        rows: list[ThreadGroup] = []
        for frames, g in self.by_stack((r.frames, r) for r in records):
            by_routine: dict[int | None, list[ThreadRecord]] = {}
            for r in g:
                by_routine.setdefault(r.routine, []).append(r)
            rows += [ThreadGroup(len(rs), self._routine(routine), self.caller(frames),
                                 sum(r.stack_size or 0 for r in rs), frames)
                     for routine, rs in by_routine.items()]
        rows.sort(key=lambda x: (-x.count, x.caller or "", x.routine or ""))
        return rows[:top] if top else rows

    @property
    def created(self) -> list[ThreadRecord]:
        return [r for r in self.records if r.created]

    def _set(self, records: list[ThreadRecord], top: int) -> ThreadSet:
        return ThreadSet(len(records), sum(r.stack_size or 0 for r in records),
                         sum(1 for r in records if not (r.detached or r.detached_at_create)), self._group(records, top))

    def leaked(self, top: int = 20) -> ThreadSet:
        """Joinable threads that exited and were never joined or detached."""
        return self._set([r for r in self.created if r.leaked], top)

    def running_at_end(self, top: int = 20) -> ThreadSet:
        return self._set([r for r in self.created if not r.exited], top)

    def counted_stacks(self, view: str) -> list[tuple[list[Frame], int]] | None:
        groups = {"created": lambda: self._group(self.created, 0), "running": lambda: self.running_at_end(0).by_stack,
                  "leaked": lambda: self.leaked(0).by_stack}[view]()
        return [(g.frames, g.count) for g in groups]

    def failure_groups(self, top: int = 20) -> list[FailureGroup]:
        failures = [FailureGroup(e, errno_names.errorcode.get(e, str(e)), n, self._routine(routine),
                                 self.caller(stack), stack)
                    for (e, frames, routine), n in self.failures.most_common()
                    for stack in (self.stack(frames),)]
        return failures[:top] if top else failures

    def failed_by_error(self) -> dict[str, int]:
        return {errno_names.errorcode.get(e, str(e)): n for e, n in sorted(_sum_by_errno(self.failures).items())}

    def to_json(self, capture: str | None = None, top: int = 20) -> dict[str, Any]:
        created = self.created
        leaked, running = self.leaked(top), self.running_at_end(top)
        return {
            **self.header_json(self.tracer_name, capture),
            "created": len(created),
            "created_detached": sum(r.detached_at_create for r in created),
            "detached": sum(r.detached for r in created),
            "joined": sum(r.joined for r in created),
            "exited": sum(r.exited for r in created),
            "pthread_exit_calls": self.pthread_exits,
            "unmatched": dict(self.unmatched),
            "failed": self.failed_by_error(),
            "failures_by_stack": [f.to_json() for f in self.failure_groups(top)],
            "existing_at_start": self.existing,
            "peak": {"count": self.peak, "t_ms": self.peak_t},
            "leaked": {"count": leaked.count, "stack_bytes": leaked.stack_bytes,
                       "by_stack": [g.to_json() for g in leaked.by_stack],
                       "meaning": LEAKED_MEANING},
            "running_at_end": {"count": running.count, "joinable": running.joinable,
                               "by_stack": [g.to_json() for g in running.by_stack]},
            "created_by_stack": [g.to_json() for g in self._group(created, top)],
            "default_stack_size": self.info.get("default_stack_size"),
            "missing": self.missing,
            **self.timing_json(),
        }


LEAKED_MEANING = ("joinable threads that exited and were never joined or detached: each still holds its stack "
                  "and thread descriptor")


def _sum_by_errno(failures: Counter[tuple[int, tuple[int, ...], int | None]]) -> Counter[int]:
    out: Counter[int] = Counter()
    for (e, _, _), n in failures.items():
        out[e] += n
    return out


def _addr(v: Any) -> int | None:
    if isinstance(v, str):
        return int(v, 16)
    return int(v) if isinstance(v, int) else None



def summarize(records: Iterable[Record]) -> ThreadsSummary:
    return fold_events(ThreadsSummary(), records)


# ---- the events the capture reader checks (registered by tracers/threads.py's TRACER.events) -----


class CreateEvent(Event):
    TYPE: ClassVar[str] = "create"
    routine: Addr | None = None
    detached: bool | None = None
    stack_size: Count | None = None


class CreateFailedEvent(Event):
    TYPE: ClassVar[str] = "create-failed"
    errno: int | None = None
    routine: Addr | None = None
    stack_size: Count | None = None


class StartEvent(Event):
    TYPE: ClassVar[str] = "start"
    name: str | None = None
    routine: Addr | None = None


class ExistingEvent(Event):
    TYPE: ClassVar[str] = "existing"
    name: str | None = None


class ExitEvent(Event):
    TYPE: ClassVar[str] = "exit"


class RenameEvent(Event):
    TYPE: ClassVar[str] = "rename"
    name: str | None = None
    previous: str | None = None


class DetachFailedEvent(Event):
    TYPE: ClassVar[str] = "detach-failed"
    errno: int | None = None


class JoinFailedEvent(Event):
    TYPE: ClassVar[str] = "join-failed"
    errno: int | None = None


EVENTS = (CreateEvent, CreateFailedEvent, StartEvent, ExistingEvent, ExitEvent, RenameEvent, DetachFailedEvent,
          JoinFailedEvent)
