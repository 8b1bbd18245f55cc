"""The unwind walk's frame cache (cmodule/unwind.c) against the full walk, on a real program built with
g++ -O2 and no frame pointers: every stack, with its allocation count and bytes, is the same whether
each walk reuses the thread's previous one (the default) or walks every frame through the unwind
tables (MEMTRACE_FRAME_CACHE=off), and the cache was used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import read_records

from ..conftest import PROGRAMS, run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


def stacks(rows: list[dict[str, Any]]) -> dict[tuple[tuple[Any, ...], ...], tuple[int, int]]:
    """Every stack row as (module, offset, function) frames -> (allocations, bytes): no addresses (ASLR)."""
    out: dict[tuple[tuple[Any, ...], ...], tuple[int, int]] = {}
    for r in rows:
        key = tuple((f.get("module"), f.get("offset"), f.get("function")) for f in r["frames"])
        assert key not in out
        out[key] = (r["count"], r["bytes"])
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_frame_cache_gives_every_stack_the_full_walk_gives(build_dir: Path, tmp_path: Path) -> None:
    exe = build_dir / "frame_cache"
    subprocess.run(["g++", "-O2", "-g", "-pthread", "-o", str(exe), str(PROGRAMS / "frame_cache.cpp")], check=True)
    runs: dict[str, tuple[dict[str, Any], Any]] = {}
    for mode in ("on", "off"):
        out = tmp_path / mode
        proc = run_memtrace("malloc", "--json", "--device", "local", "--top", "100000", "--out", out, "--", exe,
                            env={"MEMTRACE_FRAME_CACHE": mode}, timeout=240)
        runs[mode] = (json.loads(proc.stdout), summarize(read_records(out)))
    on, off = runs["on"][0], runs["off"][0]
    # The program's 2 x 3,000 recursions reach 64 frames (--frames) now and then: truncated stacks,
    # walks ending inside the cached levels and past them.
    assert on["truncated_stacks"] == off["truncated_stacks"] > 0
    assert on["calls"] == off["calls"]
    assert all(v == 0 for v in on["dropped"].values())
    full = stacks(off["top_stacks"])
    assert len(full) > 200
    assert stacks(on["top_stacks"]) == full
    # The caches were used (most stacks: whole from the memo, or partly from the last walk), and not
    # at all when off.
    memo = runs["on"][1].counter("stack_memo_hits")
    reused = runs["on"][1].counter("frame_cache_walks")
    assert memo > 0 and reused > 0
    assert memo + reused > on["alloc_calls"] // 2
    assert runs["off"][1].counter("frame_cache_walks") == runs["off"][1].counter("stack_memo_hits") == 0
