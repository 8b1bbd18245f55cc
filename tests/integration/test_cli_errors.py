"""What a user who gets something wrong sees: one line naming what is wrong, a non-zero exit,
no traceback, nothing launched that should not be and nothing left behind."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.children import exit_of, kill_and_reap
from tests.conftest import ROOT, run_memtrace

from memtrace.capture import RecordType, read_records
from memtrace.capture_loop import CaptureOptions, run_capture
from memtrace.errors import MemtraceError
from memtrace.exitwatch import local_pid_alive
from memtrace.frida_host import FridaHost
from memtrace.target import TargetSpec

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="local Linux device")


def one_line_error(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("memtrace: error: ")
    return proc.stderr.strip()


def in_dir(cwd: Path, *args: str | Path, check: bool = False,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI run from ``cwd``, where a default capture folder would land."""
    return subprocess.run([sys.executable, "-m", "memtrace.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})},
                          check=check)


@pytest.fixture(scope="module")
def static_prog(compile_c) -> Path:
    return compile_c("steady", "-static")       # one build for this module and test_doctor's


# ---- launch ---------------------------------------------------------------------------------


@pytest.mark.smoke
def test_non_executable_file_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    msg = one_line_error(in_dir(tmp_path, "malloc", "--device", "local", "--", "/etc/passwd"))
    assert msg == "memtrace: error: cannot launch /etc/passwd: not an executable file (no execute permission)"
    assert not (tmp_path / "captures").exists() or not any((tmp_path / "captures").iterdir())


def test_executable_that_is_not_a_program_is_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "data.bin"
    fake.write_bytes(b"\x00" * 64)
    fake.chmod(0o755)
    tmp = tmp_path / "tmp"       # the hold point's folder is made before Frida refuses the file
    tmp.mkdir()
    msg = one_line_error(in_dir(tmp_path, "malloc", "--device", "local", "--", fake, env={"TMPDIR": str(tmp)}))
    assert msg == f"memtrace: error: cannot launch {fake}: unable to parse executable at '{fake}'"
    assert not any((tmp_path / "captures").iterdir())
    assert sorted(p.name for p in tmp.glob("memtrace-hold-*")) == []


def test_static_program_is_refused_before_launch(static_prog: Path, tmp_path: Path) -> None:
    msg = one_line_error(in_dir(tmp_path, "malloc", "--device", "local", "--", static_prog))
    assert f"cannot trace {static_prog}: it is statically linked" in msg
    assert not any((tmp_path / "captures").iterdir())


def test_static_process_is_refused_before_attach_and_keeps_running(static_prog: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen([str(static_prog)], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.2)
        msg = one_line_error(run_memtrace("malloc", "--device", "local", "--pid", str(proc.pid), "--out",
                                          tmp_path / "c", check=False))
        assert msg.startswith(f"memtrace: error: cannot trace pid {proc.pid}: it is statically linked")
        assert proc.poll() is None, "Frida must not have been let near it (it aborts such a process)"
        assert not (tmp_path / "c").exists()
    finally:
        proc.kill()
        proc.wait()


def test_attach_failure_after_spawn_is_one_line_kills_the_process_and_leaves_nothing(
        static_prog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the static check out of the way, Frida's injection crashes the program (its loader
    cannot run in a static binary).  A death during injection leaves a capture whose END names it
    (issue 26), not a register dump; the process memtrace spawned is gone."""
    from memtrace import launchers

    monkeypatch.setattr(launchers, "check_local_program", lambda *a, **k: None)
    target = TargetSpec(device="local", argv=[str(static_prog)])
    host = FridaHost(target, rpc_timeout=10)
    result = run_capture("malloc", target, CaptureOptions("malloc", window=5, out=tmp_path / "c"), host=host)
    assert result.ended == "target-exited" and "during injection" in result.reason, result.reason
    assert "\n" not in result.reason and "rip:" not in result.reason
    end = [r.body for r in read_records(result.path) if r.type == RecordType.END]
    assert end and end[0]["evidence"]["stage"] == "injection"
    deadline = time.monotonic() + 5
    while local_pid_alive(host.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not local_pid_alive(host.pid)


@pytest.mark.parametrize("launched", ["spawned", "pid"])
def test_an_agent_that_does_not_build_leaves_no_program_running_untraced(
        launched: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's C fails to build in the target (here a line that cannot compile, as a C source
    out of step with its layout did in a storm): the run ends with that error.  A program memtrace
    spawned, held before its first line, is killed and leaves no capture -- it used to be released
    untraced and run on, an orphan of the failed command; a --pid process lives on, detached."""
    marker = tmp_path / "ran"
    script = f"echo ran > {marker}; sleep 60"
    monkeypatch.setattr(FridaHost, "c_sources", _broken_sources)
    sleeper = None
    if launched == "pid":
        sleeper = subprocess.Popen(["/bin/sh", "-c", "sleep 60"])
        time.sleep(0.2)
        target = TargetSpec(device="local", pid=sleeper.pid)
    else:
        target = TargetSpec(device="local", argv=["/bin/sh", "-c", script])
    host = FridaHost(target, rpc_timeout=30)
    try:
        with pytest.raises(MemtraceError, match="compilation failed"):
            run_capture("malloc", target, CaptureOptions("malloc", window=5, out=tmp_path / "c"), host=host)
        pid = host.pid
        assert pid is not None
        if launched == "spawned":
            deadline = time.monotonic() + 5
            while local_pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not local_pid_alive(pid)
            assert not marker.exists(), "the spawned program ran a line of its own"
            assert not (tmp_path / "c").exists()
        else:
            # Not ours: alive, detached.  Looked at without a wait that could take the ptrace stop
            # of Frida's uninjection, which may still run (this process is its tracer): taken by
            # sleeper.poll(), it read as "-11", and then killed it for real (CI, rounds 8 and 9).
            assert sleeper is not None and exit_of(sleeper) is None
            # Detached for real: the next session on it, from this same process (a long-lived
            # host, as a storm's), is not refused as "another memtrace session is tracing" -- it
            # was, 200 cycles in a row, after one failed build.
            monkeypatch.undo()
            again = run_capture("malloc", target, CaptureOptions("malloc", window=0.5, out=tmp_path / "again"),
                                host=FridaHost(target, rpc_timeout=30))
            assert again.ended == "slow-start", again.reason      # accepted; sleep allocates nothing
    finally:
        if sleeper is not None:
            kill_and_reap(sleeper)


def _broken_sources(host: FridaHost, agent: str) -> list[str]:
    from memtrace.agentbuild import build_agent

    sources = list(build_agent(agent).c_sources)
    sources[0] = sources[0] + "\n#error a C source that does not build\n"
    return sources


def test_unreachable_remote_device_is_one_line(tmp_path: Path) -> None:
    msg = one_line_error(in_dir(tmp_path, "malloc", "--device", "remote:127.0.0.1:1", "--", "/bin/true"))
    assert msg.startswith("memtrace: error: --device remote:127.0.0.1:1: unable to connect to remote frida-server")
    assert not any((tmp_path / "captures").iterdir())


def test_app_on_the_local_device_says_it_needs_ios_and_lists_devices(tmp_path: Path) -> None:
    for launch in ("auto", "none"):
        msg = one_line_error(in_dir(tmp_path, "malloc", "--device", "local", "--app", "com.example.foo",
                                    "--launch", launch))
        assert "--app com.example.foo: --app needs an iOS device (this is the local device)" in msg
        assert "devices found: local (Local System)" in msg


@pytest.fixture
def two_sleepers(tmp_path: Path):
    exe = tmp_path / "mt-twin-sleep"
    shutil.copy("/bin/sleep", exe)
    procs = [subprocess.Popen([str(exe), "30"]) for _ in range(2)]
    time.sleep(0.2)
    yield exe.name, sorted(p.pid for p in procs)
    for p in procs:
        p.kill()
        p.wait()


def test_name_matching_two_processes_lists_their_pids(two_sleepers: tuple[str, list[int]], tmp_path: Path) -> None:
    name, pids = two_sleepers
    msg = one_line_error(in_dir(tmp_path, "malloc", "--device", "local", "--name", name))
    assert msg == (f"memtrace: error: --name {name}: 2 processes have that name (pids {pids[0]}, {pids[1]}); "
                   f"choose one with --pid")
    msg = one_line_error(run_memtrace("limit", "--device", "local", "--name", name, check=False))
    assert f"2 processes named '{name}' ({pids[0]}, {pids[1]}); use --pid" in msg


def test_unknown_name_is_one_line(tmp_path: Path) -> None:
    msg = one_line_error(in_dir(tmp_path, "malloc", "--device", "local", "--name", "no-such-process-xyz"))
    assert msg == "memtrace: error: --name no-such-process-xyz: no running process with that name on Local System"


# ---- options --------------------------------------------------------------------------------


def test_misspelt_option_before_the_program_launches_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "launched"
    msg = one_line_error(in_dir(tmp_path, "malloc", "--windw", "3", "--", "/bin/touch", marker))
    assert "No such option '--windw'" in msg and "(see memtrace malloc --help)" in msg
    assert not marker.exists() and not (tmp_path / "captures").exists()


@pytest.mark.parametrize(("args", "fragment"), [
    (["malloc", "--window", "nan", "--", "/bin/true"], "Invalid value for '--window': nan: must be a positive"),
    (["malloc", "--window", "inf", "--", "/bin/true"], "Invalid value for '--window': inf: must be a positive"),
    (["census", "--sort", "bogus"], "Invalid value for '--sort'"),
    (["report"], "Missing argument 'FOLDER'"),
    (["nosuchcommand"], "No such command 'nosuchcommand'"),
])
def test_usage_errors_are_one_line(tmp_path: Path, args: list[str], fragment: str) -> None:
    assert fragment in one_line_error(in_dir(tmp_path, *args))


def test_backend_logger_off_darwin_is_refused_before_launch(tmp_path: Path) -> None:
    marker = tmp_path / "launched"
    msg = one_line_error(in_dir(tmp_path, "malloc", "--device", "local", "--backend", "logger", "--",
                                "/bin/touch", marker))
    assert "--backend logger: malloc_logger exists only in Darwin's libmalloc" in msg and "runs linux" in msg
    assert not marker.exists() and not (tmp_path / "captures").exists()


@pytest.mark.slow
def test_two_captures_started_at_once_get_two_folders(compile_c: Callable[..., Path], tmp_path: Path) -> None:
    exe = compile_c("exit_code")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = [subprocess.Popen([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--quiet",
                               "--window", "20", "--", str(exe), "0"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    folders = sorted((tmp_path / "captures").iterdir())
    assert len(folders) == 2 and all((f / "capture.mtc").is_file() for f in folders)
    assert all(f.name.startswith("exit_code-malloc-") for f in folders)


# ---- outputs --------------------------------------------------------------------------------


@pytest.mark.slow
def test_outputs_into_a_place_that_cannot_be_written_are_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    jetsam = ROOT / "tests" / "data" / "jetsam"
    captures = ROOT / "tests" / "data" / "report" / "captures"
    cases = [
        (["report", captures, "--out", blocker / "sub"], f"--out {blocker}/sub/report.json: cannot write: "),
        (["census", "--device", "local", "--out", blocker / "c.json", "-q"], f"--out {blocker}/c.json: cannot write: "),
        (["jetsam", jetsam, "--out-json", blocker / "j.json", "-q"], f"--out-json {blocker}/j.json: cannot write: "),
    ]
    for args, prefix in cases:
        msg = one_line_error(run_memtrace(*args, check=False))
        assert msg == f"memtrace: error: {prefix}{blocker} is a file, not a folder"
    # A folder where the file should be: the same, with the system's reason.
    (tmp_path / "r" / "REPORT.md").mkdir(parents=True)
    msg = one_line_error(run_memtrace("report", captures, "--out", tmp_path / "r", check=False))
    assert msg.startswith(f"memtrace: error: --out {tmp_path}/r/REPORT.md: cannot write: ")


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
@pytest.mark.slow
def test_reports_respect_the_umask(tmp_path: Path, umask: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = tmp_path / "r"
    census = tmp_path / "census-1.json"

    def run(*args: str | Path) -> None:
        # (exit 1 for the report: the golden folder holds a truncated capture on purpose)
        proc = subprocess.run([sys.executable, "-m", "memtrace.cli", *map(str, args)], env=env,
                              capture_output=True, text=True, preexec_fn=lambda: os.umask(umask))
        assert proc.returncode in (0, 1), proc.stderr

    run("census", "--device", "local", "--out", census, "-q")
    run("report", ROOT / "tests" / "data" / "report" / "captures", "--out", out)
    for f in (out / "REPORT.md", out / "report.json", census):
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask, f
