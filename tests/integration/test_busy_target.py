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
from memtrace.capture import RecordType, read_records

from ..conftest import ROOT  # noqa: TID252
from .stop_evidence import unclean_stop_warnings

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


def broken_compilers(folder: Path) -> dict[str, str]:
    """gcc and cc that fail, first on PATH: Frida's CModule falls back to its TinyCC, as on a machine
    without gcc (the environment of the target, which compiles the core, and of memtrace)."""
    folder.mkdir()
    for name in ("gcc", "cc"):
        (folder / name).write_text("#!/bin/sh\necho 'broken for the test' >&2\nexit 1\n")
        (folder / name).chmod(0o755)
    return {"MEMTRACE_CACHE_DIR": str(folder / "cache"), "PATH": f"{folder}:{os.environ.get('PATH', '')}"}


@pytest.fixture(params=["gcc"])
def spinning(compile_c: Callable[..., Path], tmp_path: Path,
             request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str]]:
    """64 threads spinning on the CPU; each has its own nice value (0..7), not all the same, so a
    restore that writes one value to all would show.  Parametrized indirectly with the compiler
    ("tinycc": broken_compilers in the target's environment)."""
    exe = compile_c("busy_threads")
    env = {**os.environ, **(broken_compilers(tmp_path / "broken") if request.param == "tinycc" else {})}
    target = subprocess.Popen([str(exe), str(SPINNERS), "spin"], stdout=subprocess.PIPE, text=True, env=env)
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
    assert counts["lowered"] == len(before) and counts["restored"] == len(before) and counts["raised"] == 0
    assert nice_values(pid) == before
    assert boost.restore() == {}        # idempotent


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("spinning", ["gcc", "tinycc"], indirect=True)
def test_memtrace_attaches_to_64_spinning_threads_and_leaves_them_as_they_were(
        spinning: subprocess.Popen[str], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """tinycc: the C core built by Frida's TinyCC (broken_compilers), as on a machine without gcc:
    its code calls the real malloc through r11, a register a spinning thread then keeps -- it held
    every quiesce to its end before round 26."""
    compiler = request.node.callspec.params["spinning"]
    pid = spinning.pid
    before = nice_values(pid)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    if compiler == "tinycc":
        env.update(broken_compilers(tmp_path / "broken-host"))
    res = subprocess.run([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--pid", str(pid),
                          "--window", "1", "--rpc-timeout", "300", "--json", "--out", str(tmp_path / "cap")],
                         capture_output=True, text=True, env=env, timeout=560)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["ended"] == "completed", doc["reason"]
    # The spinners' own allocations were seen, with their function on the stack.
    rows = [r for r in doc["top_stacks"] if r["frames"] and r["frames"][0].get("function") == "spin_alloc"]
    assert sum(r["count"] for r in rows) > 0
    # Every thread stopped and looked at until none was inside memtrace's code: the hooks came out
    # with nothing "unloaded regardless" (a stop that waited for each spinning thread in turn left
    # the 3 s quiesce room for a few looks; a register left at a trampoline's start held it to its end).
    records = read_records(tmp_path / "cap" / "capture.mtc")
    info = next(r.body for r in records if r.type == RecordType.RECON)["info"]
    assert (info["toolchain"] == "internal") == (compiler == "tinycc"), info
    # ... and the agent's own account, kept with the capture: every look of the quiesce ended clear.
    world = next(r.body for r in records if r.type == RecordType.CALIBRATION and r.body.get("phase") == "after")["world"]
    assert world["quiesced"] >= 1 and world["not_quiesced"] == 0 and world["refused"] == [], world
    assert unclean_stop_warnings(records) == []
    time.sleep(0.3)
    # memtrace's own account (its warnings, the uninstall's waits) is the evidence of a death here.
    assert spinning.poll() is None, f"the target died: {spinning.returncode}\n{res.stderr[-4000:]}"
    after = nice_values(pid)
    assert {tid: after[tid] for tid in before} == before


ONE_SHOT = """
import json, sys
import frida
from memtrace import priority
from memtrace.frida_host import load_agent
made = []
real = priority.boost_injection
def recording(pid, held=False):
    made.append(real(pid, held))
    return made[-1]
priority.boost_injection = recording
session, script = load_agent(frida.get_local_device(), int(sys.argv[1]), "census")
# Frida's threads (the agent's) stay raised until they are gone: its teardown must not starve.
kept = [tid for tid in made[0].raised if priority._nice(tid) == priority.RAISED]
script.unload()
session.detach()
print(json.dumps({"boosts": len(made), "lowered": bool(made and made[0] is not None and made[0].lower),
                  "restored": all(b is not None and b.restored for b in made), "frida_kept": len(kept) > 0}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_one_shot_agent_attaches_under_the_same_guard(spinning: subprocess.Popen[str]) -> None:
    """census, limit and doctor's device checks load their agent through load_agent, not FridaHost:
    it gets the same guard against a starved injection (a CI run's device check failed "timed out
    trying to sync up with agent" on a loaded machine), and every thread's priority back after."""
    pid = spinning.pid
    before = nice_values(pid)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, "-c", ONE_SHOT, str(pid)], capture_output=True, text=True, env=env,
                         timeout=240)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"boosts": 1, "lowered": True, "restored": True, "frida_kept": True}
    time.sleep(0.3)
    assert spinning.poll() is None, f"the target died: {spinning.returncode}"
    after = nice_values(pid)
    assert {tid: after[tid] for tid in before} == before


@pytest.mark.timeout(60)
def test_a_thread_made_by_a_raised_thread_gets_the_programs_value_back(compile_c: Callable[..., Path]) -> None:
    """A thread the program makes in the boost's window is raised like Frida's; one it makes in turn
    is born at -20 by inheritance: neither is left at -20 once the boost gives the program's threads
    back (a value at birth of -20 no program thread had is the program's usual value)."""
    target = subprocess.Popen([str(compile_c("thread_chain"))], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        os.setpriority(os.PRIO_PROCESS, target.pid, 3)
        boost = priority.boost_injection(target.pid)
        if boost is None:
            pytest.skip("memtrace may not set nice values both ways here (CAP_SYS_NICE)")
        try:
            target.send_signal(signal.SIGUSR2)
            assert target.stdout.readline().strip() == "chained"
            during = nice_values(target.pid)
            assert len(during) == 3 and sorted(during.values()) == [-20, -20, 3], during
        finally:
            counts = boost.restore(set())
            boost.end()
        assert counts["raised"] == 0
        assert nice_values(target.pid) == dict.fromkeys(during, 3)
    finally:
        target.kill()
        target.wait()


def _spinning_target(exe: Path, threads: int, mode: str = "spin") -> subprocess.Popen[str]:
    target = subprocess.Popen([str(exe), str(threads), mode], stdout=subprocess.PIPE, text=True)
    assert target.stdout is not None and target.stdout.readline().strip() == "ready"
    return target


@pytest.mark.timeout(60)
def test_a_killed_memtrace_leaves_no_thread_lowered(compile_c: Callable[..., Path]) -> None:
    """memtrace SIGKILLed while the program's threads are at 19: the guard process gives each its
    old value back (a target left deprioritised for good would be harmed)."""
    target = _spinning_target(compile_c("busy_threads"), 8)
    try:
        for i, tid in enumerate(sorted(nice_values(target.pid))):
            os.setpriority(os.PRIO_PROCESS, tid, 1 + i % 5)
        target.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not priority.busy(target.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        before = nice_values(target.pid)
        code = ("import os, sys; from memtrace import priority; b = priority.boost_injection(int(sys.argv[1])); "
                "print(b is not None and b.lower, sorted(set(b.original)), flush=True); os.kill(os.getpid(), 9)")
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        res = subprocess.run([sys.executable, "-c", code, str(target.pid)], capture_output=True, text=True,
                             env=env, timeout=30)
        assert res.returncode == -signal.SIGKILL
        assert res.stdout.split(" ", 1)[0] == "True", res.stdout + res.stderr      # it did lower them
        assert json.loads(res.stdout.split(" ", 1)[1]) == sorted(before)
        deadline = time.monotonic() + 10
        while nice_values(target.pid) != before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert nice_values(target.pid) == before
    finally:
        target.kill()
        target.wait(timeout=30)


def test_starvation_is_told_from_a_frozen_or_hung_target(compile_c: Callable[..., Path]) -> None:
    """A target whose threads outnumber the CPUs, runnable, is starving memtrace's threads; one
    whose threads are stopped (SIGSTOP: anti-debug, a debugger) or all asleep is not."""
    exe = compile_c("busy_threads")
    threads = 2 * priority.cpus_of(os.getpid()) + 4
    asleep = subprocess.Popen(["sleep", "60"])
    target = _spinning_target(exe, threads)
    try:
        deadline = time.monotonic() + 10
        while priority.thread_states(asleep.pid) != {"S": 1} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert priority.starvation(asleep.pid) is None      # hung or idle, whatever the machine's load
        target.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not priority.busy(target.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        starved = priority.starvation(target.pid)
        assert starved is not None
        assert starved["target_threads"] == threads + 1
        assert starved["target_runnable_threads"] > starved["target_cpus"]  # type: ignore[operator]
        target.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while set(priority.thread_states(target.pid)) - {"T", "t"} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert priority.starvation(target.pid) is None
    finally:
        asleep.kill()
        asleep.wait(timeout=30)
        target.kill()
        target.wait(timeout=30)


@pytest.mark.timeout(240)
def test_frida_threads_stay_favoured_and_the_program_keeps_its_nice(
        compile_c: Callable[..., Path], tmp_path: Path) -> None:
    """Any local attach (the target not busy): the threads Frida starts in the target run at -20
    for the session (the agent's JavaScript thread is not starved by the machine), the program's
    own keep their values exactly."""
    target = _spinning_target(compile_c("busy_threads"), 4, "churn")      # 2,000 mallocs a second
    try:
        for i, tid in enumerate(sorted(nice_values(target.pid))):
            os.setpriority(os.PRIO_PROCESS, tid, 2 + i % 4)
        before = nice_values(target.pid)
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        run = subprocess.Popen([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--pid",
                                str(target.pid), "--window", "2", "--json", "--out", str(tmp_path / "cap")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        new: dict[int, set[int]] = {}       # threads born during the session: every nice seen
        deadline = time.monotonic() + 200
        while run.poll() is None and time.monotonic() < deadline:
            for tid, nice in nice_values(target.pid).items():
                if tid not in before:
                    new.setdefault(tid, set()).add(nice)
            time.sleep(0.02)
        out, err = run.communicate(timeout=30)
        assert run.returncode == 0, err
        assert json.loads(out)["ended"] == "completed"
        assert any(priority.RAISED in seen for seen in new.values()), new
        after = nice_values(target.pid)
        assert {tid: after[tid] for tid in before} == before
        assert target.poll() is None
    finally:
        target.kill()
        target.wait(timeout=30)
