"""A process whose main thread has called pthread_exit (a zombie while the others run) is stopped
cleanly: the zombie is no thread that "would not stop" (world.c mt_world_task_dead), so every patch
goes in and out with the world stopped, and the hooks' code is freed after a clear look."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from memtrace.capture import RecordType, read_records

from ..conftest import ROOT  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


@pytest.mark.timeout(180)
def test_a_process_whose_main_thread_exited_is_stopped_cleanly(compile_c: Callable[..., Path],
                                                                tmp_path: Path) -> None:
    """Launched by memtrace (Frida cannot attach to such a process: it reads /proc/PID/auxv, which a
    zombie leader no longer has), the main thread exits 20 ms in; the hooks come out at the window's
    end with it a zombie, the program left running."""
    exe = compile_c("zombie_main")
    out = tmp_path / "cap"
    res = subprocess.run([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--window", "2",
                          "--keep-running", "--json", "--out", str(out), "--", str(exe)],
                         capture_output=True, text=True, timeout=150,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    pid = int(doc["target"].removeprefix("pid")) if doc["target"].startswith("pid") else None
    try:
        assert doc["ended"] == "completed", doc["reason"]
        rows = [r for r in doc["top_stacks"] if r["frames"] and r["frames"][0].get("function") == "worker_alloc"]
        assert sum(r["count"] for r in rows) > 0, doc["top_stacks"]
        warnings = [r.body.get("message", "") for r in read_records(out / "capture.mtc")
                    if r.type == RecordType.WARNING]
        assert not [w for w in warnings if any(k in w for k in ("unloads regardless", "not patched", "world running"))], \
            warnings
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
