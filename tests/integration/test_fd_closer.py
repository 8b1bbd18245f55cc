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
