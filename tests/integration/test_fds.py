"""``memtrace fds`` on a program with a known pattern of descriptor creations and releases."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import frame_names, memtrace_json, run_memtrace

from memtrace.analyze.fds import summarize
from memtrace.capture import RecordType, read_records
from memtrace.report import build_report

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

# fd_leaker's descriptor count, step by step after the baseline (see tests/programs/fd_leaker.c).
STEPS = ([+1] * 30 + [-1] * 10 + [+2, -1, -1] * 5 + [+2] * 3 + [-1, -1] + [+1, +1]
         + [+1] * 10 + [-1] * 6 + [+1, -1] * 3)


def _run(compile_c: Callable[..., Path], tmp_path: Path, *opts: str) -> dict:
    work = tmp_path / "files"
    work.mkdir()
    return memtrace_json("fds", "--device", "local", "--window", "30", *opts, "--out", tmp_path / "c", "--",
                         compile_c("fd_leaker"), work)


@pytest.mark.smoke
def test_every_descriptor_with_its_stack(compile_c: Callable[..., Path], tmp_path: Path) -> None:
    s = _run(compile_c, tmp_path)
    work = tmp_path / "files"
    assert s["ended"] == "target-exited"
    assert s["missing"] == []
    assert s["calls"] == {"dup": 2, "dup2": 1, "open": 40, "opendir": 3, "pipe": 3, "socketpair": 5}
    assert s["opened"] == 40 + 3 + 2 + 1 + 6 + 10
    assert s["closed"] == {"close": 22, "closedir": 3, "fclose": 6}
    assert s["closes_of_unknown_fds"] == 0
    assert s["replaced"] == 1                        # dup2 onto cfg-11
    assert s["failed"] == {"open": {"ENOENT": 7}}
    assert [(r["caller"], r["count"]) for r in s["failures_by_stack"]] == [("open_missing", 7)]

    at_end = s["open_at_end"]
    assert at_end["count"] == 30
    by_caller: dict[str, int] = {}
    for r in at_end["by_stack"]:
        by_caller[r["caller"]] = by_caller.get(r["caller"], 0) + r["count"]
    assert by_caller == {"open_config_files": 19, "write_with_stdio": 4, "make_pipes": 4, "dup_log": 3}
    cfg = next(r for r in at_end["by_stack"] if r["caller"] == "open_config_files")
    assert frame_names(cfg["frames"])[:2] == ["open_config_files (fd_leaker)", "main (fd_leaker)"]
    # cfg-00..09 were closed and cfg-11 was replaced by dup2: the other 19 are still open.
    assert cfg["paths"] == sorted(str(work / f"cfg-{i:02d}") for i in range(10, 30) if i != 11)[:10]
    # fopen reaches open inside the C library; the stack still names the program's function.
    stdio = next(r for r in at_end["by_stack"] if r["caller"] == "write_with_stdio")
    assert stdio["paths"] == [str(work / f"data-{i}") for i in range(6, 10)]
    assert "write_with_stdio (fd_leaker)" in frame_names(stdio["frames"])
    assert at_end["by_kind"] == {"file": 23, "pipe": 4, "dup": 2, "dup2": 1}
    # The console says the same in words, not as a Python dict.
    text = " ".join(run_memtrace("show", tmp_path / "c").stdout.split())
    assert "opened in the window and still open: 30 (file 23, pipe 4, dup 2, dup2 1)" in text

    baseline = s["baseline"]["count"]
    assert s["baseline"]["closed_in_window"] == 0
    assert s["peak"]["count"] == baseline + 36
    start, end = s["censuses"][0], s["censuses"][-1]
    assert (start["trigger"], start["count"], end["trigger"]) == ("start", baseline, "end")
    # The end census is taken at exit, before the kernel closes anything: baseline + 30 + the
    # one descriptor no hook could see (a raw openat syscall), which the reconciliation names.
    assert end["count"] == baseline + 31
    rec = s["reconciliation"]
    assert rec["opened_out_of_sight"] == [{"fd": rec["opened_out_of_sight"][0]["fd"],
                                           "path": str(work / "raw-secret"), "kind": "file"}]
    assert rec["closed_out_of_sight"] == []

    # The same capture in `memtrace report`: its own chapter, numbers as above.
    build_report(tmp_path / "c", out=tmp_path / "r")
    md = (tmp_path / "r" / "REPORT.md").read_text()
    assert "## File descriptors" in md
    assert (f"| fd_leaker | capture.mtc | 62 | 31 | {baseline} | {baseline + 36} | 30 | 1 | open ENOENT ×7 |"
            in md)
    assert "| 19 | open ×19 | open_config_files |" in md


def test_threshold_censuses(compile_c: Callable[..., Path], tmp_path: Path) -> None:
    s = _run(compile_c, tmp_path, "--census-at", "30", "--census-step", "5")
    baseline = s["baseline"]["count"]
    # The agent's rule: a census once more than 30 are open, then each time 5 more are open
    # than at the last one -- replayed here over the program's known sequence.
    expected, count, last = [], baseline, None
    for step in STEPS:
        count += step
        if step > 0 and count > 30 and (last is None or count >= last + 5):
            expected.append(count)
            last = count
    cap = tmp_path / "c" / "capture.mtc"
    censuses = [ev for rec in read_records(cap) if rec.type == RecordType.EVENTS
                for ev in rec.body["events"] if ev["type"] == "census" and ev["trigger"] == "threshold"]
    assert [c["tracked"] for c in censuses] == expected and expected
    # Every census lists exactly the descriptors open at that moment.
    assert [c["count"] for c in censuses] == expected
    assert [c["trigger"] for c in s["censuses"]] == ["start", *["threshold"] * len(expected), "end"]
    # The capture reads back to the same summary offline.
    again = summarize(read_records(cap)).to_json(capture=str(cap))
    assert again["open_at_end"]["count"] == 30 and again["censuses"] == s["censuses"]


def test_bad_census_option(tmp_path: Path) -> None:
    from tests.conftest import run_memtrace
    proc = run_memtrace("fds", "--device", "local", "--census-step", "0", "--", "/bin/true", check=False)
    assert proc.returncode == 2
    assert "--census-step" in proc.stderr and "Traceback" not in proc.stderr


def test_baseline_is_the_targets_own_descriptors_not_fridas(tmp_path: Path) -> None:
    """A process with exactly stdin, stdout and stderr open: that is its baseline, whatever Frida adds."""
    import subprocess

    from tests.conftest import run_memtrace

    proc = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, close_fds=True)
    try:
        import os
        import time

        time.sleep(0.2)
        before = sorted(int(fd) for fd in os.listdir(f"/proc/{proc.pid}/fd"))
        assert before == [0, 1, 2]
        out = run_memtrace("fds", "--device", "local", "--pid", str(proc.pid), "--window", "1", "--json",
                           "--out", tmp_path / "c")
        s = json.loads(out.stdout)
    finally:
        proc.kill()
        proc.wait()
    assert s["baseline"] == {"count": 3, "closed_in_window": 0}
    start = s["censuses"][0]
    assert start["trigger"] == "start" and start["count"] == 3 and start["frida"] > 0
    assert start["by_kind"] == {"device": 3}
    assert s["peak"]["count"] == 3
    assert s["reconciliation"]["opened_out_of_sight"] == []
