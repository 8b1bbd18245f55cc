"""``memtrace doctor`` on the local device: host, device and inside real targets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.conftest import run_memtrace

from memtrace import doctor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="local Linux device")


def checks(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"]}


@pytest.mark.slow
def test_default_target_every_check(tmp_path: Path) -> None:
    proc = run_memtrace("doctor", "--device", "local", "--json")
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "doctor" and doc["ok"] is True
    c = checks(doc)
    assert [x["section"] for x in doc["checks"]] == sorted((x["section"] for x in doc["checks"]),
                                                           key=doctor.SECTIONS.index)
    for name in ("frida", "frida-tools", "ptrace", "CModule compiler", "device", "OS and model", "frida-server",
                 "attach", "CModule build", "self-test", "purgeable routing probe"):
        assert name in c, name
    assert c["OS and model"]["data"]["platform"] == "linux"
    assert c["attach"]["detail"].startswith(f"{_which('sleep')} 600 (pid ")
    assert c["frida-server"]["status"] == "ok"
    # The self-test: exactly the calls it made, each recorded, one stack through the named function.
    st = c["self-test"]
    assert st["status"] == "ok"
    assert st["data"] == {"expected_calls": 1000, "counted_calls": 1000, "recorded": 1000, "stacks": 1,
                          "stack_in_function": True, "rc": 0}
    # Every hook point of every registered tracer, each found, missing or failing to attach.
    malloc = c["malloc: hook points"]
    assert malloc["status"] == "ok"
    assert {p["name"] for p in malloc["data"]["points"] if p["status"] == "found"} >= {"malloc", "free", "calloc",
                                                                                       "realloc"}
    for name in ("fds", "threads"):
        assert c[f"{name}: hook points"]["status"] == "ok"
        assert all(p["status"] == "found" for p in c[f"{name}: hook points"]["data"]["points"])
    for name in ("iosurface", "purgeable", "probe"):
        assert c[f"{name}: hook points"]["status"] == "skip"
    assert c["purgeable routing probe"]["status"] == "skip"
    assert "mach_vm_allocate" in c["purgeable routing probe"]["detail"]


@pytest.mark.slow
def test_table_output_and_exit_status() -> None:
    proc = run_memtrace("doctor", "--device", "local", env={"COLUMNS": "120"})
    assert proc.returncode == 0
    assert "self-test" in proc.stdout and "ready: every tracer that applies here can work" in proc.stdout


@pytest.mark.slow
def test_target_with_the_darwin_stand_in_runs_the_probe(demo_bin: Path) -> None:
    doc = json.loads(run_memtrace("doctor", "--device", "local", "--json", "--",
                                  demo_bin / "camera_surfaces", "--linger", "60").stdout)
    c = checks(doc)
    assert doc["ok"] is True
    for name in ("iosurface", "purgeable", "probe"):
        assert c[f"{name}: hook points"]["status"] == "ok", c[f"{name}: hook points"]
    probe = c["purgeable routing probe"]
    assert probe["status"] == "ok"
    driving = {r["entry"] for r in probe["data"]["rows"] if r.get("drives_state_machine")}
    assert {"SET_STATE VOLATILE", "SET_STATE NONVOLATILE", "SET_STATE EMPTY"} <= driving


@pytest.mark.smoke
def test_a_target_no_tracer_can_work_in_exits_1(compile_c) -> None:
    exe = compile_c("steady", "-static")
    proc = run_memtrace("doctor", "--device", "local", "--json", "--", exe, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    attach = checks(doc)["attach"]
    assert doc["ok"] is False and attach["status"] == "fail" and "statically linked" in attach["detail"]


@pytest.mark.slow
def test_a_target_that_exits_during_the_checks_is_named(demo_bin: Path) -> None:
    proc = run_memtrace("doctor", "--device", "local", "--json", "--", demo_bin / "scn_sqlite_cache", check=False)
    assert proc.returncode == 1
    c = checks(json.loads(proc.stdout))
    assert c["target"]["status"] == "fail" and "exited during the" in c["target"]["detail"]


def test_unreachable_device_is_a_failed_check() -> None:
    proc = run_memtrace("doctor", "--device", "remote:127.0.0.1:1", "--json", check=False)
    assert proc.returncode == 1
    c = checks(json.loads(proc.stdout))
    assert c["device"]["status"] == "fail" and "unable to connect to remote frida-server" in c["device"]["detail"]
    assert c["frida"]["status"] == "ok"


def _which(name: str) -> str:
    import shutil

    found = shutil.which(name)
    assert found
    return found
