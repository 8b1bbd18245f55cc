"""A target that closes every descriptor (as daemons do at start) keeps being traced.

Before: the close() loop took Frida's socket and event fds with it -- the capture stopped at the
first flush after it (99.96 % of a run lost, END "killed"), memtrace exited, and the target ran on
with Frida's agent thread spinning at full CPU.  Now close, close_range and closefrom keep the
descriptors Frida cloaks open (cmodule/process.c, mt_close) and say so in the capture.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from memtrace.capture import RecordType, read_records

from ..conftest import run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


@pytest.mark.parametrize("how", ["loop", "range", "from"])
def test_closing_every_descriptor_loses_nothing(compile_c, tmp_path: Path, how: str) -> None:
    prog = compile_c("fd_closer")
    out = tmp_path / "c"
    proc = run_memtrace("malloc", "--device", "local", "--json", "--stack-threshold", "0", "--window", "60",
                        "--out", out, "--", prog, how, timeout=120)
    assert "fd_closer done" in proc.stderr          # with --json the target's stdout goes to stderr
    doc = json.loads(proc.stdout)
    assert (doc["ended"], doc["reason"]) == ("target-exited", "the target exited on its own (exit status 0)")
    rows = {r["frames"][0].get("function"): r for r in doc["top_stacks"] if r["frames"]}
    assert (rows["before_close"]["count"], rows["before_close"]["bytes"]) == (100, 100 * 8192)
    assert (rows["after_close"]["count"], rows["after_close"]["bytes"]) == (100, 100 * 16384)
    warnings = [r.body.get("message", "") for r in read_records(out / "capture.mtc") if r.type == RecordType.WARNING]
    kept = [w for w in warnings if "closed memtrace's own descriptors" in w]
    assert len(kept) == 1 and "kept open" in kept[0]


@pytest.mark.parametrize("how", ["dup2", "dup3"])
def test_dup_onto_memtraces_descriptors_is_refused_and_said(compile_c, tmp_path: Path, how: str) -> None:
    """/dev/null dup2'ed (dup3'ed) over every descriptor from 3 to 1023: the kernel would close Frida's
    first.  The calls onto Frida's fail with EBUSY (a success would send the program's data into
    memtrace's channel), every other one succeeds, and the capture goes on to the end."""
    prog = compile_c("fd_closer")
    out = tmp_path / "c"
    proc = run_memtrace("malloc", "--device", "local", "--json", "--stack-threshold", "0", "--window", "60",
                        "--out", out, "--", prog, how, timeout=120)
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"fd_closer {how} failed")]
    assert len(said) == 1, proc.stderr
    failed, errno = int(said[0].split()[3]), int(said[0].split()[5])
    assert failed > 0 and errno == 16                       # EBUSY
    doc = json.loads(proc.stdout)
    assert (doc["ended"], doc["reason"]) == ("target-exited", "the target exited on its own (exit status 0)")
    rows = {r["frames"][0].get("function"): r for r in doc["top_stacks"] if r["frames"]}
    assert (rows["after_close"]["count"], rows["after_close"]["bytes"]) == (100, 100 * 16384)
    warnings = [r.body.get("message", "") for r in read_records(out / "capture.mtc") if r.type == RecordType.WARNING]
    refused = [w for w in warnings if "dup2/dup3 onto memtrace's own descriptors" in w]
    assert len(refused) == 1 and f"failed {failed} time(s) with EBUSY" in refused[0]


def test_a_raw_close_syscall_is_said_as_the_channel_lost(compile_c, tmp_path: Path) -> None:
    """syscall(SYS_close) on 3..1023 is not interceptable: Frida's channel goes.  The capture says so
    (never "the target was killed" or a clean exit with the run unseen), and a program memtrace
    launched is not left behind."""
    prog = compile_c("fd_closer")
    out = tmp_path / "c"
    proc = run_memtrace("malloc", "--device", "local", "--json", "--window", "60", "--out", out, "--", prog, "raw",
                        timeout=120)
    doc = json.loads(proc.stdout)
    assert doc["ended"] == "detached", doc["reason"]
    assert doc["reason"].startswith("lost the channel to the agent after "), doc["reason"]
    assert "the close system call made directly" in doc["reason"]
    # Hung in Frida's exit path (then killed) or exited on its own later: either is said.
    assert doc["reason"].endswith(("the target was killed", "the target exited later (exit status 0)"))
    end = [r.body for r in read_records(out / "capture.mtc") if r.type == RecordType.END][0]
    assert not Path(f"/proc/{end['pid']}").exists()
