"""FridaHost.call: every Frida call runs on one reactor thread, with a deadline.

A call whose deadline passes while it is still queued behind another is dropped -- except one the
capture wants made anyway (the leak scan: a late scan is said, not skipped; with a 1 ms budget on a
loaded CI host the reactor had not reached it yet, and the capture lost its result)."""

from __future__ import annotations

import threading

import pytest

from memtrace.errors import AgentTimeout
from memtrace.frida_host import FridaHost
from memtrace.target import TargetSpec

pytest.importorskip("frida_tools")


def test_a_call_queued_past_its_deadline_is_dropped_unless_it_runs_late() -> None:
    host = FridaHost(TargetSpec(device="local", pid=1), rpc_timeout=10)
    release = threading.Event()
    blocking = threading.Event()
    made: list[str] = []

    def block() -> None:
        blocking.set()
        release.wait(10)

    blocker = threading.Thread(target=host.call, args=("blocker", block))
    blocker.start()
    try:
        assert blocking.wait(10)
        # Both wait 10 ms behind the blocker: neither has started when its deadline passes.
        with pytest.raises(AgentTimeout):
            host.call("dropped", lambda: made.append("dropped"), timeout=0.01)
        with pytest.raises(AgentTimeout):
            host.call("late", lambda: made.append("late"), timeout=0.01, run_late=True)
    finally:
        release.set()
        blocker.join(10)
    # Calls run in order on the reactor: once this one is made, the two above were, or never will be.
    host.call("after", lambda: made.append("after"))
    assert made == ["late", "after"]
    host.close()
