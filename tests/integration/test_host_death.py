"""memtrace dying (SIGKILL, here) must never take the target with it.

The target's threads keep exiting after the host is gone: each one runs the C library's
thread-specific-data destructors, ours among them (the malloc core's pthread key).  Before,
Frida unloaded our code when the host vanished and the next exiting thread jumped into unmapped
memory (13 of 13 targets segfaulted within 2 s).  host_victim checks every block it allocates
and writes "ok <threads> <checks>" only when all of it held.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memtrace.capture import CaptureInfo, RecordType, read_records

from ..conftest import ROOT, wait_streaming  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

KILLS = 10                  # memtrace SIGKILLed this many times: spawned and --pid targets alternating
AFTERLIFE_S = 2.0           # the target runs on this long without memtrace (it died within 2 s before)


def _memtrace(*args: str | Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--quiet",
                             "--window", "60", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _gone(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)


@pytest.mark.slow
def test_targets_outlive_a_sigkilled_memtrace(compile_c, tmp_path: Path) -> None:
    victim = compile_c("host_victim")
    survivors: list[int] = []
    failures: list[str] = []
    for i in range(KILLS):
        out, stop, result = tmp_path / f"c{i}", tmp_path / f"stop{i}", tmp_path / f"result{i}"
        if i % 2 == 0:
            # Spawned by memtrace (kept running, as --keep-running would).
            mt = _memtrace("--keep-running", "--out", out, "--", victim, stop, result)
            wait_streaming(out)
            assert mt.stdout is not None
            pid = int(mt.stdout.readline().split()[1])
            target = None
        else:
            # A process memtrace did not launch (--pid).
            target = subprocess.Popen([str(victim), str(stop), str(result)], stdout=subprocess.PIPE, text=True)
            assert target.stdout is not None and target.stdout.readline().startswith("ready ")
            pid = target.pid
            mt = _memtrace("--pid", str(pid), "--out", out)
            wait_streaming(out)
        time.sleep(0.3)           # threads run and exit under the hooks
        assert not _gone(pid, 0), f"run {i}: the target ended before memtrace was killed"
        mt.send_signal(signal.SIGKILL)
        mt.communicate(timeout=30)
        time.sleep(AFTERLIFE_S)   # threads keep exiting with the agent torn down
        stop.touch()
        survived = target.wait(timeout=30) == 0 if target is not None else _gone(pid, 30)
        text = result.read_text() if result.exists() else ""
        if survived and text.startswith("ok ") and int(text.split()[1]) > 50:
            survivors.append(i)
        else:
            failures.append(f"run {i} ({'spawned' if target is None else '--pid'}): {text or 'no result (died)'}")
        # The capture holds everything flushed before memtrace died: readable, no END.
        records = list(read_records(out, CaptureInfo(out)))
        assert records[0].type == RecordType.META and not any(r.type == RecordType.END for r in records)
    assert survivors == list(range(KILLS)), f"{len(survivors)}/{KILLS} targets survived: {failures}"


BROKEN_UI = """
import sys
from pathlib import Path
from memtrace.capture_loop import CaptureOptions, run_capture
from memtrace.target import TargetSpec
from memtrace.ui import SilentUI

class BrokenUI(SilentUI):
    def progress(self, p):
        # (Once two drains are in: on a loaded machine the loop's first tick can come after 0.5 s,
        # before any batch -- and the capture then has no calls to keep.)
        if p.elapsed > 0.5 and p.batches >= 2:
            raise RuntimeError("a bug in memtrace")

run_capture("malloc", TargetSpec(device="local", pid=int(sys.argv[1])),
            CaptureOptions(tracer="malloc", window=60, out=Path(sys.argv[2])), BrokenUI())
"""


@pytest.mark.slow
def test_targets_outlive_memtrace_dying_of_an_exception(compile_c, tmp_path: Path) -> None:
    victim = compile_c("host_victim")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for i in range(3):
        stop, result = tmp_path / f"stop{i}", tmp_path / f"result{i}"
        target = subprocess.Popen([str(victim), str(stop), str(result)], stdout=subprocess.PIPE, text=True)
        assert target.stdout is not None and target.stdout.readline().startswith("ready ")
        # -X faulthandler: a crash at memtrace's exit says in which threads it happened.
        mt = subprocess.run([sys.executable, "-X", "faulthandler", "-c", BROKEN_UI, str(target.pid),
                             str(tmp_path / f"c{i}")], capture_output=True, text=True, env=env, timeout=120)
        assert mt.returncode == 1 and "RuntimeError: a bug in memtrace" in mt.stderr, \
            f"run {i}: memtrace exited {mt.returncode}:\n{mt.stderr[-4000:]}"
        # The capture ends with memtrace's failure named, and everything before it kept.
        capture = tmp_path / f"c{i}"
        records = list(read_records(capture, CaptureInfo(capture)))
        end = records[-1]
        assert end.type == RecordType.END and end.body["ended"] == "memtrace-failed", end
        assert "RuntimeError: a bug in memtrace" in end.body["reason"] and end.body["evidence"]["calls"] > 0
        assert any(r.type == RecordType.BATCH for r in records)
        time.sleep(AFTERLIFE_S)
        stop.touch()
        assert target.wait(timeout=30) == 0, f"run {i}: the target died with memtrace"
        assert result.read_text().startswith("ok ")
