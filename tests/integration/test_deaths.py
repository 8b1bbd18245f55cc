"""Death classification on real scenario programs, batch runs, and captures that survive any kill."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import CaptureInfo, RecordType, decode_agent_records, read_records
from memtrace.capture_loop import CaptureOptions, run_capture
from memtrace.target import TargetSpec
from memtrace.ui import SilentUI

from ..conftest import ROOT, memtrace_json, run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


@pytest.mark.slow
def test_launch_storm(demo_bin: Path, tmp_path: Path) -> None:
    # The test is about classifying a death that lands in the storm, not about our overhead, so
    # the watchdog fires unconditionally after five windows (0.5 s of storm). A threshold near
    # the native slowdown (~1.3 on two CPUs) was flaky: when the agent's start-up work shares the
    # CPUs with die_storm's calibration, the calibrated rate drops and no window looks slow. Half
    # a second leaves the agent's 100 ms flush time to see the rate even with four storm threads
    # starving it of CPU.
    s = memtrace_json("malloc", "--device", "local", "--window", "20", "--stack-threshold", "0",
                      "--out", tmp_path / "c", "--", demo_bin / "die_storm",
                      "--max-slowdown", "0", "--grace", "5")
    assert s["ended"] == "launch-storm", (s["reason"], _end(tmp_path / "c")["evidence"])
    end = _end(tmp_path / "c")
    ev = end["evidence"]
    assert ev["alive_after_start_s"] < 10
    assert max(ev["mean_calls_per_s"], ev["peak_calls_per_s"]) >= ev["thresholds"]["storm_rate"]
    assert "exit" not in ev, "a SIGKILLed process never reaches exit()"
    # Read by the host from a pidfd (exitwatch): the signal is named.
    assert ev["exit_status"] == {"signal": 9, "signal_name": "SIGKILL", "core_dumped": False}
    assert s["reason"].startswith("the target was killed by SIGKILL ")


@pytest.mark.slow
def test_exit_status_is_read_by_the_host(compile_c, tmp_path: Path) -> None:
    s = memtrace_json("malloc", "--device", "local", "--window", "10", "--out", tmp_path / "c", "--",
                      compile_c("exit_code"), "3")
    assert s["ended"] == "target-exited"
    # Frida reaps the child itself and throws the status away; the host's pidfd still reads it.
    ev = _end(tmp_path / "c")["evidence"]
    assert ev["exit_status"] == {"exit_status": 3}
    assert s["reason"] == "the target exited on its own (exit status 3)"
    # A bare program name is looked up on PATH, as a shell would.
    s = memtrace_json("malloc", "--device", "local", "--window", "10", "--out", tmp_path / "t", "--", "true")
    assert s["ended"] == "target-exited"


def test_a_program_gone_during_the_attach_delay_is_said_untraced(compile_c, tmp_path: Path) -> None:
    # Once a traceback and a capture without END (the host took the gone program for one that
    # cut its channel to an agent it never had).
    r = run_memtrace("malloc", "--device", "local", "--window", "10", "--attach-delay", "1", "--json",
                     "--out", tmp_path / "c", "--", compile_c("exit_code"), "3")
    s = json.loads(r.stdout)
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert (s["ended"], s["reason"]) == ("target-exited", "the target exited on its own (exit status 3) "
                                                          "during attach delay before memtrace attached")
    assert not any(s["calls"].values())
    assert _end(tmp_path / "c")["evidence"]["exit_status"] == {"exit_status": 3}


@pytest.mark.slow
def test_slow_start(demo_bin: Path, tmp_path: Path) -> None:
    s = memtrace_json("malloc", "--device", "local", "--window", "3", "--out", tmp_path / "c", "--",
                      demo_bin / "slow_start", "30")
    assert s["ended"] == "slow-start"
    ev = _end(tmp_path / "c")["evidence"]
    assert ev["calls"] == 0 and ev["window_s"] == 3


@pytest.mark.slow
def test_anti_debug(demo_bin: Path, tmp_path: Path) -> None:
    s = memtrace_json("malloc", "--device", "local", "--window", "10", "--rpc-timeout", "3",
                      "--out", tmp_path / "c", "--", demo_bin / "anti_debug")
    assert s["ended"] == "anti-debug"
    ev = _end(tmp_path / "c")["evidence"]
    assert ev["timeout"]["timeout_s"] == 3


@pytest.mark.parametrize("tracer", ["iosurface", "threads"])
@pytest.mark.slow
def test_an_idle_target_is_not_anti_debug(tracer: str, compile_c, tmp_path: Path) -> None:
    # A JSON-event tracer on a live target with nothing to report: the agent's heartbeat keeps
    # the silence detector quiet, and the window ends as a slow start (no traced activity).
    s = memtrace_json(tracer, "--device", "local", "--window", "4", "--rpc-timeout", "1.5",
                      "--out", tmp_path / "c", "--", compile_c("steady"))
    assert s["ended"] == "slow-start", s["reason"]


@pytest.mark.slow
def test_perpetual_stream_suspected_then_confirmed_by_batch(demo_bin: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    # Load-proof: die_perpetual dies 3 s after launch but never sooner than 2 s after its malloc is
    # hooked (a second attempt attaching 1.5 s in could otherwise be killed mid-injection on a busy
    # machine), and only the anti-debug run has a short rpc timeout (a slow CModule compile is not
    # a frozen process).
    plan.write_text(f"""
defaults: {{device: local, window: 8, retries: 1, retry_delay_step: 1.5, rpc_timeout: 60}}
runs:
  - {{label: json, program: [{demo_bin / 'json_service'}]}}
  - {{label: perpetual, program: [{demo_bin / 'die_perpetual'}, --lifetime, "3", --min-hooked, "2"]}}
  - {{label: slow, program: [{demo_bin / 'slow_start'}, "30"], window: 3, retries: 0}}
  - {{label: antidebug, program: [{demo_bin / 'anti_debug'}], retries: 0, rpc_timeout: 3}}
  - {{label: missing, program: [/nonexistent/program]}}
""")
    out = tmp_path / "batch"
    proc = run_memtrace("batch", plan, "--out", out, "--json", check=False, timeout=300)
    assert proc.returncode == 1, "a failed target makes the batch exit 1 (but never stops it)"
    rows = {r["label"]: r for r in json.loads(proc.stdout)["runs"]}
    assert {k: v["outcome"] for k, v in rows.items()} == {
        "json": "target-exited", "perpetual": "perpetual-stream", "slow": "slow-start",
        "antidebug": "anti-debug", "missing": "failed"}
    assert [a["attach_delay"] for a in rows["perpetual"]["attempts"]] == [0.0, 1.5]
    assert rows["json"]["events"] > 20000 and rows["json"]["bytes"] > 10_000_000
    end = _end(out / "perpetual-malloc")
    assert end["ended"] == "perpetual-stream" and end["confidence"] == "confirmed"
    assert (out / "perpetual-malloc" / "attempt-1" / "capture.mtc.failed").exists()
    # The batch folder feeds the report: every run that produced a capture has its row and death type.
    report = run_memtrace("report", out, check=False, timeout=120)
    assert report.returncode == 0, report.stderr
    text = (out / "REPORT.md").read_text()
    for target in ("json_service", "die_perpetual", "slow_start", "anti_debug"):
        assert f"| {target} |" in text
    assert "perpetual-stream" in text and "slow-start" in text and "anti-debug" in text
    # Re-running the plan skips what is done.
    again = run_memtrace("batch", plan, "--out", out, "--json", check=False, timeout=300)
    skipped = {r["label"]: r["skipped"] for r in json.loads(again.stdout)["runs"]}
    assert skipped == {"json": True, "perpetual": True, "slow": True, "antidebug": True, "missing": False}


@pytest.mark.slow
def test_random_kills_always_leave_readable_captures(compile_c, tmp_path: Path) -> None:
    exe = compile_c("steady")
    rng = random.Random(1234)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for i in range(6):
        out = tmp_path / f"c{i}"
        victim_is_target = i % 2 == 0
        mt = subprocess.Popen([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--quiet",
                               "--window", "30", "--out", str(out), "--", str(exe)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert mt.stdout is not None
        line = mt.stdout.readline()
        assert line.startswith("ready "), line
        time.sleep(rng.uniform(0.2, 2.0))
        if victim_is_target:
            os.kill(int(line.split()[1]), signal.SIGKILL)
            mt.communicate(timeout=60)
        else:
            mt.send_signal(signal.SIGKILL)    # memtrace itself dies mid-stream
            mt.communicate(timeout=60)
            os.kill(int(line.split()[1]), signal.SIGKILL)
        info = CaptureInfo(out)
        records = list(read_records(out, info))
        assert records[0].type == RecordType.META
        for r in records:
            if r.type == RecordType.BATCH:
                list(decode_agent_records(r.data))
        s = summarize(iter(records))
        if victim_is_target:
            assert not info.truncated and s.end["ended"] == "target-exited"
            assert "killed" in s.end["reason"]
        else:
            assert s.end == {}, "memtrace was killed: no END, but everything flushed reads back"
        assert s.calls["malloc"] >= 0


def _end(capture: Path) -> dict:
    end: dict = {}
    for r in read_records(capture):
        if r.type == RecordType.END:
            end = r.body
    return end


class RecordingUI(SilentUI):
    wants_families = True

    def __init__(self) -> None:
        super().__init__(passthrough=False)
        self.progress_seen: list = []

    def progress(self, p) -> None:  # type: ignore[no-untyped-def]
        self.progress_seen.append(p)


@pytest.mark.slow
def test_live_view_sees_phases_rates_and_top_families(demo_bin: Path, tmp_path: Path) -> None:
    ui = RecordingUI()
    # Rings big enough that a drain starved of CPU on a loaded machine drops nothing (the exact
    # family bytes below need every stack; drops themselves are tested elsewhere).
    result = run_capture("malloc", TargetSpec(device="local", argv=[str(demo_bin / "workload"), "--linger", "4"]),
                         CaptureOptions(tracer="malloc", window=30, out=tmp_path / "c",
                                        agent_config={"ringKb": 8192, "rings": 16}), ui)
    assert result.ended == "target-exited"
    assert ui.phases[:4] == ["launching", "attaching", "loading agent", "capturing"]
    assert ui.phases[-2:] == ["flushing", "done"]
    last = ui.progress_seen[-1]
    assert last.window == 30 and 1.0 <= last.elapsed <= 30
    assert int(dict(last.rows)["calls"].replace(",", "")) > 40000 and last.dropped == 0
    families = dict(last.families)
    assert families.get("image decode", 0) == 6 * (1 + 2 + 4 + 8) * 1024 * 1024
    assert len(families) >= 3
