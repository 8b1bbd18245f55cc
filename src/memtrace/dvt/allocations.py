"""Instruments' Allocations events as the capture's per-event agent records.

pymobiledevice3's ``AllocationEventParser`` decodes the device's stream into ``AllocationEvent``s
(type, address, argument, thread, size, backtrace innermost first).  :class:`EventTranslator`
turns them into exactly what memtrace's own agent writes in ``--events`` mode -- STACK records
(each distinct backtrace interned once), ALLOC and FREE records, and the counters -- so one
analyzer (``analyze/malloc.py``'s event fold) reads both.  It is a pure fold: no device, no I/O.

What maps to what:
  MALLOC      malloc: one call, its bytes and size tier; the block live under its stack
  REALLOC     realloc: a release of the old block (argument) and an allocation of the new one
  FREE        free: one call; the block leaves the live set
  VM_ALLOCATE / VM_DEALLOCATE   Darwin's VM line (vm_allocate / vm_deallocate kinds), counted and
              recorded apart from the malloc family exactly as the logger path does
  anything else (class names, retain/release, zombies): counted in ``other_events`` and dropped

Temporaries follow memtrace's definition (a block freed by the thread that made it, with no other
allocation on that thread in between), read from the events' thread and order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from memtrace import layout
from memtrace.capture import (
    FLAG_LIVE,
    NO_STACK,
    AllocRecord,
    FreeRecord,
    StackRecord,
    encode_agent_records,
)

# pymobiledevice3 11.45 services/dvt/instruments/allocations.py AllocationEventType
EV_MALLOC, EV_REALLOC, EV_FREE = 16, 18, 19
EV_VM_ALLOCATE, EV_VM_DEALLOCATE = 23, 26

K = layout.KINDS
C = layout.COUNTERS


class Event(Protocol):
    """The fields of pymobiledevice3's ``AllocationEvent`` that are read."""

    type: int
    address: int
    argument: int
    thread: int
    size: int
    backtrace: tuple[int, ...]


def _tier(size: int) -> int:
    for i, top in enumerate(layout.TIER_MAX_BYTES):
        if top is None or size <= top:
            return i
    return len(layout.TIER_MAX_BYTES) - 1


@dataclass
class EventTranslator:
    """Events in, agent-format batches out (``take()``), with the running counters."""

    max_frames: int = layout.MAX_FRAMES
    counters: list[int] = field(default_factory=lambda: [0] * layout.N_COUNTERS)
    stacks: dict[tuple[int, ...], int] = field(default_factory=dict)
    live: dict[int, tuple[int, int]] = field(default_factory=dict)   # address -> (size, stack id)
    other_events: int = 0
    unmatched_frees: int = 0
    _pending: dict[int, list[Any]] = field(default_factory=dict)  # thread -> records since the last take
    _last: dict[int, int] = field(default_factory=dict)           # thread -> its last allocation
    _events: int = 0

    # -- one event ------------------------------------------------------------

    def feed(self, ev: Event) -> None:
        t = ev.type
        if t == EV_MALLOC:
            self._alloc(ev, K["malloc"], ev.address, ev.size)
        elif t == EV_REALLOC:
            old = ev.argument
            if old:
                self._release(ev.thread, K["realloc"], old, count=False)
            self._alloc(ev, K["realloc"], ev.address, ev.size)
        elif t == EV_FREE:
            self._count(K["free"], None)
            self._release(ev.thread, K["free"], ev.address, count=False)
        elif t == EV_VM_ALLOCATE:
            self._count(K["vm_allocate"], None, ev.size)
            self._records(ev.thread).append(AllocRecord(ev.thread, K["vm_allocate"], FLAG_LIVE,
                                                        self._stack(ev), ev.address, ev.size, ev.size))
        elif t == EV_VM_DEALLOCATE:
            self._count(K["vm_deallocate"], None, ev.size)
            self._records(ev.thread).append(FreeRecord(ev.thread, K["vm_deallocate"], ev.address, ev.size))
        else:
            self.other_events += 1
            return
        self._events += 1

    def _alloc(self, ev: Event, kind: int, ptr: int, size: int) -> None:
        if ptr == 0:        # the allocation failed: a failed call, never bytes
            self._count(kind, None)
            self.counters[C["failed_allocs"]] += 1
            return
        self._count(kind, size, size)
        sid = self._stack(ev)
        self.live[ptr] = (size, sid)
        self._last[ev.thread] = ptr
        self._records(ev.thread).append(AllocRecord(ev.thread, kind, FLAG_LIVE, sid, ptr, size, size))

    def _release(self, thread: int, kind: int, ptr: int, count: bool) -> None:
        entry = self.live.pop(ptr, None)
        if entry is None:
            self.unmatched_frees += 1
            return
        size = entry[0]
        self.counters[C["tracked_frees"]] += 1
        if self._last.get(thread) == ptr:
            self.counters[C["temp_calls"]] += 1
            self.counters[C["temp_bytes"]] += size
        self._last.pop(thread, None)
        self._records(thread).append(FreeRecord(thread, kind, ptr, size))

    def _count(self, kind: int, tier_size: int | None, nbytes: int = 0) -> None:
        self.counters[layout.C_CALLS + kind] += 1
        self.counters[layout.C_BYTES + kind] += nbytes
        if tier_size is not None:
            t = _tier(tier_size)
            self.counters[layout.C_TIER_CALLS + t] += 1
            self.counters[layout.C_TIER_BYTES + t] += tier_size

    def _stack(self, ev: Event) -> int:
        frames = tuple(ev.backtrace)
        if not frames:
            return NO_STACK
        if len(frames) > self.max_frames:
            # The innermost frames are the evidence; the outermost go.
            frames = frames[:self.max_frames]
            self.counters[C["truncated_stacks"]] += 1
        sid = self.stacks.get(frames)
        if sid is None:
            sid = len(self.stacks) + 1
            self.stacks[frames] = sid
            self._records(ev.thread).append(StackRecord(ev.thread, sid, frames))
        return sid

    def _records(self, thread: int) -> list[Any]:
        return self._pending.setdefault(thread, [])

    # -- batches ----------------------------------------------------------------

    def take(self, t: float) -> tuple[dict[str, Any], bytes] | None:
        """The records since the last call as one ``events:batch`` (payload, data), or None when
        nothing happened.  Each thread's records stay in their order (the agent's own chunks)."""
        if not self._pending:
            return None
        data = b"".join(encode_agent_records(tid & 0xFFFFFFFF, recs) for tid, recs in self._pending.items())
        self._pending = {}
        payload = {"type": "events:batch", "t": t, "final": False, "counters": list(self.counters),
                   "lost": 0, "live": len(self.live), "stacks": len(self.stacks), "source": "dvt",
                   "other_events": self.other_events}
        return payload, data
