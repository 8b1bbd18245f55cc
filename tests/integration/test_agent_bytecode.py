"""The agent's script comes from its compiled bytecode, kept in the cache folder (issue 21, item 6:
Frida parses the 230 KB bundle in the target every run otherwise, 0.1-0.35 s at load ~150 against
30-50 ms from bytecode).  Proved on the real CLI: a damaged cache entry is set aside -- the capture
is made from the source, exact, and the entry written again -- and the next run takes the entry
unchanged, exact too.  In a cache folder of the test's own (the user's is shared with every other
test running at the time): its first run builds everything, hence slow."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from memtrace.agentbuild import build_agent
from memtrace.capture import RecordType, read_records
from memtrace.frida_host import agent_bytecode_path

from ..conftest import run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


def _rows(exe: Path, out: Path, path_file: Path, cache: Path) -> tuple[int, int] | None:
    proc = run_memtrace("malloc", "--json", "--device", "local", "--out", out, "--", exe, path_file,
                        timeout=280, env={"MEMTRACE_CACHE_DIR": str(cache)})
    s = json.loads(proc.stdout)
    rows = {r["frames"][0]["function"]: (r["bytes"], r["count"]) for r in s["live_by_stack"] if r["frames"]}
    return rows.get("main")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_agent_is_made_from_its_kept_bytecode(compile_c, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = compile_c("path_writer")
    cache = tmp_path / "cache"
    monkeypatch.setenv("MEMTRACE_CACHE_DIR", str(cache))
    cached = agent_bytecode_path("malloc", build_agent("malloc").source)
    assert cached.parent == cache
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(b"not QuickJS bytecode")
    assert _rows(exe, tmp_path / "one", tmp_path / "p1", cache) == (100_000, 1000)
    code = cached.read_bytes()
    assert code != b"not QuickJS bytecode" and len(code) > 10_000      # compiled again, kept
    kept = cached.stat()
    assert _rows(exe, tmp_path / "two", tmp_path / "p2", cache) == (100_000, 1000)
    now = cached.stat()
    assert (now.st_ino, now.st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns), "the bytecode was compiled again"
    # END's timing.phases: the start's steps, in the order they happen (bench/startup_bench.py).
    end = next(r.body for r in read_records(tmp_path / "two") if r.type == RecordType.END)
    phases = end["timing"]["phases"]
    steps = ["loop", "device", "source.spawned", "source.held", "attached", "source.script loaded",
             "source.hello", "source.init", "started", "resumed"]
    assert [k for k in phases if k in steps] == steps, phases
    assert list(phases.values()) == sorted(phases.values())
