"""Under a seccomp filter that traps a clone making no thread (issue 27 item 3), the ptrace helper
(cmodule/world.c: a clone(CLONE_VM)) is never made: the target is not killed by SIGSYS.  The hooks
go in and come out, and the leak scan reads the threads' registers and stacks, with the world
stopped by a signal instead (world.c's signal stop: tgkill and a handler that waits on a futex;
before, the hooks went in with the world running -- 1 sandboxed run in 10 crashed in malloc --
and the leak scan ran with the world moving)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ..children import exit_of, kill_and_reap  # noqa: TID252
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
        assert "with the world running" not in out, out          # neither the leak scan nor a patch
        assert re.search(r"leak scan: .*complete; 5 threads stopped; world stopped \d+ ms", out), out
        assert "ended: completed" in out, out
    finally:
        target.kill()
        target.wait()


def test_a_seccomp_sandboxs_hooks_go_in_and_out_with_its_threads_stopped_by_a_signal(
        compile_c: Callable[..., Path]) -> None:
    """The agent's own account: every patch of the start and of the stop was made with the world
    stopped -- by the signal stop, none with it running -- while four threads called malloc, and
    the target lives on with the signal's disposition as it was (no handler left)."""
    import frida

    from memtrace import tracers
    from memtrace.agentbuild import build_agent

    exe = compile_c("seccomp_clone")
    target = subprocess.Popen([str(exe), "4"], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        agent = build_agent("malloc")
        session = frida.get_local_device().attach(target.pid)
        try:
            script = session.create_script(agent.source)
            script.load()
            api = script.exports_sync
            api.init(tracers.all_tracers()["malloc"].agent_config(None, {}), agent.c_sources, agent.process_sources)
            api.start()
            started = api.world()
            time.sleep(0.5)
            stopped = api.stop()
            script.unload()
        finally:
            session.detach()
        time.sleep(0.3)
        died = exit_of(target)      # (this process is Frida's tracer: no poll(), see exit_of)
        assert died is None, f"the target died: {died}"
        sig = int(started["stop_by"].split()[1])
        with open(f"/proc/{target.pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
        assert not caught & (1 << (sig - 1)), "the signal stop's handler was left installed"
    finally:
        kill_and_reap(target)
    assert started["stop_by"].startswith("signal ") and "seccomp" in started["stop_by"], started
    assert started["why"] is None and started["running"] == 0 and started["failed"] == 0, started
    assert started["stopped"] == started["applied"] >= 1 and started["refused"] == [], started
    world = stopped["world"]
    assert world["stopped"] == world["applied"] > started["applied"] and world["running"] == 0, world
