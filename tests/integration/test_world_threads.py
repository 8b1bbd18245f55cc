"""Stopping the world holds every thread, however many (issue 27 item 3): past 1024 threads the
leak scan used to leave the rest running (83 of 1107) and say 0.  cmodule/world.c lists the
threads 4 KB of directory entries at a time and attaches as it goes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ..conftest import ROOT  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

THREADS = 1100


@pytest.mark.slow
def test_every_one_of_1100_threads_is_stopped(compile_c: Callable[..., Path], tmp_path: Path) -> None:
    exe = compile_c("sleeping_threads")
    target = subprocess.Popen([str(exe), str(THREADS)], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        res = subprocess.run([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--pid",
                              str(target.pid), "--leaks", "--window", "1", "--rpc-timeout", "200", "--json",
                              "--out", str(tmp_path / "cap")], capture_output=True, text=True, env=env, timeout=900)
        assert res.returncode == 0, res.stderr
        scan = json.loads(res.stdout)["leaks"]["scan"]
        assert scan["world_stopped"] is True
        # The main thread and every sleeper (the scanning thread and Frida's own are not stopped).
        assert scan["threads_stopped"] == THREADS + 1, scan
        assert scan["threads_not_stopped"] == 0, scan
        assert target.poll() is None, f"the target died: {target.returncode}"
    finally:
        target.kill()
        target.wait()
