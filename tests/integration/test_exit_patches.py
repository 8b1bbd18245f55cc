"""The exit's patches are made with the world stopped, without spinning on the exiting thread.

At process exit Frida's exit monitor holds the exiting thread inside Frida's code until the
agent's dispose returns; the hooks come out there (malloc's, the execve hook and the descriptor
guard, then the teardown).  Each of those patches wants a stop with no thread in Frida's code,
which never came while that thread was held: each spent its whole retry budget (0.5-1.2 s) and
was then made with the world running (issue 21: ~2 s of every run's end).  The held thread is now
left out of the exit's stops (runtime/world.js skipParkedAtExit) and every other thread -- here
two that allocate in a loop through the hooks -- is stopped as before.  The agent's own account
comes in its ``agent:exit`` message.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.children import kill_and_reap, wait_exit

from memtrace import tracers
from memtrace.agentbuild import build_agent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

frida = pytest.importorskip("frida")


def _exit_world(exe: Path, threads: int) -> dict[str, Any]:
    """The agent's account of the exit of `exe` run with `threads` churning threads."""
    target = subprocess.Popen([str(exe), str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert target.stdout is not None and target.stdin is not None
    assert target.stdout.readline().strip() == "ready"
    agent = build_agent("malloc")
    exited = threading.Event()
    said: list[dict[str, Any]] = []

    def on_message(message: dict[str, Any], data: Any) -> None:
        payload = message.get("payload") or {}
        if message.get("type") == "send" and payload.get("type") == "agent:exit":
            said.append(payload)
            exited.set()

    session = frida.get_local_device().attach(target.pid)
    try:
        script = session.create_script(agent.source)
        script.on("message", on_message)
        script.load()
        api = script.exports_sync
        api.init(tracers.all_tracers()["malloc"].agent_config(None, {}), agent.c_sources, agent.process_sources)
        api.start()
        target.stdin.write("exit\n")
        target.stdin.flush()
        assert exited.wait(60), "no agent:exit message"
        assert wait_exit(target, 60) == 0       # (this process is Frida's tracer: see exit_of)
    finally:
        kill_and_reap(target)
    return said[0]["world"]


def test_the_exits_patches_are_made_with_the_world_stopped(compile_c: Callable[..., Path]) -> None:
    world = _exit_world(compile_c("exit_busy", "-pthread"), 2)
    assert world["why"] is None, world
    # The exiting thread (and only it: the churning threads are stopped) was left out ...
    assert world["parked_at_exit"] == 1, world
    # ... and every patch, the exit's too, was made with the world stopped and clear.
    whats = [what for what, _n in world["log"]]
    assert "malloc hooks out" in whats and "descriptor guard out" in whats and "teardown" in whats, world
    assert world["applied"] >= 6 and world["stopped"] == world["applied"], world
    assert world["running"] == 0 and world["failed"] == 0 and world["frida_busy"] == 0, world
    # Both C modules waited out before they are freed: malloc's core and the process module
    # (the descriptor guard's and the execve hook's code).
    assert world["quiesced"] == 2 and world["not_quiesced"] == 0, world


def test_a_single_threaded_programs_exit_stops_nothing(compile_c: Callable[..., Path]) -> None:
    """Its one thread is the exiting one, held by Frida's exit monitor: no other thread of the
    program can run the bytes a patch rewrites or sit in our code, so the exit's patches are made
    without a stop (each stop clones a helper and attaches: ~6 ms of a short program's CPU) and the
    wait for threads in our code has nothing to wait for."""
    world = _exit_world(compile_c("exit_busy", "-pthread"), 0)
    assert world["why"] is None and world["parked_at_exit"] == 1, world
    whats = [what for what, _n in world["log"]]
    assert "malloc hooks out" in whats and "descriptor guard out" in whats and "teardown" in whats, world
    # The start's patches (hooks in) stopped the world; the exit's were made alone.
    exit_patches = len(whats) - whats.index("malloc hooks out")
    assert world["alone"] == exit_patches >= 3, world
    assert world["stopped"] + world["alone"] == world["applied"], world
    assert world["running"] == 0 and world["failed"] == 0 and world["frida_busy"] == 0, world
    assert world["quiesced"] == 2 and world["not_quiesced"] == 0, world
