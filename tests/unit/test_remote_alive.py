"""The attach-delay wait asks a remote device whether the target lives: one pid, at most once a second."""

from __future__ import annotations

from typing import Any

from memtrace import frida_host, launchers
from memtrace.frida_host import FridaHost
from memtrace.target import TargetSpec


class FakeProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid


class FakeRemoteDevice:
    type = "usb"

    def __init__(self) -> None:
        self.queries: list[dict[str, Any]] = []
        self.running = {4242}

    def enumerate_processes(self, **kwargs: Any) -> list[FakeProcess]:
        self.queries.append(kwargs)
        pids = kwargs.get("pids") or sorted(self.running)
        return [FakeProcess(p) for p in pids if p in self.running]


def test_remote_liveness_asks_for_one_pid_and_not_every_poll(monkeypatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(frida_host.time, "monotonic", lambda: now[0])
    host = FridaHost(TargetSpec(device="usb", app="com.example"), rpc_timeout=5)
    host.device = FakeRemoteDevice()
    host.launched = launchers.Launched(4242, None, suspended=False, spawned=True, how="test")
    assert host.alive() is True
    for _ in range(9):                  # the wait polls every 100 ms
        now[0] += 0.1
        assert host.alive() is True
    assert host.device.queries == [{"pids": [4242]}]
    host.device.running.clear()
    now[0] += 0.2
    assert host.alive() is False
    assert host.device.queries == [{"pids": [4242]}, {"pids": [4242]}]
