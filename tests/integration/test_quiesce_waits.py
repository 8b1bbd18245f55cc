"""The hooks come out while a thread is still inside memtrace's code: the agent waits for it to leave
before its code is freed, past the quiesce's first 3 s when the thread is really there.

tests/programs/blocked_in_malloc.c holds glibc's main arena for as long as the test wants (a thread
in malloc_stats, which prints with the arena's lock held, to a stderr pipe filled first), and its
main thread's next malloc waits for that lock inside glibc's malloc -- under memtrace's hook: a
return address into memtrace's code on its stack.  Before round 26 the quiesce gave up after 3 s
and the agent unloaded regardless: the thread, let go later, returned into freed code."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ..children import exit_of, kill_and_reap  # noqa: TID252
from .tracer_agent import load_tracer

frida = pytest.importorskip("frida")

HELD_S = 5.0          # the main thread kept inside the hook past the quiesce's first 3 s


def _stderr_drained(fd: int) -> int:
    os.set_blocking(fd, False)
    n = 0
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        try:
            got = os.read(fd, 1 << 16)
        except BlockingIOError:
            time.sleep(0.02)
            continue
        if not got:
            break
        n += len(got)
    return n


@pytest.mark.timeout(120)
def test_the_hooks_wait_for_a_thread_held_inside_them(compile_c, tmp_path: Path) -> None:
    import subprocess

    exe = compile_c("blocked_in_malloc")
    target = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert target.stdout is not None and target.stdin is not None and target.stderr is not None
        assert target.stdout.readline() == b"ready\n"
        session = frida.get_local_device().attach(target.pid)
        try:
            script, api = load_tracer(session, "malloc")
            api.start()
            time.sleep(0.2)
            target.stdin.write(b"go\n")
            target.stdin.flush()
            assert target.stdout.readline() == b"blocking\n"
            time.sleep(0.3)         # the main thread's next malloc: into the hook, then waiting for the lock
            wchan = Path(f"/proc/{target.pid}/task/{target.pid}/wchan").read_text()
            assert "futex" in wchan, wchan
            # The hooks out (and the wait for our code to be left) while the thread is held; the
            # lock let go HELD_S later.
            # The agent unloaded as soon as the stop returns, as memtrace's host does: code freed
            # under the held thread would kill it once the lock comes free.
            stopped: dict[str, Any] = {}

            def stop_and_unload() -> None:
                stopped.update(api.stop())
                stopped["t"] = time.monotonic()
                script.unload()

            stopper = threading.Thread(target=stop_and_unload)
            t0 = time.monotonic()
            stopper.start()
            time.sleep(HELD_S)
            early = not stopper.is_alive()
            drained = _stderr_drained(target.stderr.fileno())
            stopper.join(30)
            waited = stopped["t"] - t0
        finally:
            session.detach()
        time.sleep(0.5)
        world = stopped["world"]
        assert exit_of(target) is None, f"the target died (the stop returned after {waited:.1f} s: {world})"
        assert drained > 0 and not early, (early, waited, world)
        # It waited for the thread (a return address into the module, after a call: live) past the
        # first 3 s, and the wait ended with no thread inside.
        assert world["quiesced"] == 2 and world["quiesced_late"] == 1 and world["not_quiesced"] == 0, world
        assert waited >= HELD_S, waited
        # The main thread goes on allocating, unhooked.
        before = Path(f"/proc/{target.pid}/task/{target.pid}/stat").read_text().split()[13]
        time.sleep(0.3)
        after = Path(f"/proc/{target.pid}/task/{target.pid}/stat").read_text().split()[13]
        assert exit_of(target) is None and int(after) >= int(before)
    finally:
        kill_and_reap(target)
