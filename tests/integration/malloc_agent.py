"""The malloc agent loaded by hand into a program Frida spawned and holds at its first
instruction (the program itself makes no call), for the tests that drive the agent's RPC
directly (test_leaks.py, test_malloc_logger.py): its exports and the batches it sends."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import frida

from memtrace.agentbuild import build_agent

# What every such test gives init besides its thresholds, frames and toolchain: small tables.
BASE_CONFIG: dict[str, Any] = {"sampleBytes": 0, "ringKb": 64, "threadSlots": 64, "rings": 8,
                               "stackTable": 1024, "liveTable": 4096, "backend": "auto"}


class HeldAgent(NamedTuple):
    api: Any                        # the script's exports_sync
    batches: list[dict[str, Any]]   # every events:batch payload, in order

    def counters(self) -> list[int]:
        """The agent's counters now: a flush, then the batch it sent."""
        self.api.flush()
        time.sleep(0.3)
        return self.batches[-1]["counters"]


@contextlib.contextmanager
def malloc_agent_in(argv: Sequence[str | Path], toolchain: str, **config: Any) -> Iterator[HeldAgent]:
    """The malloc agent initialized (``config`` over BASE_CONFIG, compiled by ``toolchain``) in
    ``argv`` spawned and never resumed; stopped and detached after, and the program killed."""
    device = frida.get_local_device()
    pid = device.spawn([str(a) for a in argv], stdio="pipe")
    try:
        session = device.attach(pid)
        agent = build_agent("malloc")
        script = session.create_script(agent.source)
        batches: list[dict[str, Any]] = []
        script.on("message", lambda m, d: batches.append(m["payload"])
                  if m.get("type") == "send" and m["payload"].get("type") == "events:batch" else None)
        script.load()
        api = script.exports_sync
        init = api.init({**BASE_CONFIG, **config, "toolchain": toolchain}, agent.c_sources)
        assert init["info"]["toolchain"] == toolchain
        yield HeldAgent(api, batches)
        api.stop()
        session.detach()
    finally:
        # Never resumed; frida-core may already have reaped it on detach.
        with contextlib.suppress(frida.ProcessNotFoundError):
            device.kill(pid)
