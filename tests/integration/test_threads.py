"""``memtrace threads`` on a program with a known pattern of creations, joins and detaches."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import frame_names, memtrace_json

from memtrace.report import build_report

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


def _rows(rows: list[dict]) -> list[tuple]:
    """(routine, caller, count, stack bytes), call sites of one function folded together."""
    out: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        acc = out.setdefault((r["routine"], r["caller"]), [0, 0])
        acc[0] += r["count"]
        acc[1] += r["stack_bytes"]
    return sorted((k[0], k[1], v[0], v[1]) for k, v in out.items())


@pytest.mark.smoke
def test_creations_joins_detaches_and_leaks(compile_c: Callable[..., Path], tmp_path: Path) -> None:
    s = memtrace_json("threads", "--device", "local", "--window", "30", "--out", tmp_path / "c", "--",
                      compile_c("thread_leaker"))
    assert s["ended"] == "target-exited"
    assert s["missing"] == []
    default = s["default_stack_size"]
    assert default and default > 0
    assert (s["created"], s["created_detached"], s["joined"], s["detached"], s["exited"]) == (16, 2, 4, 3, 14)
    assert s["unmatched"] == {}
    assert s["existing_at_start"] == 1                     # main: Frida's own threads are cloaked
    assert s["peak"]["count"] == 7                         # main + 2 long-lived + 4 at the barrier
    assert _rows(s["created_by_stack"]) == sorted([
        ("quick_task", "leak_joinable", 5, 5 * default),
        ("worker_task", "run_joined_workers", 4, 4 * default),
        ("detached_task", "run_detached_later", 3, 3 * default),
        ("attr_task", "run_detached_attr", 2, 2 * 256 * 1024),
        ("long_lived_task", "start_long_lived", 2, 2 * default),
    ])
    leaked = s["leaked"]
    assert (leaked["count"], leaked["stack_bytes"]) == (5, 5 * default)
    assert _rows(leaked["by_stack"]) == [("quick_task", "leak_joinable", 5, 5 * default)]
    assert frame_names(leaked["by_stack"][0]["frames"])[:2] == ["leak_joinable (thread_leaker)", "main (thread_leaker)"]
    running = s["running_at_end"]
    assert (running["count"], running["joinable"]) == (2, 2)
    assert _rows(running["by_stack"]) == [("long_lived_task", "start_long_lived", 2, 2 * default)]
    assert s["failed"] == {"EAGAIN": 1}
    assert [(r["routine"], r["caller"], r["count"]) for r in s["failures_by_stack"]] == [
        ("quick_task", "try_huge_stack", 1)]

    build_report(tmp_path / "c", out=tmp_path / "r")
    md = (tmp_path / "r" / "REPORT.md").read_text()
    assert "## Threads" in md
    assert "| thread_leaker | capture.mtc | 16 | 4 | 3 + 2 at creation | 7 | 5 | 2 | EAGAIN ×1 |" in md
    assert "| 5 | quick_task | leak_joinable |" in md


@pytest.mark.slow
def test_window_verdict_counts_this_tracers_events(compile_c: Callable[..., Path], tmp_path: Path) -> None:
    # A live target with thread activity completes its window; one with none is a slow start
    # (the threads that were already there are a snapshot, not activity).
    s = memtrace_json("threads", "--device", "local", "--window", "2", "--out", tmp_path / "busy", "--",
                      compile_c("thread_churn"))
    assert s["ended"] == "completed"
    assert s["created"] >= 20 and s["joined"] >= s["created"] - 1 and s["leaked"]["count"] == 0
    idle = memtrace_json("threads", "--device", "local", "--window", "1", "--out", tmp_path / "idle", "--",
                         compile_c("steady"))
    assert idle["ended"] == "slow-start" and idle["existing_at_start"] == 1 and idle["created"] == 0
