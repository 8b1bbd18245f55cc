"""Instruments' Allocations events as the capture's aggregate records, exactly as memtrace's C core
keeps them in the target.

pymobiledevice3's ``AllocationEventParser`` decodes the device's stream into ``AllocationEvent``s
(type, address, argument, thread, size, backtrace innermost first).  :class:`EventTranslator` folds
them as ``cmodule/core.c`` + ``track.c`` fold the hooked calls, and ships the same records the
agent's drain does -- STACK definitions (each distinct backtrace once), per-stack running totals
(AGG: allocations, bytes, frees, temporaries), the composition at the peak (PEAK_HEAD + PEAK), a
timeline sample per batch, the live blocks at the end (LIVE) -- with the same counters, so one
analyzer (``analyze/malloc.py``'s aggregate fold) gives a DVT capture the same summary, peak,
temporaries, timeline, report chapter, flame graph and diff as a Frida capture.  A pure fold: no
device, no I/O.

What maps to what:
  MALLOC      malloc: one call, its bytes and size tier; the block live under its stack
  REALLOC     realloc: a release of the old block (argument) and an allocation of the new one
  FREE        free: one call; the block leaves the live set
  VM_ALLOCATE / VM_DEALLOCATE   Darwin's VM line (vm_allocate / vm_deallocate kinds), counted and
              recorded apart from the malloc family exactly as the logger path does
  anything else (class names, retain/release, zombies): counted in ``other_events`` and dropped

Every block is tracked and every allocation has its stack (the service sends both), so the peak
is exact: the composition is the live set by stack at the instant tracked bytes were highest.
Temporaries follow memtrace's definition (freed by the thread that made it, with no other
allocation on that thread in between).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from memtrace import layout
from memtrace.capture import (
    FLAG_LIVE,
    NO_STACK,
    AggRecord,
    AllocRecord,
    FreeRecord,
    LiveRecord,
    PeakHeadRecord,
    PeakRecord,
    StackRecord,
    encode_agent_records,
)

# pymobiledevice3 11.45 services/dvt/instruments/allocations.py AllocationEventType
EV_MALLOC, EV_REALLOC, EV_FREE = 16, 18, 19
EV_VM_ALLOCATE, EV_VM_DEALLOCATE = 23, 26

K = layout.KINDS
C = layout.COUNTERS
TICK_MS = 100           # the live table's age unit, as the agent's drain count
NO_THREAD = 0           # chunk of records that belong to no thread (totals, peak, live blocks)


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
class _Totals:
    """One stack's running totals (the AGG fields the core ships) and its live set now."""

    allocs: int = 0
    bytes: int = 0
    frees: int = 0
    freed_bytes: int = 0
    temp: int = 0
    temp_bytes: int = 0

    def values(self) -> dict[str, int]:
        return {"allocs": self.allocs, "bytes": self.bytes, "frees": self.frees, "freed_bytes": self.freed_bytes,
                "temp": self.temp, "temp_bytes": self.temp_bytes}

    @property
    def live_bytes(self) -> int:
        return self.bytes - self.freed_bytes

    @property
    def live_count(self) -> int:
        return self.allocs - self.frees


@dataclass
class EventTranslator:
    """Events in (``feed``), agent-format batches out (``take``), with the running counters."""

    max_frames: int = layout.MAX_FRAMES
    counters: list[int] = field(default_factory=lambda: [0] * layout.N_COUNTERS)
    stacks: dict[tuple[int, ...], int] = field(default_factory=dict)
    live: dict[int, tuple[int, int]] = field(default_factory=dict)   # address -> (size, stack id)
    other_events: int = 0
    unmatched_frees: int = 0
    now_ms: float = 0.0               # the host's clock for the events being fed (set by the caller)
    _totals: dict[int, _Totals] = field(default_factory=dict)
    _touched: set[int] = field(default_factory=set)
    _born: dict[int, float] = field(default_factory=dict)            # address -> ms when allocated
    _pending: dict[int, list[Any]] = field(default_factory=dict)      # thread -> records since the last take
    _last: dict[int, int] = field(default_factory=dict)               # thread -> its last allocation
    _tracked: int = 0
    _tracked_blocks: int = 0
    _peak: tuple[int, int, float] = (0, 0, 0.0)                       # bytes, blocks, ms
    _peak_epoch: int = 0
    _peak_shipped: int = 0
    _since_peak: dict[int, list[int]] = field(default_factory=dict)   # stack -> [bytes, blocks] since the peak
    _first: bool = True

    # -- one event ------------------------------------------------------------

    def feed(self, ev: Event) -> None:
        t = ev.type
        if t == EV_MALLOC:
            self._alloc(ev, "malloc", ev.address, ev.size)
        elif t == EV_REALLOC:
            if ev.argument:
                self._release(ev.thread, ev.argument)
            self._alloc(ev, "realloc", ev.address, ev.size)
        elif t == EV_FREE:
            self._count("free", None)
            self._release(ev.thread, ev.address)
        elif t == EV_VM_ALLOCATE:
            self._count("vm_allocate", None, ev.size)
            self._records(ev.thread).append(AllocRecord(ev.thread, K["vm_allocate"], FLAG_LIVE,
                                                        self._stack(ev), ev.address, ev.size, ev.size))
        elif t == EV_VM_DEALLOCATE:
            self._count("vm_deallocate", None, ev.size)
            self._records(ev.thread).append(FreeRecord(ev.thread, K["vm_deallocate"], ev.address, ev.size))
        else:
            self.other_events += 1

    def _alloc(self, ev: Event, kind: str, ptr: int, size: int) -> None:
        if ptr == 0:        # the allocation failed: a failed call, never bytes
            self._count(kind, None)
            self.counters[C["failed_allocs"]] += 1
            return
        self._count(kind, size, size)
        sid = self._stack(ev)
        if ptr in self.live:            # a block freed unseen: its address handed out again
            self._release(ev.thread, ptr)
        self.live[ptr] = (size, sid)
        self._born[ptr] = self.now_ms
        self._last[ev.thread] = ptr
        row = self._row(sid)
        row.allocs += 1
        row.bytes += size
        self._tracked += size
        self._tracked_blocks += 1
        if self._tracked > self._peak[0]:
            # A new high-water mark: the live set by stack is the composition, from here on
            # changes are kept apart so it can be read back at the next batch.
            self._peak = (self._tracked, self._tracked_blocks, self.now_ms)
            self._peak_epoch += 1
            self._since_peak = {}
        else:
            d = self._since_peak.setdefault(sid, [0, 0])
            d[0] += size
            d[1] += 1

    def _release(self, thread: int, ptr: int) -> None:
        entry = self.live.pop(ptr, None)
        if entry is None:
            self.unmatched_frees += 1
            return
        size, sid = entry
        self._born.pop(ptr, None)
        self.counters[C["tracked_frees"]] += 1
        row = self._row(sid)
        row.frees += 1
        row.freed_bytes += size
        if self._last.get(thread) == ptr:
            self.counters[C["temp_calls"]] += 1
            self.counters[C["temp_bytes"]] += size
            row.temp += 1
            row.temp_bytes += size
        self._last.pop(thread, None)
        self._tracked -= size
        self._tracked_blocks -= 1
        d = self._since_peak.setdefault(sid, [0, 0])
        d[0] -= size
        d[1] -= 1

    def _row(self, sid: int) -> _Totals:
        self._touched.add(sid)
        row = self._totals.get(sid)
        if row is None:
            row = self._totals[sid] = _Totals()
        return row

    def _count(self, kind: str, tier_size: int | None, nbytes: int = 0) -> None:
        self.counters[layout.calls_at(kind)] += 1
        self.counters[layout.bytes_at(kind)] += nbytes
        if tier_size is not None:
            t = _tier(tier_size)
            self.counters[layout.tier_calls_at(t)] += 1
            self.counters[layout.tier_bytes_at(t)] += tier_size

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

    def composition(self) -> dict[int, tuple[int, int]]:
        """The live set by stack at the peak: now, less what changed since."""
        out = {}
        for sid, row in self._totals.items():
            d = self._since_peak.get(sid, (0, 0))
            b, n = row.live_bytes - d[0], row.live_count - d[1]
            if n > 0:
                out[sid] = (b, n)
        return out

    def take(self, t_ms: float, final: bool = False) -> tuple[dict[str, Any], bytes]:
        """The records since the last call as one ``events:batch`` (payload, data), in the
        aggregate mode's shape: each thread's stack definitions and VM records in its order, then
        the touched stacks' totals, the composition at a new peak, and (final) the live blocks."""
        shared: list[Any] = [AggRecord(sid, self._totals[sid].values()) for sid in sorted(self._touched)]
        self._touched = set()
        if self._peak_epoch != self._peak_shipped:
            comp = self.composition()
            shared.append(PeakHeadRecord(len(comp), self._peak_epoch, self._peak[0], self._peak[1],
                                         int(self._peak[2] * 1000)))
            shared += [PeakRecord(sid, b, n) for sid, (b, n) in sorted(comp.items())]
            self._peak_shipped = self._peak_epoch
        if final:
            shared += [LiveRecord(sid, ptr, size, int(self._born.get(ptr, 0.0) // TICK_MS) & 0xFFFFFF, 0)
                       for ptr, (size, sid) in self.live.items()]
        chunks = [encode_agent_records(tid & 0xFFFFFFFF, recs) for tid, recs in self._pending.items()]
        self._pending = {}
        if shared:
            chunks.append(encode_agent_records(NO_THREAD, shared))
        top = sorted(((r.live_bytes, sid) for sid, r in self._totals.items() if r.live_bytes > 0), reverse=True)
        payload: dict[str, Any] = {
            "type": "events:batch", "t": t_ms, "mode": "aggregate", "final": final,
            "counters": list(self.counters), "lost": 0, "live": len(self.live), "stacks": len(self.stacks),
            "source": "dvt", "other_events": self.other_events,
            "tracked": {"bytes": self._tracked, "blocks": self._tracked_blocks},
            "peak": {"epoch": self._peak_epoch, "bytes": self._peak[0]},
            "clock": [int(t_ms * 1000), t_ms],
            "sample": {"t": t_ms, "tracked_bytes": self._tracked, "tracked_blocks": self._tracked_blocks,
                       "peak_bytes": self._peak[0], "in_use": None, "footprint": None,
                       "top": [[sid, b] for b, sid in top[:layout.TOP_STACKS]]},
        }
        if self._first:
            payload["t0"] = 0
            self._first = False
        if final:
            payload["live_done"] = True
        return payload, b"".join(chunks)
