"""The hold before constructors waits for a program the machine's load keeps from running, and gives
up at once on one whose loader went past it (CI: a program starved for 10 s ran on untraced)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import frida
import pytest
from tests.children import kill_and_reap

from memtrace import hold
from memtrace.capture_loop import CaptureOptions, run_capture
from memtrace.exitwatch import local_pid_alive
from memtrace.frida_host import FridaHost
from memtrace.target import TargetSpec

pytestmark = pytest.mark.integration


@pytest.fixture()
def device() -> Iterator[frida.core.Device]:
    yield frida.get_local_device()


def _library(tmp_path: Path) -> Path:
    lib, why = hold.library(tmp_path / "cache")
    if lib is None:
        pytest.skip(f"no hold library here: {why}")
    return lib


def test_a_program_not_yet_running_at_the_deadline_is_still_held(device: frida.core.Device, tmp_path: Path) -> None:
    h = hold.Hold(_library(tmp_path))
    # Frida's spawn leaves the program before its loader's first step: as a starved program is.
    pid = device.spawn(["/bin/sleep", "30"], env=h.env)
    try:
        assert h.on_its_way(pid)                    # nothing but the loader mapped yet
        result: list[bool] = []
        waiter = threading.Thread(target=lambda: result.append(
            h.reach(lambda: local_pid_alive(pid), timeout=0.2, pid=pid, longest=60)))
        waiter.start()
        time.sleep(1.5)                             # well past the 0.2 s look
        assert waiter.is_alive() and not result     # still waiting for it
        device.resume(pid)
        waiter.join(60)
        assert result == [True]
        assert h.on_its_way(pid)                    # at the hold: our library is loaded
        assert local_pid_alive(pid)                 # held, not gone
    finally:
        h.close()
        device.kill(pid)


def test_a_loader_that_ignored_the_hold_library_is_not_waited_for(device: frida.core.Device,
                                                                  tmp_path: Path) -> None:
    # An audit library ld.so cannot load is ignored (as in a set-user-ID program): the program
    # loads libc without it and runs on, and reach says so at its first look.
    h = hold.Hold(tmp_path / "missing-hold.so")
    pid = device.spawn(["/bin/sleep", "30"], env=h.env)
    try:
        device.resume(pid)
        for _ in range(500):                        # until its loader has mapped libc
            maps = Path(f"/proc/{pid}/maps").read_text()
            if "libc" in maps:
                break
            time.sleep(0.01)
        assert "libc" in maps
        assert not h.on_its_way(pid)
        assert h.reach(lambda: local_pid_alive(pid), timeout=0.2, pid=pid, longest=60) is False
        assert local_pid_alive(pid)                 # given up on it while it runs: no wait for its end
        assert not h.dir.exists()                   # and nothing left in /tmp
    finally:
        device.kill(pid)


def test_a_static_program_is_not_waited_for(device: frida.core.Device, tmp_path: Path, compile_c) -> None:
    # No loader, so no audit library and no hold point: waited for, it cost 120 s.
    h = hold.Hold(_library(tmp_path))
    pid = device.spawn([str(compile_c("steady", "-static"))], env=h.env)
    try:
        assert not h.on_its_way(pid)
        device.resume(pid)
        assert h.reach(lambda: local_pid_alive(pid), timeout=0.2, pid=pid, longest=600) is False
        assert local_pid_alive(pid)
    finally:
        h.close()
        device.kill(pid)


@pytest.mark.parametrize("launched", ["spawned", "pid"])
def test_the_held_main_threads_wait_is_known_to_the_world_stop(
        launched: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program memtrace holds waits in the hold library: the world stop knows that code (its main
    thread's stack, ld.so's frames, is not searched for Frida's code while it waits there: one such
    frame's stale word once lay where Frida's agent was mapped later, and the start was refused).
    A program memtrace attached to runs: nothing is known."""
    answers: list[dict] = []
    real_rpc = FridaHost.rpc

    def keeping_the_stop(self: FridaHost, what: str, method: str, *args: object, timeout: float | None = None) -> object:
        answer = real_rpc(self, what, method, *args, timeout=timeout)
        if method == "stop" and isinstance(answer, dict):
            answers.append(answer)
        return answer

    monkeypatch.setattr(FridaHost, "rpc", keeping_the_stop)
    sleeper = None
    if launched == "pid":
        sleeper = subprocess.Popen(["/bin/sleep", "30"])
        target = TargetSpec(device="local", pid=sleeper.pid)
    else:
        target = TargetSpec(device="local", argv=["/bin/sleep", "30"])
    try:
        result = run_capture("malloc", target, CaptureOptions("malloc", window=1, out=tmp_path / "c"))
    finally:
        if sleeper is not None:
            kill_and_reap(sleeper)
    assert result.ended in ("completed", "slow-start"), result.reason
    [answer] = answers
    assert answer["world"]["hold_code"] is (launched == "spawned"), answer["world"]
