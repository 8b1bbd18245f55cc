"""CaptureLoop.drain with a deadline: a source that is never quiet (an agent whose messages come
faster than the host handles them: the purgeable storm's hang, docs/hook-storm.md) still lets the
window's drain return at its deadline, with every event it took handled."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from memtrace import tracers
from memtrace.capture_loop import CaptureLoop, CaptureOptions
from memtrace.record_source import Records
from memtrace.target import TargetSpec

NEVER_QUIET = 2_000_000     # events a drain without a deadline would take before this test gives up


@dataclass
class FloodingSource:
    pid: int = 1
    spawned: bool = False
    is_local: bool = True
    given: int = 0
    asked: list[float] = field(default_factory=list)

    def next_event(self, timeout: float) -> Any:
        self.asked.append(timeout)
        self.given += 1
        if self.given > NEVER_QUIET:
            raise AssertionError("the drain never returned to its caller")
        return Records({"type": "events:json", "events": []}, b"")


def test_a_drain_with_a_deadline_returns_while_the_source_floods() -> None:
    source = FloodingSource()
    loop = CaptureLoop(source, tracers.all_tracers()["purgeable"],  # type: ignore[arg-type]
                       TargetSpec(device="local", pid=1, launch="none"), CaptureOptions(tracer="purgeable"))
    handled: list[Any] = []
    loop._handle = handled.append  # type: ignore[method-assign]
    loop.drain(wait=0.0, until=time.monotonic() + 0.2)
    assert 0 < len(handled) == source.given < NEVER_QUIET
    assert set(source.asked) == {0.0}
    # A deadline already past: nothing is taken.
    loop.drain(wait=0.0, until=time.monotonic() - 1)
    assert len(handled) == source.given


def test_a_drain_without_a_deadline_ends_when_the_source_is_quiet() -> None:
    class Quiet(FloodingSource):
        def next_event(self, timeout: float) -> Any:
            return super().next_event(timeout) if self.given < 3 else None

    source = Quiet()
    loop = CaptureLoop(source, tracers.all_tracers()["purgeable"],  # type: ignore[arg-type]
                       TargetSpec(device="local", pid=1, launch="none"), CaptureOptions(tracer="purgeable"))
    handled: list[Any] = []
    loop._handle = handled.append  # type: ignore[method-assign]
    loop.drain(wait=0.0)
    assert len(handled) == 3
