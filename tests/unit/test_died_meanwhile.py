"""CaptureLoop._died_meanwhile: which failed start is a death (the capture stays, the death named)
and which is a refusal, case by case, against real pids (a live one: this process; a gone one: a
child that exited and was reaped) and a record source that says what it knows."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from memtrace import tracers
from memtrace.capture_loop import CaptureLoop, CaptureOptions
from memtrace.exitwatch import local_pid_alive
from memtrace.target import TargetSpec


@dataclass
class Source:
    pid: int | None
    spawned: bool = False
    is_local: bool = True
    remote_alive: bool = True       # what a remote device says when asked

    def alive(self) -> bool:
        # As FridaHost: a local pid is read from /proc, a remote one asked of its device.
        return self.pid is not None and local_pid_alive(self.pid) if self.is_local else self.remote_alive


@pytest.fixture(scope="module")
def gone() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def died(source: Source, stage: str, target_pid: int | None = None, seen_at_start: bool = False) -> bool:
    target = TargetSpec(device="local", pid=target_pid, launch="none") if target_pid is not None else \
        TargetSpec(device="local", argv=["/bin/true"])
    loop = CaptureLoop(source, tracers.all_tracers()["malloc"], target, CaptureOptions(tracer="malloc"))  # type: ignore[arg-type]
    loop.stage = stage
    loop._pid_seen_at_start = seen_at_start
    return loop._died_meanwhile()


def test_a_launched_process_gone_at_any_stage_died(gone: int) -> None:
    assert died(Source(gone, spawned=True), "spawn")
    assert died(Source(gone, spawned=True), "window")


def test_an_attached_process_gone_during_injection_died(gone: int) -> None:
    assert died(Source(gone), "injection", target_pid=gone)
    assert died(Source(gone), "agent load", target_pid=gone)
    # Before injection, an attach that failed is a refusal (no such process, not permitted).
    assert not died(Source(gone), "attach", target_pid=gone)


def test_a_pid_seen_alive_at_the_start_that_the_launch_found_gone_died(gone: int) -> None:
    # The launch took no pid: the one --pid named is the one watched.
    assert died(Source(None), "spawn", target_pid=gone, seen_at_start=True)
    assert died(Source(gone), "spawn", target_pid=gone, seen_at_start=True)
    # Never seen alive: "no such process" is the user's error, not a death.
    assert not died(Source(None), "spawn", target_pid=gone, seen_at_start=False)
    # Seen on this machine, but the target is on another device: not the process seen.
    assert not died(Source(None, is_local=False), "spawn", target_pid=gone, seen_at_start=True)


def test_no_pid_no_death() -> None:
    assert not died(Source(None), "injection")


def test_a_living_process_did_not_die() -> None:
    assert not died(Source(os.getpid(), spawned=True), "injection")      # after the second a kill may take


def test_a_remote_process_is_asked_of_its_device() -> None:
    # os.getpid() is alive here, but the device is not this machine: its word counts.
    assert died(Source(os.getpid(), spawned=True, is_local=False, remote_alive=False), "injection")
    assert not died(Source(os.getpid(), spawned=True, is_local=False, remote_alive=True), "injection")
