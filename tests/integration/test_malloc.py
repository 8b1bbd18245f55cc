"""memtrace malloc end to end: real programs, the real agent on Frida's local device, exact numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import RecordType, read_records

from ..conftest import ROOT, memtrace_json, run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


def stack_by_function(summary: dict, function: str) -> list[dict]:
    return [s for s in summary["top_stacks"] if s["frames"] and s["frames"][0]["function"] == function]


@pytest.mark.slow
def test_exact_counts_tiers_live_and_own_function_on_stack(compile_c, tmp_path: Path) -> None:
    exe = compile_c("pattern")
    s = memtrace_json("malloc", "--device", "local", "--window", "30", "--stack-threshold", "4096",
                      "--top", "20", "--out", tmp_path / "cap", "--", exe)
    assert s["ended"] == "target-exited"
    assert s["calls"]["malloc"] == 1000 + 500 + 10 + 1
    assert s["calls"]["calloc"] == 20
    assert s["calls"]["realloc"] == 3
    assert s["calls"]["posix_memalign"] == 5
    # 600 + 500 + 20 + 1 of its own; glibc's exit path may free a couple more.
    assert 1121 <= s["calls"]["free"] <= 1130
    assert [(t["max_bytes"], t["calls"]) for t in s["tiers"]] == [
        (256, 500), (1024, 1), (4096, 1001), (8192, 5), (65536, 22), (None, 10)]
    assert s["tiers"][2]["bytes"] == 1000 * 4096 + 2048
    assert s["gross_bytes"] == (1000 * 4096 + 500 * 100 + 10 * 100000 + 20 * 16384 + 1024 + 2048 + 16384
                                + 65536 + 5 * 8192)
    (batch,) = stack_by_function(s, "alloc_4k_batch")
    assert (batch["count"], batch["bytes"]) == (1000, 4096 * 1000)
    assert batch["frames"][1]["function"] == "main"
    (big,) = stack_by_function(s, "alloc_big")
    assert (big["count"], big["bytes"]) == (10, 1_000_000)
    (cal,) = stack_by_function(s, "use_calloc")
    assert (cal["count"], cal["bytes"]) == (20, 20 * 16384)
    reallocs = sorted((x["count"], x["bytes"]) for x in stack_by_function(s, "use_realloc"))
    assert reallocs == [(1, 16384), (1, 65536)]
    # Live at end: 400 of the 4 KB blocks, the 10 big ones, the 5 aligned ones.
    assert s["live"] == {"count": 415, "bytes": 400 * 4096 + 10 * 100000 + 5 * 8192,
                         "estimated_bytes": 400 * 4096 + 10 * 100000 + 5 * 8192}
    live_4k = [x for x in s["live_by_stack"] if x["frames"] and x["frames"][0]["function"] == "alloc_4k_batch"]
    assert [(x["count"], x["bytes"]) for x in live_4k] == [(400, 400 * 4096)]
    assert s["dropped"]["dropped_records"] == 0 and s["dropped"]["dropped_stacks"] == 0
    assert s["missing"] == []
    cov = s["coverage"]
    assert cov["allocator"]["source"] == "mallinfo2"
    # Everything the program keeps is >= 4 KB, so the live set explains the in-use growth.
    assert 0.95 <= cov["live_coverage"] <= 1.05


@pytest.mark.slow
def test_layered_thresholds_leave_4k_unstacked_but_live(compile_c, tmp_path: Path) -> None:
    # The layered capture (a device's default; asked for here): stacks from 8 KiB, tracked from 4 KiB.
    s = memtrace_json("malloc", "--device", "local", "--stack-threshold", "8192", "--live-threshold", "4096",
                      "--out", tmp_path / "cap", "--", compile_c("pattern"))
    assert stack_by_function(s, "alloc_4k_batch") == []
    assert s["live"]["count"] == 415
    assert s["coverage"]["stacked_bytes"] == 10 * 100000 + 20 * 16384 + 16384 + 65536 + 5 * 8192


@pytest.mark.slow
def test_four_threads_a_million_calls_each(compile_c, tmp_path: Path) -> None:
    s = memtrace_json("malloc", "--device", "local", "--window", "120", "--out", tmp_path / "cap", "--",
                      compile_c("threads"), "1000000", timeout=300)
    assert s["ended"] == "target-exited"
    small = s["tiers"][0]
    assert small["calls"] >= 4_000_000
    assert small["calls"] - 4_000_000 < 50, "only glibc's own thread set-up may add to the 64-byte calls"
    # Every allocation stacked (the local default): both of thread_worker's call sites, exactly.
    worker = sorted((r["count"], r["bytes"]) for r in stack_by_function(s, "thread_worker"))
    assert worker == [(4, 4 * 16384), (4_000_000, 4_000_000 * 64)]
    assert s["calls"]["free"] >= 4_000_004
    assert s["dropped"]["dropped_records"] == 0


@pytest.mark.slow
def test_target_that_forks_survives(compile_c, tmp_path: Path) -> None:
    s = memtrace_json("malloc", "--device", "local", "--out", tmp_path / "cap", "--", compile_c("forker"))
    # The parent's exit status is 0 only if the child (running our hooks, unattended) exited cleanly.
    assert s["ended"] == "target-exited"
    (after,) = stack_by_function(s, "parent_after_fork")
    assert (after["count"], after["bytes"]) == (50, 50 * 20000)
    # The child is not followed: its 100 x 8 KB never reach this capture.
    assert stack_by_function(s, "child_work") == []


def _start_steady(exe: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready ")
    return proc


@pytest.mark.slow
def test_attach_to_running_pid_with_delay(compile_c, tmp_path: Path) -> None:
    proc = _start_steady(compile_c("steady"))
    try:
        s = memtrace_json("malloc", "--device", "local", "--pid", str(proc.pid), "--attach-delay", "0.5",
                          "--window", "2", "--out", tmp_path / "cap")
    finally:
        proc.kill()
        proc.wait()
    assert s["ended"] == "completed"
    (tick,) = stack_by_function(s, "steady_tick")
    assert tick["count"] > 0 and tick["count"] % 4 == 0 or tick["count"] > 40
    assert tick["bytes"] == tick["count"] * 16384
    assert s["captured_s"] == pytest.approx(2.0, abs=1.0)


def _spawn_memtrace(*args: str | Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, "-m", "memtrace.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_ready_pid(proc: subprocess.Popen[str]) -> int:
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if line.startswith("ready "):
            return int(line.split()[1])
        if not line and proc.poll() is not None:
            break
    raise AssertionError("the target never said it was ready")


@pytest.mark.slow
def test_target_killed_mid_window_leaves_readable_capture(compile_c, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    mt = _spawn_memtrace("malloc", "--device", "local", "--json", "--window", "60", "--out", out, "--",
                         compile_c("steady"))
    pid = _wait_for_ready_pid(mt)
    time.sleep(1.5)
    os.kill(pid, signal.SIGKILL)
    stdout, _ = mt.communicate(timeout=60)
    assert mt.returncode == 0
    s = json.loads(stdout)
    assert s["ended"] == "target-exited"
    assert "killed" in s["reason"]
    (tick,) = stack_by_function(s, "steady_tick")
    assert tick["count"] >= 40, "1.5 s of 4 allocations every 10 ms were flushed before the kill"
    records = list(read_records(out))
    assert records[0].type == RecordType.META and records[-1].type == RecordType.END
    assert records[-1].body["evidence"]["alive_after_start_s"] >= 1.0


@pytest.mark.slow
def test_sigint_flushes_and_exits_130(compile_c, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    mt = _spawn_memtrace("malloc", "--device", "local", "--json", "--window", "60", "--out", out, "--",
                         compile_c("steady"))
    pid = _wait_for_ready_pid(mt)
    time.sleep(1.5)
    mt.send_signal(signal.SIGINT)
    stdout, stderr = mt.communicate(timeout=180)   # a loaded machine: the unhook waits for its stops
    assert mt.returncode == 130, stderr
    s = json.loads(stdout)
    assert s["ended"] == "interrupted"
    (tick,) = stack_by_function(s, "steady_tick")
    assert tick["count"] >= 40
    summary = summarize(read_records(out))
    assert summary.end["ended"] == "interrupted"
    assert "after" in summary.calibration, "a clean detach calibrates after the window"
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)   # the program memtrace launched is gone too


@pytest.mark.slow
def test_poisson_sampling_estimates_within_tolerance(compile_c, tmp_path: Path) -> None:
    # Stacks and the live set come from sampling alone (thresholds out of reach).
    s = memtrace_json("malloc", "--device", "local", "--sample-bytes", "4096", "--stack-threshold", "100000000",
                      "--live-threshold", "100000000", "--out", tmp_path / "cap", "--", compile_c("sampling"))
    a = stack_by_function(s, "small_a")
    b = stack_by_function(s, "small_b")
    assert len(a) == 1 and len(b) == 1
    # ~2,300 and ~4,900 samples: one standard deviation is about 2 % and 1.4 %; 10 % is > 4 sigma.
    assert a[0]["bytes"] == pytest.approx(200000 * 48, rel=0.10)
    assert b[0]["bytes"] == pytest.approx(100000 * 200, rel=0.10)
    assert a[0]["count"] == pytest.approx(200000, rel=0.10)
    live_a = [x for x in s["live_by_stack"] if x["frames"] and x["frames"][0]["function"] == "small_a"]
    assert live_a and live_a[0]["bytes"] == pytest.approx(200000 * 48, rel=0.10)
    assert not [x for x in s["live_by_stack"] if x["frames"] and x["frames"][0]["function"] == "small_b"]
    assert s["sampled"] > 1000


@pytest.mark.parametrize("args, needle", [
    (["--", "/nonexistent/program"], "/nonexistent/program"),
    (["--pid", "999999"], "999999"),
    (["--window", "-5", "--", "/bin/true"], "--window"),
    (["--out", "/proc/1/forbidden/cap", "--", "/bin/true"], "/proc/1/forbidden/cap"),
    ([], "no target"),
])
@pytest.mark.slow
def test_bad_input_is_one_clear_line(args: list[str], needle: str) -> None:
    proc = run_memtrace("malloc", "--device", "local", *args, check=False, timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("memtrace: error:") and needle in lines[0], proc.stderr


@pytest.mark.slow
def test_entries_redirected_through_a_trampoline_keep_their_caller(demo_bin: Path, tmp_path: Path) -> None:
    """glibc's memalign (aliased by aligned_alloc) cannot take a fast redirect; its stacks must still
    start at the calling function, not at Frida's trampoline or the caller's caller.  And although
    aligned_alloc is the same function, each call is counted as the name its caller used."""
    s = memtrace_json("malloc", "--device", "local", "--top", "40", "--out", tmp_path / "cap", "--",
                      demo_bin / "workload")
    simd = sorted((x["count"], x["bytes"]) for x in stack_by_function(s, "simd_buffer_alloc"))
    # memalign 4096, posix_memalign 8192, aligned_alloc 16384, valloc 12288.
    assert simd == [(10, 40960), (10, 81920), (10, 122880), (10, 163840)]
    assert s["calls"]["memalign"] == 10 and s["calls"]["aligned_alloc"] == 10
    assert s["calls"]["posix_memalign"] == 10 and s["calls"]["valloc"] == 10
