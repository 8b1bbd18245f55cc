"""Before memtrace's process code (the descriptor guard, the execve hook) is unloaded, quiesce asks
whether any thread is inside it by a count the code keeps (process.c MT_PROC_ENTER/LEAVE) and, when
none is, looks at the threads' registers only (world.js quiesce).  Read conservatively, a stack can
point into the code for good: the hook storm's occasional `not_quiesced` was a stale word 4.6 KB up
a storm thread's stack, inside process.c, that no waiting cleared.

tests/programs/stale_return.c has a thread close a descriptor through the guard 8 frames deep, then
park in a 64 KiB frame it never writes (what those frames left stays in a live frame, beyond the
8 KiB read for Frida's own frames), waiting on stdin while the hooks come out.  The stop must find
the count back at 0 and let the code go at once (`quiesced_by_count`: a LEAVE missing anywhere, or
the count read at the wrong offset, fails it), and the target must live on and exit 0.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ..children import kill_and_reap  # noqa: TID252
from .tracer_agent import load_tracer

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

frida = pytest.importorskip("frida")


def test_a_stale_return_address_on_a_parked_thread_does_not_hold_the_code(
        compile_c: Callable[..., Path]) -> None:
    exe = compile_c("stale_return")
    tracer = "probe"        # hooks nothing of its own: the execve hook and the descriptor guard only
    target = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert target.stdin is not None and target.stdout is not None
    try:
        assert target.stdout.readline().strip() == "ready"
        session = frida.get_local_device().attach(target.pid)
        try:
            script, api = load_tracer(session, tracer)
            api.start()
            # The thread closes through the guard, then parks on the stale word.
            target.stdin.write("close\n")
            target.stdin.flush()
            assert target.stdout.readline().strip() == "held"
            world = api.stop()["world"]
            script.unload()
        finally:
            session.detach()
        target.stdin.write("x")
        target.stdin.flush()
        assert target.wait(timeout=30) == 0
    finally:
        kill_and_reap(target)
    assert world["why"] is None, world
    # The guard's close was called (and returned): the count went up and came back to 0.
    assert world["quiesced"] == 1 and world["not_quiesced"] == 0, world
    assert world["quiesced_by_count"] == 1, world
