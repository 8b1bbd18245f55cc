"""Processes whose shape once made every world stop unclear -- every patch then made with the world
running, the hooks' code freed without a look -- are stopped cleanly (tests/programs/stop_shapes.c):
- one whose main thread has called pthread_exit (a zombie while the others run): the zombie is no
  thread that "would not stop" (world.c mt_world_task_dead);
- one with a SIGCHLD handler that reaps (waitpid(-1, WNOHANG) in a loop): the helper clone inherited
  it, and it took the stop reports the helper waited for (world.c mt_world_block_signals; the
  agent's start hung past its 20 s)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memtrace.capture import CaptureError, RecordType, read_records

from ..children import kill_and_reap  # noqa: TID252
from ..conftest import ROOT  # noqa: TID252
from .stop_evidence import unclean_stop_warnings

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


def _memtrace(*args: str | Path) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--json",
                          *map(str, args)], capture_output=True, text=True, timeout=150,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _assert_stopped_cleanly(doc: dict[str, Any], out: Path) -> None:
    """The window completed, the workers' allocations seen, and no patch made or code freed without
    a clear stop."""
    assert doc["ended"] == "completed", doc["reason"]
    rows = [r for r in doc["top_stacks"] if r["frames"] and r["frames"][0].get("function") == "shape_alloc"]
    assert sum(r["count"] for r in rows) > 0, doc["top_stacks"]
    assert unclean_stop_warnings(read_records(out / "capture.mtc")) == []


@pytest.mark.timeout(180)
def test_a_process_whose_main_thread_exited_is_stopped_cleanly(compile_c: Callable[..., Path],
                                                                tmp_path: Path) -> None:
    """Launched by memtrace (Frida cannot attach to such a process: it reads /proc/PID/auxv, which a
    zombie leader no longer has), the main thread exits 20 ms in; the hooks come out at the window's
    end with it a zombie, the program left running."""
    out = tmp_path / "cap"
    try:
        doc = _memtrace("--window", "2", "--keep-running", "--out", out, "--", compile_c("stop_shapes"), "zombie")
        assert isinstance(_kept_pid(out), int), "no END record with the program's pid"
        _assert_stopped_cleanly(doc, out)
    finally:
        pid = _kept_pid(out)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _kept_pid(out: Path) -> int | None:
    """The pid of the program a capture left running, from its END (the summary names the
    program, not its pid): the test's to kill -- its two threads spin, and one left behind ran for
    the rest of every suite run before round 27.  None when there is no such record."""
    with contextlib.suppress(OSError, CaptureError):
        for r in read_records(out / "capture.mtc"):
            if r.type == RecordType.END and isinstance(r.body.get("pid"), int) and r.body["pid"] > 0:
                return int(r.body["pid"])
    return None


@pytest.mark.timeout(180)
def test_a_process_that_reaps_on_sigchld_is_stopped_cleanly(compile_c: Callable[..., Path], tmp_path: Path) -> None:
    target = subprocess.Popen([str(compile_c("stop_shapes")), "reaper"], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline() == "ready\n"
        out = tmp_path / "cap"
        _assert_stopped_cleanly(_memtrace("--pid", target.pid, "--window", "1", "--out", out), out)
        assert target.poll() is None, f"the target died: {target.returncode}"
    finally:
        kill_and_reap(target)
