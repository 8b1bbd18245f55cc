"""The target killed while the leak scan holds it stopped: memtrace ends promptly with the death
named, and leaves no helper behind (issue 27: before, memtrace hung 150 s and more with an orphan
helper holding 2.1 GB).  The helper is a clone(CLONE_VM) of the target with PR_SET_PDEATHSIG: it
dies with the target."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memtrace.capture import RecordType, read_records

from ..conftest import ROOT  # noqa: TID252

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux"),
              pytest.mark.slow]


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_target_killed_during_the_scan_ends_the_capture_and_leaves_no_helper(tmp_path: Path) -> None:
    exe = tmp_path / "leak_heap"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(ROOT / "bench" / "leak_heap.c")], check=True)
    # 400,000 blocks in 400 MB: a scan of seconds, long enough to be killed in.
    target = subprocess.Popen([str(exe), "400000", str(400 << 20), "600"], stdout=subprocess.PIPE, text=True)
    assert target.stdout is not None and target.stdout.readline().strip() == "ready"
    out = tmp_path / "cap"
    mt = subprocess.Popen([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--pid",
                           str(target.pid), "--leaks", "--window", "1", "--out", str(out), "--quiet"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        # The scan starts at the window's end (the hooks went in before the "before" calibration,
        # with a helper of their own): then wait for the scan's helper, a child of the target.
        deadline = time.monotonic() + 120
        cap = out / "capture.mtc"
        while time.monotonic() < deadline and not (
                cap.exists() and any(r.type == RecordType.CALIBRATION for r in read_records(cap))):
            time.sleep(0.05)
        time.sleep(1.2)
        helpers: list[int] = []
        while time.monotonic() < deadline and not helpers:
            helpers = _children_of(target.pid)
            time.sleep(0.01)
        assert helpers, "the scan's helper never appeared"
        target.send_signal(signal.SIGKILL)
        target.wait()
        t0 = time.monotonic()
        mt.wait(timeout=90)
        took = time.monotonic() - t0
    finally:
        if mt.poll() is None:
            mt.kill()
        if target.poll() is None:
            target.kill()
    time.sleep(0.5)
    assert not any(_running(h) for h in helpers), "the helper outlived the target"
    end = [r.body for r in read_records(out / "capture.mtc") if r.type == RecordType.END]
    assert end and end[-1]["ended"] == "target-exited", end
    print(f"memtrace ended {took:.1f} s after the target was killed")
