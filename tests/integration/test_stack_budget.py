"""No stack table ceiling (issue 21 item 4): the stack index grows (cmodule/core.c, mt_index_grow) and
the rows are by dense id in a reservation sized by the documented budget, so a program with more
distinct stacks than the old fixed table held (262,144 here) gets every one of them, none dropped;
and a stack deeper than --frames keeps its innermost frames and is marked truncated, up to 256 frames
and beyond.  Real programs on Frida's local device, exact numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import RecordType, read_records

from ..conftest import memtrace_json  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

DEPTH = 18                      # 2^18 = 262,144 call paths, each allocating 24 B once at its leaf


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_262144_distinct_stacks_all_kept(compile_c, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    s = memtrace_json("malloc", "--device", "local", "--out", out, "--", compile_c("many_stacks"), "paths", str(DEPTH),
                      timeout=540)
    assert all(v == 0 for v in s["dropped"].values()), s["dropped"]
    assert s["coverage"]["stack_coverage"] == 1.0
    records = list(read_records(out))
    # ~44 MiB of definitions: drains larger than one send went out in pieces, joined again by the host.
    [end] = [r.body for r in records if r.type == RecordType.END]
    assert end["batch_pieces"] > 0 and "batch_pieces_lost" not in end
    summary = summarize(records)
    leaves = [st for st in summary.stack_stats.values() if st.bytes == 24]
    # Every path its own stack, each with its one 24-byte block: no stack shared, none dropped.
    assert len(leaves) == 1 << DEPTH
    assert all((st.count, st.live_count) == (1, 0) for st in leaves)
    # Distinct frames for each: the leaf's caller chain differs in at least one return address.
    assert len({summary.stacks[st.stack_id] for st in leaves}) == 1 << DEPTH
    # One of them symbolized, innermost first: leaf, then DEPTH levels of left/right, then main.
    names = [f.function for f in summary.stack_frames(leaves[0].stack_id)]
    assert names[0] == "leaf" and set(names[1:DEPTH + 1]) <= {"left", "right"} and names[DEPTH + 1] == "main", names


def test_deep_stack_keeps_innermost_256_frames_marked_truncated(compile_c, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    s = memtrace_json("malloc", "--device", "local", "--frames", "256", "--out", out, "--",
                      compile_c("many_stacks"), "deep", "300")
    assert s["covers"]["frames"] == 256
    summary = summarize(read_records(out))
    [deep] = [st for st in summary.stack_stats.values() if st.bytes == 4242]
    assert (deep.count, deep.live_count) == (1, 0)
    names = [f.function for f in summary.stack_frames(deep.stack_id)]
    # The innermost 256 return addresses: recurse's 256 own frames (300 deep), then the mark.
    assert names == ["recurse"] * 256 + ["<truncated: outer frames not walked>"], (names[:3], len(names))
    assert s["truncated_stacks"] >= 1
    # The same program at the default depth (64): the innermost 64, marked.
    s = memtrace_json("malloc", "--device", "local", "--out", tmp_path / "cap64", "--",
                      compile_c("many_stacks"), "deep", "300")
    summary = summarize(read_records(tmp_path / "cap64"))
    [deep] = [st for st in summary.stack_stats.values() if st.bytes == 4242]
    assert [f.function for f in summary.stack_frames(deep.stack_id)] == ["recurse"] * 64 + [
        "<truncated: outer frames not walked>"]
