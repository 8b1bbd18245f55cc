"""Every death names its signal or exit status, every time (not by luck): each case 10 times.

Before, a SIGSEGV was called "killed (no exit() seen)" in 2 of 3 runs, a SIGKILL's status was
read in 1 of 18, ``sh -c 'exit 3'`` was wrong 3 of 4 times, and a target killed during injection
was a "launch-storm at 0 calls/s".
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import read_records
from memtrace.capture_loop import CaptureLoop, CaptureOptions, run_capture
from memtrace.frida_host import FridaHost
from memtrace.target import TargetSpec
from memtrace.tracers import get as get_tracer
from memtrace.ui import SilentUI

from ..conftest import ROOT, run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

REPEAT = 10
AFTER = r"after \d+(\.\d+)? s"


def _capture(argv: list[str], out: Path, window: float = 20.0) -> tuple[str, str, dict]:
    r = run_capture("malloc", TargetSpec(device="local", argv=argv), CaptureOptions(tracer="malloc", window=window,
                                                                                    out=out), SilentUI())
    return r.ended, r.reason, r.evidence


@pytest.mark.slow
def test_a_segfault_is_named_with_its_faulting_stack(compile_c, tmp_path: Path) -> None:
    exe = str(compile_c("crasher"))
    for i in range(REPEAT):
        ended, reason, ev = _capture([exe, "0.2"], tmp_path / f"c{i}")
        assert ended == "target-exited"
        assert re.fullmatch(r"the target crashed with SIGSEGV \(write of 0x10\) in crash_here \(crasher\) <- "
                            r"crash_caller \(crasher\) <- main \(crasher\)( \(core dumped\))? " + AFTER, reason), reason
        assert ev["exit_status"]["signal_name"] == "SIGSEGV" and ev["exit_status"]["signal"] == signal.SIGSEGV
        crash = ev["crash"]
        assert (crash["signal"], crash["memory"]) == ("SIGSEGV", {"operation": "write", "address": "0x10"})
        assert [f["function"] for f in crash["frames"][:3]] == ["crash_here", "crash_caller", "main"]


@pytest.mark.slow
def test_a_sigkill_is_named(compile_c, tmp_path: Path) -> None:
    exe = str(compile_c("steady"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for i in range(REPEAT):
        out = tmp_path / f"c{i}"
        mt = subprocess.Popen([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--quiet",
                               "--window", "30", "--out", str(out), "--", exe],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert mt.stdout is not None
        line = mt.stdout.readline()
        assert line.startswith("ready "), line
        os.kill(int(line.split()[1]), signal.SIGKILL)
        mt.communicate(timeout=60)
        end = summarize(read_records(out)).end
        assert end["ended"] == "target-exited"
        assert re.fullmatch(r"the target was killed by SIGKILL " + AFTER, end["reason"]), end["reason"]
        assert end["evidence"]["exit_status"] == {"signal": 9, "signal_name": "SIGKILL", "core_dumped": False}


@pytest.mark.slow
def test_an_exit_status_is_named(tmp_path: Path) -> None:
    for i in range(REPEAT):
        ended, reason, ev = _capture(["sh", "-c", "exit 3"], tmp_path / f"c{i}")
        assert (ended, reason) == ("target-exited", "the target exited on its own (exit status 3)")
        assert ev["exit_status"] == {"exit_status": 3}


class KillDuringInjection(FridaHost):
    """The target dies between attach and the agent's start (a real SIGKILL, timed here)."""

    def load(self, agent: str) -> None:
        assert self.pid is not None
        os.kill(self.pid, signal.SIGKILL)
        super().load(agent)


@pytest.mark.slow
def test_a_kill_during_injection_is_named_as_such(compile_c, tmp_path: Path) -> None:
    exe = str(compile_c("steady"))
    tracer = get_tracer("malloc")
    assert tracer is not None
    for i in range(REPEAT):
        target = TargetSpec(device="local", argv=[exe])
        options = CaptureOptions(tracer="malloc", window=20, out=tmp_path / f"c{i}")
        r = CaptureLoop(KillDuringInjection(target, options.thresholds.rpc_timeout), tracer, target, options,
                        SilentUI()).run()
        assert r.ended == "target-exited", r.reason
        assert r.reason == ("the target was killed by SIGKILL during agent load, before the agent started "
                            "(not a launch storm: nothing ran under the hooks)")


@pytest.mark.slow
def test_the_report_names_each_death(compile_c, tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    _capture([str(compile_c("crasher")), "0.2"], folder / "crash")
    _capture(["sh", "-c", "exit 3"], folder / "exit3")
    run_memtrace("report", folder)
    text = (folder / "REPORT.md").read_text()
    assert "target-exited: the target crashed with SIGSEGV (write of 0x10) in crash_here (crasher)" in text
    assert "target-exited: the target exited on its own (exit status 3)" in text
