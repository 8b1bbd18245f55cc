"""Under a seccomp filter that traps a clone making no thread (issue 27 item 3), stopping the world
(cmodule/world.c: a clone(CLONE_VM) ptrace helper) is refused with one line, never tried: the
target is not killed by SIGSYS, the leak scan runs with the world moving and says so, and the
hooks go in with the world running, said once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ..conftest import ROOT  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


def test_a_seccomp_sandbox_is_never_killed_by_the_stop(compile_c: Callable[..., Path], tmp_path: Path) -> None:
    exe = compile_c("seccomp_clone")
    target = subprocess.Popen([str(exe), "4"], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "300"}
        res = subprocess.run([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--pid",
                              str(target.pid), "--leaks", "--window", "2", "--rpc-timeout", "120",
                              "--out", str(tmp_path / "cap")],
                             capture_output=True, text=True, env=env, timeout=600)
        time.sleep(0.3)
        assert target.poll() is None, f"the target died: {target.returncode}"
        assert res.returncode == 0, res.stderr
        out = res.stdout + res.stderr
        why = "a seccomp filter is installed (a non-thread clone could kill the process)"
        assert out.count(f"leak scan with the world running: {why}") == 1, out
        assert out.count(f"hooks patched with the world running: {why}") == 1, out
        assert "ended: completed" in out, out
    finally:
        target.kill()
        target.wait()
