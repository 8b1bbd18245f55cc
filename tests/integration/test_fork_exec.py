"""Processes the target makes: fork children run to completion, followed or not; exec and
posix_spawn are told (and followed with --follow-children), the exec'd program's output passes
through."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from tests import valgrind_oracle as oracle

from memtrace.analyze.malloc import summarize
from memtrace.capture import RecordType, read_records

from ..conftest import run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

STORMS = 5                 # fork_storm runs: 5 x 20 children


def _records(path: Path) -> list:
    return list(read_records(path))


def _end(path: Path) -> dict:
    return [r for r in _records(path) if r.type == RecordType.END][-1].body


def _warnings(path: Path, kind: str) -> list[dict]:
    return [r.body for r in _records(path) if r.type == RecordType.WARNING and r.body.get("process") == kind]


def _by_top_function(path: Path) -> dict[str | None, tuple[int, int]]:
    """(allocations, bytes) per innermost function of the stacked allocations."""
    s = summarize(read_records(path))
    out: dict[str | None, tuple[int, int]] = {}
    for sid, st in s.stack_stats.items():
        frames = s.stack_frames(sid)
        name = frames[0].function if frames else None
        n, b = out.get(name, (0, 0))
        out[name] = (n + st.count, b + st.bytes)
    return out


@pytest.mark.slow
def test_a_fork_storm_under_threads_leaves_no_child_hanging(compile_c, tmp_path: Path) -> None:
    """4 threads allocate while main forks 20 children, 5 times: every child finishes (before,
    a child often hung in Frida's allocator lock, held at the fork by a thread it does not have)."""
    exe = compile_c("fork_storm")
    finished = 0
    for i in range(STORMS):
        out = tmp_path / f"c{i}"
        proc = run_memtrace("malloc", "--device", "local", "--quiet", "--window", "60", "--out", out, "--",
                            exe, "20", "10", timeout=300)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("children done")]
        assert line, proc.stdout + proc.stderr
        done, hung, failed = (int(x) for x in line[0].split()[2::2])
        finished += done
        assert (hung, failed) == (0, 0), line[0]
        end = _end(out)
        assert end["reason"] == "the target exited on its own (exit status 0)"
        # Said in the capture: every child, with its origin, in the END evidence and as a WARNING.
        assert [c["origin"] for c in end["children"]] == ["fork"] * 20
        assert len(_warnings(out, "child")) == 20
        assert end["timing"]["captured_s"] <= 60
    assert finished == STORMS * 20


@pytest.mark.slow
def test_a_followed_fork_child_is_traced_from_its_first_line(compile_c, tmp_path: Path) -> None:
    exe = compile_c("forker")
    out = tmp_path / "c"
    proc = run_memtrace("malloc", "--device", "local", "--quiet", "--window", "60", "--follow-children",
                        "--out", out, "--", exe, timeout=300)
    assert "child status 0" in proc.stderr
    parent_end = _end(out / "capture.mtc")
    (child,) = parent_end["children"]
    assert child["origin"] == "fork" and child["capture"] == f"child-{child['pid']}.mtc"
    assert child["reason"] == "the target exited on its own (exit status 0)"
    child_path = out / child["capture"]
    # The child waited in its atfork handler for its agent: all 100 of child_work's blocks.
    assert _by_top_function(child_path)["child_work"] == (100, 100 * 8192)
    parent = _by_top_function(out / "capture.mtc")
    assert parent["parent_after_fork"] == (50, 50 * 20000) and "child_work" not in parent
    meta = _records(child_path)[0].body
    assert meta["target"]["label"] == "forker"
    assert meta["origin"]["pid"] == child["pid"] and meta["origin"]["parent_capture"] == "capture.mtc"
    # The report groups the child with its target.
    assert run_memtrace("report", out).returncode == 0
    (target,) = json.loads((out / "report.json").read_text())["targets"]
    assert target["target"] == "forker" and sorted(target["captures"]) == ["capture.mtc", child["capture"]]


@pytest.mark.slow
def test_a_followed_fork_child_gets_the_whole_agent(compile_c, tmp_path: Path) -> None:
    """A followed child's capture runs the tracer's current agent as the target's does: unwind tables
    for its modules without frame pointers (a local child), and --leaks scanning as the child exits."""
    out = tmp_path / "c"
    proc = run_memtrace("malloc", "--device", "local", "--quiet", "--window", "60", "--follow-children", "--leaks",
                        "--out", out, "--", compile_c("fork_leaker"), timeout=300)
    assert "child status 0" in proc.stderr
    (child,) = _end(out / "capture.mtc")["children"]
    assert child["reason"] == "the target exited on its own (exit status 0)"
    child_path = out / child["capture"]
    for path in (out / "capture.mtc", child_path):
        recon = next(r for r in _records(path) if r.type == RecordType.RECON).body
        assert "libc.so.6" in recon["unwind"]["tables"], path
        assert recon["process"]["guard"] is True
        # The core the host built, loaded as it is: a followed child too (it forks no compiler,
        # which would be one more child to follow), not TinyCC's slower code.
        assert recon["info"]["precompiledAs"] == "module", recon["info"]
    leaks = summarize(read_records(child_path)).leaks_json(None)
    assert leaks is not None and leaks["scan"]["when"] == "exit" and leaks["scan"]["complete"]
    leaked = {r["frames"][0]["function"]: (r["blocks"], r["bytes"]) for r in leaks["leaked"]["by_stack"]}
    assert leaked == {"child_leak": (3, 27000)}
    reachable = {r["frames"][0]["function"]: (r["blocks"], r["bytes"]) for r in leaks["reachable"]["by_stack"]
                 if r["frames"]}     # (blocks from before tracing have no stack)
    assert reachable.get("child_keep") == (2, 14000)
    # The parent allocated nothing of its own under the hooks: its scan found nothing of the child's.
    parent = summarize(read_records(out / "capture.mtc")).leaks_json(None)
    assert parent is not None and parent["scan"]["when"] == "exit"
    assert "child_leak" not in {r["frames"][0]["function"] for r in parent["leaked"]["by_stack"] if r["frames"]}


@pytest.mark.slow
@pytest.mark.skipif(oracle.valgrind() is None,
                    reason="valgrind is not installed (.ci/run installs it: apt-get install valgrind)")
@pytest.mark.parametrize("generations", [1, 2], ids=["child", "grandchild"])
def test_what_the_parent_lost_before_a_fork_is_lost_in_the_child_too(compile_c, tmp_path: Path,
                                                                      generations: int) -> None:
    """A fork child's scan takes none of the agent it inherited for the program's roots.  The parent's
    live table, copied into the child, holds every block the parent tracked: the two blocks the parent
    lost before the fork read as reachable in the child, where valgrind says definitely lost.  A
    grandchild inherits its grandparent's copy through its parent: left out too."""
    exe = compile_c("fork_inherit")
    args = ["grandchild"] if generations == 2 else []
    family = oracle.run_family(exe, *args, xml_dir=tmp_path / "vg")
    assert len(family) == 1 + generations, family
    out = tmp_path / "c"
    proc = run_memtrace("malloc", "--device", "local", "--quiet", "--window", "60", "--follow-children", "--leaks",
                        "--out", out, "--", exe, *args, timeout=300)
    assert proc.stderr.count("status 0") == generations, proc.stderr
    # The captures by generation, each with valgrind's process of that generation.
    paths, vg = [out / "capture.mtc"], [family[0]]
    for _ in range(generations):
        (child,) = _end(paths[-1])["children"]
        paths.append(out / child["capture"])
        vg.append(next(p for p in family if p.ppid == vg[-1].pid))
    lost = [(2, 10000)] + [(3, 17000) if generations == 2 else (2, 10000)] * generations
    for depth, (path, traced) in enumerate(zip(paths, vg, strict=True)):
        leaks = summarize(read_records(path)).leaks_json(None)
        assert leaks is not None and leaks["scan"]["when"] == "exit" and leaks["scan"]["complete"], path
        for kind in ("definitely_lost", "indirectly_lost"):
            assert (leaks[kind]["blocks"], leaks[kind]["bytes"]) == traced.run.exit.total(kind), (path, kind)
        assert (leaks["definitely_lost"]["blocks"], leaks["definitely_lost"]["bytes"]) == lost[depth], path
        inherited = leaks["scan"]["inherited_agent"]
        if depth == 0:
            assert {r["frames"][0]["function"]: (r["blocks"], r["bytes"])
                    for r in leaks["definitely_lost"]["by_stack"]} == {"parent_lose": (2, 10000)}
            assert inherited is None and leaks["scan"]["skipped"]["parent_agent_memory"] == 0
            continue
        # In a child, the parent's blocks were allocated before its tracing: found by the heap walk.
        assert all(r["allocated_before_tracing"] for r in leaks["definitely_lost"]["by_stack"]
                   if r["bytes"] != 7000), path
        # What was left out: the parent's list of its agent's memory.
        assert inherited is not None and inherited["ranges"] > 0 and not inherited["truncated"], inherited
        assert leaks["scan"]["skipped"]["parent_agent_memory"] > 0


@pytest.mark.slow
def test_an_exec_is_told_and_its_program_output_passes_through(compile_c, tmp_path: Path) -> None:
    out = tmp_path / "c"
    proc = run_memtrace("malloc", "--device", "local", "--quiet", "--window", "30", "--out", out, "--",
                        compile_c("exec_into"), compile_c("exec_target"), "1", "7", timeout=120)
    assert "exec_target done" in proc.stdout, "the exec'd program's output is passed through"
    end = _end(out)
    target = str(compile_c("exec_target"))
    assert end["ended"] == "target-exited"
    assert end["evidence"]["detach_reason"] == "process-replaced"
    assert end["reason"].startswith(f"the target replaced itself: exec of {target} after ")
    assert end["reason"].endswith("(process-replaced); not followed (--follow-children traces it), its output "
                                  "passed through; it then exited with exit status 7")
    assert end["evidence"]["exec"]["argv"] == [target, "1", "7"]
    assert _warnings(out, "process-replaced")
    # Everything before the exec was flushed first.
    assert _by_top_function(out / "capture.mtc")["before_exec"] == (40, 40 * 12288)


@pytest.mark.slow
def test_a_followed_exec_is_a_capture_of_its_own(compile_c, tmp_path: Path) -> None:
    out = tmp_path / "c"
    proc = run_memtrace("malloc", "--device", "local", "--quiet", "--window", "30", "--follow-children",
                        "--out", out, "--", compile_c("exec_into"), compile_c("exec_target"), "4", "7", timeout=120)
    assert "exec_target done" in proc.stdout
    end = _end(out / "capture.mtc")
    pid = int(proc.stdout.split("exec_into ")[1].split()[0])
    assert end["reason"].endswith(f"(process-replaced); traced on in exec-{pid}.mtc")
    assert _by_top_function(out / "capture.mtc")["before_exec"] == (40, 40 * 12288)
    followed = out / f"exec-{pid}.mtc"
    exec_end = _end(followed)
    assert exec_end["reason"] == "the target exited on its own (exit status 7)"
    assert exec_end["origin"]["origin"] == "exec"
    n, nbytes = _by_top_function(followed)["after_exec_tick"]
    assert n > 0 and nbytes == n * 20480
    assert "before_exec" not in _by_top_function(followed)


@pytest.mark.parametrize("follow", [False, True])
@pytest.mark.slow
def test_posix_spawn_is_told_or_followed(compile_c, tmp_path: Path, follow: bool) -> None:
    out = tmp_path / "c"
    target = str(compile_c("exec_target"))
    proc = run_memtrace("malloc", "--device", "local", "--quiet", "--window", "30", "--out", out,
                        *(["--follow-children"] if follow else []), "--", compile_c("spawner"), target, "4", "5",
                        timeout=120)
    assert "exec_target done" in proc.stdout
    end = _end(out / "capture.mtc")
    assert end["reason"] == "the target exited on its own (exit status 5)"
    (child,) = end["children"]
    assert (child["origin"], child["path"]) == ("spawn", target)
    assert Counter(w["child"]["origin"] for w in _warnings(out / "capture.mtc", "child")) == {"spawn": 1}
    if follow:
        spawned = out / child["capture"]
        assert _end(spawned)["reason"] == "the target exited on its own (exit status 5)"
        n, nbytes = _by_top_function(spawned)["after_exec_tick"]
        assert n > 0 and nbytes == n * 20480
    else:
        assert "capture" not in child and sorted(p.name for p in out.iterdir()) == ["capture.mtc"]


@pytest.mark.slow
def test_a_child_over_at_once_is_followed_from_before_its_constructors(compile_c, tmp_path: Path) -> None:
    """posix_spawn of a program that is over at once: before the hold, by the time the host
    learned of it there was nothing to attach to.  Its image now waits before its constructors
    (memtrace.hold) until its own capture's hooks are in."""
    out = tmp_path / "c"
    proc = run_memtrace("malloc", "--device", "local", "--window", "30", "--follow-children",
                        "--out", out, "--", compile_c("spawner"), "/bin/true", timeout=120)
    assert "status 0" in proc.stdout
    end = _end(out / "capture.mtc")
    assert end["reason"] == "the target exited on its own (exit status 0)"
    (child,) = end["children"]
    assert (child["origin"], child["path"], child["ended"]) == ("spawn", "/bin/true", "target-exited")
    assert (out / child["capture"]).exists()
    assert _end(out / child["capture"])["reason"] == "the target exited on its own (exit status 0)"
    assert f"child pid {child['pid']}: traced in {child['capture']}" in proc.stderr.replace("\n", " ")


@pytest.mark.slow
def test_a_failed_exec_is_not_a_replacement(compile_c, tmp_path: Path) -> None:
    out = tmp_path / "c"
    run_memtrace("malloc", "--device", "local", "--quiet", "--window", "30", "--out", out, "--",
                 compile_c("exec_into"), "/nonexistent/program", timeout=120)
    end = _end(out)
    assert end["reason"] == "the target exited on its own (exit status 127)"
    assert "exec" not in end["evidence"]
    (failed,) = _warnings(out, "exec-failed")
    assert failed["message"] == "exec of /nonexistent/program failed (errno 2); the target goes on"
