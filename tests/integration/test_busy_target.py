"""A target whose threads keep both CPUs busy survives Frida's injection (issue 27): Frida's Linux
injector gives its agent 5 s to sync and, when the loader thread starves past that, unmaps the
loader under it (SIGSEGV; 64 spinning threads killed it 2 of 2).  memtrace.priority lowers the
program's threads while Frida injects and gives them their nice values back exactly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memtrace import priority

from ..conftest import ROOT  # noqa: TID252

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux"),
    pytest.mark.skipif(not priority.can_renice(), reason="needs CAP_SYS_NICE to give nice values back"),
]

SPINNERS = 64


def nice_values(pid: int) -> dict[int, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):     # a thread gone meanwhile
            out[int(tid)] = os.getpriority(os.PRIO_PROCESS, int(tid))
    return out


@pytest.fixture
def spinning(compile_c: Callable[..., Path]) -> Iterator[subprocess.Popen[str]]:
    """64 threads spinning on the CPU; each has its own nice value (0..7), not all the same, so a
    restore that writes one value to all would show."""
    exe = compile_c("busy_threads")
    target = subprocess.Popen([str(exe), str(SPINNERS), "spin"], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        for i, tid in enumerate(sorted(nice_values(target.pid))):
            os.setpriority(os.PRIO_PROCESS, tid, i % 8)
        target.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not priority.busy(target.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert priority.busy(target.pid), "the threads never spun"
        yield target
    finally:
        target.kill()
        target.wait(timeout=30)


@pytest.mark.slow       # 64 spinning threads on 2 CPUs slow everything else down
@pytest.mark.timeout(180)
def test_the_program_threads_get_their_exact_nice_back(spinning: subprocess.Popen[str]) -> None:
    """No Frida: the boost lowers every thread to 19, raises a thread born meanwhile to -20 (as it
    does Frida's), and restore() puts every one of the program's threads back as it was."""
    pid = spinning.pid
    before = nice_values(pid)
    boost = priority.boost_injection(pid)
    assert boost is not None
    try:
        assert set(nice_values(pid).values()) == {priority.LOWERED}
        assert set(boost.original) == set(before)
    finally:
        counts = boost.restore()
    assert counts == {"lowered": len(before), "restored": len(before), "raised": 0}
    assert nice_values(pid) == before
    assert boost.restore() == {}        # idempotent


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_memtrace_attaches_to_64_spinning_threads_and_leaves_them_as_they_were(
        spinning: subprocess.Popen[str], tmp_path: Path) -> None:
    pid = spinning.pid
    before = nice_values(pid)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--pid", str(pid),
                          "--window", "1", "--rpc-timeout", "300", "--json", "--out", str(tmp_path / "cap")],
                         capture_output=True, text=True, env=env, timeout=560)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["ended"] == "completed", doc["reason"]
    # The spinners' own allocations were seen, with their function on the stack.
    rows = [r for r in doc["top_stacks"] if r["frames"] and r["frames"][0].get("function") == "spin_alloc"]
    assert sum(r["count"] for r in rows) > 0
    time.sleep(0.3)
    assert spinning.poll() is None, f"the target died: {spinning.returncode}"
    after = nice_values(pid)
    assert {tid: after[tid] for tid in before} == before
