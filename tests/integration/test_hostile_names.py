"""Names from a target or a file reach the terminal as inert text (issue: hostile data).

A real program whose function symbols hold rich markup (``lone[/]``, a ``[link](...)``) and
terminal escape sequences (screen clear, window title), a process renamed to such a name, and a
JetsamEvent report whose process name holds them: every command prints them as the characters
they are (control characters as ``\\x1b``), never crashes on them and never lets the terminal obey.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.conftest import ROOT, run_memtrace

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="local Linux device")

LONE = "lone[/]"
LINK = "[link](http://x.example)[/link]"
ESC_SHOWN = "esc\\x1b[2J\\x1b]0;pwned\\x07"
# Sequences a terminal would obey: clear the screen, set the window title.
OBEYED = ("\x1b[2J", "\x1b]0;")


@pytest.fixture(scope="module")
def hostile(compile_c) -> Path:
    return compile_c("hostile_names")


@pytest.mark.slow
def test_malloc_prints_hostile_function_names_as_text(hostile: Path, tmp_path: Path) -> None:
    proc = run_memtrace("malloc", "--device", "local", "--window", "20", "--out", tmp_path / "c", "--", hostile)
    out = proc.stdout + proc.stderr
    assert "MarkupError" not in out and "Traceback" not in out
    for name in (LONE, LINK, ESC_SHOWN):
        assert f"{name} (hostile_names)" in proc.stdout, name
    assert "\x1b" not in proc.stdout and "\x1b" not in proc.stderr


@pytest.mark.slow
def test_report_of_the_capture_is_inert(hostile: Path, tmp_path: Path) -> None:
    from tests.unit.test_markdown_safety import assert_inert, render

    run_memtrace("malloc", "--device", "local", "--window", "20", "--out", tmp_path / "run", "--quiet", "--",
                 hostile)
    run_memtrace("report", tmp_path)
    md = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert "\x1b" not in md
    parsed = render(md)
    assert_inert(parsed)
    shown = "".join(parsed.text)
    for name in (LONE, LINK, ESC_SHOWN):
        assert name in shown, name


def _run_in_pty(args: list[str], timeout: float = 120) -> tuple[int, str]:
    """The real CLI on a pseudo-terminal (so the live panel runs), everything it wrote to it."""
    pid, fd = pty.fork()
    if pid == 0:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "100", "TERM": "xterm-256color"}
        os.execvpe(sys.executable, [sys.executable, "-m", "memtrace.cli", *args], env)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_live_view_shows_the_targets_own_escape_sequences(hostile: Path, tmp_path: Path) -> None:
    rc, screen = _run_in_pty(["malloc", "--device", "local", "--window", "20", "--out", str(tmp_path / "c"),
                              "--", str(hostile), "print"])
    assert rc == 0, screen[-2000:]
    assert "target says: \\x1b[2J\\x1b]0;title\\x07[bold]x[/bold]" in screen
    assert LONE in screen and LINK in screen
    for seq in OBEYED:
        assert seq not in screen, repr(seq)


@pytest.fixture
def renamed(hostile: Path):
    proc = subprocess.Popen([str(hostile), "wait"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.mark.slow
def test_census_and_limit_show_a_hostile_process_name(renamed: int) -> None:
    census = run_memtrace("census", "--device", "local", "--all", "--sort", "pid", env={"COLUMNS": "120"})
    line = next(ln for ln in census.stdout.splitlines() if ln.strip().startswith(f"{renamed} "))
    assert "[/]x[red]\\x1b]0;t" in line
    limit = run_memtrace("limit", "--device", "local", "--pid", str(renamed))
    assert limit.stdout.startswith("[/]x[red]\\x1b]0;t (pid")
    for out in (census.stdout, limit.stdout):
        assert "\x1b" not in out


def test_jetsam_shows_a_hostile_process_name(tmp_path: Path) -> None:
    name = "\x1b]0;pwned\x07\x1b[2J[/]lone"
    report = {"product": "iPhone12,1[/]", "build": "iPhone OS 17.2 (21C62)", "largestProcess": name,
              "memoryStatus": {"pageSize": 16384, "memoryPages": {"free": 10}},
              "processes": [{"pid": 7, "name": name, "rpages": 1000, "reason": "per-process-limit",
                             "killDelta": 3}]}
    path = tmp_path / "JetsamEvent-2024-01-01-000000.ips"
    path.write_text(json.dumps({"bug_type": "298", "os_version": "iPhone OS 17.2 (21C62)"}) + "\n"
                    + json.dumps(report))
    proc = run_memtrace("jetsam", path)
    assert "\\x1b]0;pwned\\x07\\x1b[2J[/]lone" in proc.stdout
    assert "iPhone12,1[/]" in proc.stdout
    assert "\x1b" not in proc.stdout


def test_error_lines_show_control_characters(tmp_path: Path) -> None:
    proc = run_memtrace("malloc", "--device", "local", "--", str(tmp_path / "no\x1b[2Jsuch\nprogram"), check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "\x1b" not in proc.stderr
    assert "no\\x1b[2Jsuch\\nprogram" in proc.stderr
