"""What the live view shows while a capture runs: each tracer's own running statistics.

The capture loop feeds every agent batch (binary, from a C core) and every JSON event to the
tracer's :class:`LiveStats`; the loop reads back the cumulative activity (the rate that death
classification and the slow-start verdict rest on), the bytes, the drops, and the rows the
panel shows.  A tracer's registry entry picks the class and names its rows.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from memtrace.capture import alloc_totals, calls_total
from memtrace.layout import COUNTERS
from memtrace.units import fmt_bytes

Row = tuple[str, str]


class LiveStats:
    """Running statistics of one capture; the base knows JSON events by type."""

    def __init__(self) -> None:
        self.events: Counter[str] = Counter()
        self.activity_events = 0
        self.event_bytes = 0

    def batch(self, body: dict[str, Any]) -> None:
        """A binary batch from a C core (its counters ride in the body)."""

    def event(self, ev: dict[str, Any]) -> None:
        self.events[str(ev.get("type"))] += 1
        # A census or the threads present at attach is a snapshot, not activity in the window.
        if ev.get("activity", True):
            self.activity_events += 1
        size = ev.get("bytes", ev.get("alloc_size"))
        if isinstance(size, int) and not isinstance(size, bool):
            self.event_bytes += size

    def activity(self) -> int:
        """Cumulative traced calls: the rate of this is what death classification reads."""
        return self.activity_events

    def volume(self) -> int:
        return self.event_bytes

    def dropped(self) -> int:
        return 0

    def rows(self) -> list[Row]:
        return [("events", f"{self.activity_events:,}")]

    def snapshot(self) -> dict[str, Any]:
        """What the periodic SNAPSHOT record keeps beyond the rates (death evidence)."""
        return {"events": dict(self.events)}


GROWTH_WINDOW_S = 3.0      # the live view's "growing fastest": live bytes gained over the last seconds


class CoreStats(LiveStats):
    """A tracer with a C core: exact counters arrive with every batch."""

    def __init__(self) -> None:
        super().__init__()
        self.counters: list[int] = [0] * 64
        self.live = 0
        self.stacks = 0
        self.tracked: int | None = None     # bytes in tracked blocks (aggregate core)
        self.peak: int | None = None        # their high-water mark
        self.footprint: int | None = None   # the target's footprint and its allocator's in-use bytes,
        self.in_use: int | None = None      # as the core read them at its last timeline sample
        # (agent ms, {stack id: live bytes}) of the timeline samples: the largest stacks at each drain.
        self.samples: deque[tuple[float, dict[int, int]]] = deque(maxlen=64)
        self.label: Callable[[int], str] = lambda sid: f"stack {sid}"     # the capture loop names stacks

    def batch(self, body: dict[str, Any]) -> None:
        counters = body.get("counters")
        if isinstance(counters, list) and counters:
            self.counters = counters
        self.live = int(body.get("live") or 0)
        self.stacks = int(body.get("stacks") or 0)
        tracked, peak = body.get("tracked"), body.get("peak")
        if isinstance(tracked, dict):
            self.tracked = int(tracked.get("bytes") or 0)
        if isinstance(peak, dict):
            self.peak = int(peak.get("bytes") or 0)
        sample = body.get("sample")
        if isinstance(sample, dict):
            if isinstance(sample.get("footprint"), int | float):
                self.footprint = int(sample["footprint"])
            if isinstance(sample.get("in_use"), int | float):
                self.in_use = int(sample["in_use"])
            top = {int(r[0]): int(r[1]) for r in sample.get("top") or [] if isinstance(r, list | tuple) and len(r) >= 2}
            if isinstance(sample.get("t"), int | float):
                self.samples.append((float(sample["t"]), top))

    def growing(self, n: int = 3) -> list[tuple[int, float, int]]:
        """The stacks whose live bytes grew fastest over the last GROWTH_WINDOW_S seconds:
        (stack id, bytes per second, live bytes now), fastest first, growing ones only."""
        if len(self.samples) < 2:
            return []
        t_now, now = self.samples[-1]
        t_then, then = next(((t, top) for t, top in self.samples if t_now - t <= GROWTH_WINDOW_S * 1000),
                            self.samples[-2])
        dt = (t_now - t_then) / 1000
        if dt <= 0:
            return []
        rates = [(sid, (live - then.get(sid, 0)) / dt, live) for sid, live in now.items()]
        return sorted((r for r in rates if r[1] > 0), key=lambda r: -r[1])[:n]

    def activity(self) -> int:
        # Every call, releases included: the event rate.
        return calls_total(self.counters) + self.activity_events

    def volume(self) -> int:
        return alloc_totals(self.counters)[1]

    def dropped(self) -> int:
        return self.counters[COUNTERS["dropped_records"]] + self.counters[COUNTERS["dropped_stacks"]]

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {"counters": self.counters, "live": self.live, "stacks": self.stacks}
        if self.tracked is not None:
            out["tracked_bytes"], out["peak_bytes"] = self.tracked, self.peak
        return out


def event_stats(rows: Callable[[Counter[str], LiveStats], list[Row]]) -> Callable[[], LiveStats]:
    """A JSON-event tracer's stats whose rows are computed from its event counts."""

    class _Stats(LiveStats):
        def rows(self) -> list[Row]:
            return rows(self.events, self)

    return _Stats


def bytes_row(label: str, n: int) -> Row:
    return (label, fmt_bytes(n))
