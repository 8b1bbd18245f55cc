"""Hooks go in and out with the world stopped, and a storm of cycles kills no target (issue 19).

Two kinds of proof, both against tests/stress/hook_storm.c, whose threads call the hooked
functions in a tight loop:
  - the agent's own account (the `world` rpc: cmodule/world.c and agents/runtime/world.js): every
    patch was applied with the world stopped, none with it running, and the malloc tracer found
    no thread left in its code before unloading;
  - the storm itself (tests/stress/hook_storm.py, shortened): attach/detach cycles in every mode
    through the real CLI, counting the targets that died.  MEMTRACE_HOOK_STORM_CYCLES cycles per
    mode (default 12: 108 cycles over the 9 modes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memtrace import tracers
from memtrace.agentbuild import build_agent

from ..conftest import ROOT  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

frida = pytest.importorskip("frida")
STRESS = ROOT / "tests" / "stress"
CYCLES = int(os.environ.get("MEMTRACE_HOOK_STORM_CYCLES", "12"))


@pytest.fixture(scope="module")
def storm_exe(build_dir: Path) -> Path:
    exe = build_dir / "hook_storm"
    subprocess.run(["gcc", "-O2", "-g", "-pthread", "-o", str(exe), str(STRESS / "hook_storm.c"), "-ldl"],
                   check=True)
    return exe


def _start(exe: Path, kind: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([str(exe), kind, "4"], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


# threads: Frida's thread observer runs JavaScript on every thread the storm creates, and each such
# thread holds a level of Interceptor's process-wide transaction while it waits for the script's
# lock, so the flush under the stop may write nothing (docs/domain/frida.md): an open defect.
@pytest.mark.parametrize("tracer", ["malloc", "fds", pytest.param("threads", marks=pytest.mark.xfail(
    reason="threads entering JavaScript hold Interceptor's transaction open: the patch lands later"))])
def test_every_patch_is_applied_with_the_world_stopped(storm_exe: Path, tracer: str) -> None:
    target = _start(storm_exe, tracer)
    agent = build_agent(tracer)
    session = frida.get_local_device().attach(target.pid)
    try:
        script = session.create_script(agent.source)
        script.load()
        api = script.exports_sync
        api.init(tracers.all_tracers()[tracer].agent_config(None, {}), agent.c_sources, agent.process_sources)
        api.start()
        time.sleep(0.5)
        world = api.stop()["world"]
        script.unload()
    finally:
        session.detach()
    time.sleep(0.3)
    alive = target.poll() is None
    target.kill()
    target.wait()
    assert alive, f"the target died: {target.returncode}"
    assert world["why"] is None, world
    # In: the tracer's hooks and the execve hook; out: the tracer's hooks and the execve hook.
    assert world["applied"] >= 4 and world["stopped"] == world["applied"], world
    assert world["running"] == 0 and world["failed"] == 0, world
    assert world["sites"] >= 2 and world["frida_code_ranges"] >= 1, world
    # The proof that the bytes changed under the stop: every hooked site rewritten while the
    # world was stopped (the execve hook may share its site with the fds tracer's listener).
    assert world["log"][0][0] == f"{tracer} hooks in", world
    # (A site already redirected is not rewritten again: the execve hook and the descriptor guard's
    # close, close_range and closefrom may share theirs with the fds tracer's listeners.)
    rewritten_in = sum(n for what, n in world["log"] if what.endswith(" in"))
    assert rewritten_in >= world["sites"] - (4 if tracer == "fds" else 1), world
    if tracer == "malloc":
        # ... and every one restored under it too.
        assert world["rewritten_stopped"] == 2 * world["sites"], world
        assert world["quiesced"] == 1 and world["not_quiesced"] == 0, world


# The JavaScript listeners of fds, threads, iosurface and purgeable still come out with the world
# running (Frida's Interceptor transaction stays open while a thread waits in a listener for the
# script's lock; see docs/domain/frida.md): a cycle of theirs can still kill the target.
LISTENER_GAP = pytest.mark.xfail(reason="JavaScript listeners come out with the world running (issue 19)",
                                 strict=False)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pid", "spawn", "leaks", "sample-bytes", "events",
                                  *(pytest.param(m, marks=LISTENER_GAP)
                                    for m in ("fds", "threads", "iosurface", "purgeable"))])
def test_a_storm_of_cycles_kills_no_target(mode: str, tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, str(STRESS / "hook_storm.py"), "--mode", mode, "--cycles", str(CYCLES),
                          "--log", str(log)], capture_output=True, text=True, env=env, timeout=CYCLES * 400)
    lines = res.stdout.strip().splitlines()
    assert lines[0] == "mode cycles deaths failures seconds", res.stdout + res.stderr
    name, cycles, deaths, _failures, _seconds = lines[1].split()
    assert (name, int(cycles)) == (mode, CYCLES)
    assert int(deaths) == 0, log.read_text()
    assert res.returncode == 0, res.stderr
