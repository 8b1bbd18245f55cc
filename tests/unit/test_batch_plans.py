"""Batch plans: every key and value checked as the command line checks it, labels are names,
and a batch never deletes what memtrace batch did not make."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import run_memtrace

from memtrace.batch import load_plan, run_batch
from memtrace.errors import InputError
from memtrace.ui import SilentUI


def plan(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "plan.yaml"
    p.write_text(text)
    return p


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(InputError) as e:
        load_plan(plan(tmp_path, text))
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(("run", "expected"), [
    ("label: ../victim", "label '../victim': a label is a name"),
    ("label: ../../..", "label '../../..': a label is a name"),
    ("label: a/b", "label 'a/b': a label is a name"),
    ("label: ..", "label '..': a label is a name"),
    ("label: /etc", "label '/etc': a label is a name"),
])
def test_labels_are_names_not_paths(tmp_path: Path, run: str, expected: str) -> None:
    msg = refused(tmp_path, f"runs:\n  - {run}\n    program: [/bin/true]\n")
    assert expected in msg


@pytest.mark.parametrize(("run", "expected"), [
    ("pid: abc", "run 1: pid: Invalid value: 'abc' is not a valid integer"),
    ("pid: [1]", "run 1: pid: expected a single value, got [1]"),
    ("pid: 0", "--pid 0: not a process id"),
    ("program: 5", "run 1: program: expected a command line (a string or a list of words), got 5"),
    ("program: [/bin/true]\n    tracers: 5", "run 1: tracers: expected a tracer name or a list of them, got 5"),
    ("program: [/bin/true]\n    tracers: mallocc", "run 1: unknown tracer 'mallocc'"),
    ("program: [/bin/true]\n    windw: 3", "run 1: unknown key(s) windw"),
    ("program: [/bin/true]\n    window: nan", "--window nan: must be a positive, finite number"),
    ("program: [/bin/true]\n    window: -1", "--window -1.0: must be a positive, finite number"),
    ("program: [/bin/true]\n    window: [1]", "run 1: window: expected a single value, got [1]"),
    ("program: [/bin/true]\n    keep_running: 1", "run 1: keep_running: expected true or false, got 1"),
    ("program: [/bin/true]\n    options: {stack_treshold: 4096}", "unknown option(s) stack_treshold for malloc"),
    ("program: [/bin/true]\n    options: {stack_threshold: -1}", "--stack-threshold -1: must be 0 or more"),
    ("program: [/bin/true]\n    options: {frames: 600}", "malloc options: frames: Invalid value: 600 is not in the range 1<=x<=511"),
    ("program: [/bin/true]\n    options: {backend: logr}", "backend: Invalid value: 'logr' is not one of 'auto', 'logger', 'symbols'"),
    ("program: [/bin/true]\n    options: [1]", "run 1: options: expected a mapping of tracer options"),
    ("program: [/bin/true]\n    device: 'remote:'", "--device remote:: expected auto, local"),
])
def test_wrong_keys_and_types_name_the_key(tmp_path: Path, run: str, expected: str) -> None:
    assert expected in refused(tmp_path, f"runs:\n  - {run}\n")


def test_a_bare_tracer_name_is_one_tracer(tmp_path: Path) -> None:
    _, runs = load_plan(plan(tmp_path, "runs:\n  - program: [/bin/true]\n    tracers: malloc\n"))
    assert [r.tracer for r in runs] == ["malloc"]


def test_values_convert_as_on_the_command_line(tmp_path: Path) -> None:
    _, (run,) = load_plan(plan(tmp_path, "defaults: {window: '2.5'}\nruns:\n  - program: /bin/true x\n"
                                         "    options: {stack_threshold: '4096', backend: symbols}\n"))
    assert run.values["window"] == 2.5 and run.options == {"stack_threshold": 4096, "backend": "symbols"}
    assert run.target.argv == ["/bin/true", "x"]


@pytest.mark.parametrize("content", [b"\x00\x01\xff\xfe binary", b"\x89PNG\r\n\x1a\n\x00\x00"])
def test_binary_plan_is_one_line(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "plan.yaml"
    p.write_bytes(content)
    proc = run_memtrace("batch", p, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"memtrace: error: {p}: ") and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("text", ["runs:\n  - pid: abc\n", "runs:\n  - program: 5\n",
                                  "runs:\n  - program: [/bin/true]\n    tracers: 5\n", "runs: 5\n", "[1, 2]\n",
                                  "runs:\n  - label: ../../..\n    program: [/bin/true]\n"])
def test_cli_plan_errors_are_one_line(tmp_path: Path, text: str) -> None:
    proc = run_memtrace("batch", plan(tmp_path, text), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_batch_never_deletes_a_folder_it_did_not_make(tmp_path: Path) -> None:
    out = tmp_path / "bo"
    victim = out / "true-malloc"
    victim.mkdir(parents=True)
    (victim / "precious.txt").write_text("keep")
    _, runs = load_plan(plan(tmp_path, "runs:\n  - label: 'true'\n    program: [/bin/true]\n    device: local\n"))
    with pytest.raises(InputError, match="exists and was not made by memtrace batch"):
        run_batch(runs, out, force=True, ui_factory=lambda: SilentUI(passthrough=False))
    assert (victim / "precious.txt").read_text() == "keep"


def test_backend_logger_run_fails_before_launching(tmp_path: Path) -> None:
    marker = tmp_path / "launched"
    _, runs = load_plan(plan(tmp_path, f"runs:\n  - program: [/bin/touch, {marker}]\n    device: local\n"
                                       f"    options: {{backend: logger}}\n"))
    (outcome,) = run_batch(runs, tmp_path / "bo", force=False, ui_factory=lambda: SilentUI(passthrough=False))
    assert outcome.outcome == "failed" and "--backend logger" in outcome.note
    assert not marker.exists()
