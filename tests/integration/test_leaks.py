"""malloc --leaks on a real program with a known pattern (tests/programs/leak_pattern.c).

Every block of the pattern is tracked (>= 4096 B); the scan must sort them exactly: dropped
pointers and a two-block cycle leaked; a global array, a block held only from another tracked
block, and a sleeping thread's local variable reachable.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tests.conftest import memtrace_json, run_memtrace

LEAKED = {"leak_dropped": (5, 25000), "leak_cycle": (2, 12000)}
REACHABLE = {"keep_global": (4, 28000), "keep_nested": (1, 8000), "keep_nested_child": (1, 9000),
             "keep_on_stack": (1, 10000)}


def by_function(rows: list[dict]) -> dict[str, tuple[int, int]]:
    blocks: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    for r in rows:
        name = r["frames"][0].get("function") if r["frames"] else "(no stack)"
        blocks[name] += r["blocks"]
        nbytes[name] += r["bytes"]
    return {k: (blocks[k], nbytes[k]) for k in blocks}


def check_pattern(doc: dict, when: str) -> None:
    leaks = doc["leaks"]
    scan = leaks["scan"]
    assert scan["when"] == when
    assert scan["complete"] and scan["world_stopped"]
    assert scan["threads_stopped"] == 2 and scan["threads_not_stopped"] == 0     # main + the sleeper
    assert scan["undecided_blocks"] == 0 and scan["leaked_not_listed"] == 0
    assert by_function(leaks["leaked"]["by_stack"]) == LEAKED
    assert (leaks["leaked"]["blocks"], leaks["leaked"]["bytes"]) == (7, 37000)
    reachable = by_function(leaks["reachable"]["by_stack"])
    assert {k: reachable.get(k) for k in REACHABLE} == REACHABLE
    # Anything else reachable is the C library's own (stdout's buffer; with every block tracked, the
    # sleeper thread's TLS vector, ld.so's inlined calloc): never one of ours.
    assert not set(reachable) - set(REACHABLE) - {"_IO_file_doallocate", "calloc"}
    # Every tracked live block is in exactly one of the two.
    assert leaks["leaked"]["blocks"] + leaks["reachable"]["blocks"] == doc["live"]["count"]
    assert leaks["leaked"]["bytes"] + leaks["reachable"]["bytes"] == doc["live"]["bytes"]


def test_leak_scan_at_the_window_end_sorts_the_known_pattern(compile_c, tmp_path: Path) -> None:
    exe = compile_c("leak_pattern")
    doc = memtrace_json("malloc", "--device", "local", "--window", "3", "--leaks", "--quiet",
                        "--out", tmp_path / "cap", "--", exe, "60")
    assert doc["ended"] == "completed"
    check_pattern(doc, "window-end")
    assert doc["leaks"]["scan"]["root_bytes"] > 0
    # The saved capture shows the same, and exports the leaked view with the same totals.
    shown = json.loads(run_memtrace("show", tmp_path / "cap", "--json").stdout)
    assert shown["leaks"] == doc["leaks"]
    folded = run_memtrace("export", tmp_path / "cap", "--format", "collapsed", "--view", "leaked").stdout
    leaves = Counter()
    for ln in folded.splitlines():
        stack, value = ln.rsplit(" ", 1)
        leaves[stack.split(";")[-1].split(" ")[0]] += int(value)
    assert dict(leaves) == {k: v[1] for k, v in LEAKED.items()}


def test_leak_scan_as_the_target_exits(compile_c, tmp_path: Path) -> None:
    exe = compile_c("leak_pattern")
    doc = memtrace_json("malloc", "--device", "local", "--window", "30", "--leaks", "--quiet",
                        "--out", tmp_path / "cap", "--", exe, "0")
    assert doc["ended"] == "target-exited"
    check_pattern(doc, "exit")


def test_without_leaks_there_is_no_scan(compile_c, tmp_path: Path) -> None:
    exe = compile_c("leak_pattern")
    doc = memtrace_json("malloc", "--device", "local", "--window", "30", "--quiet",
                        "--out", tmp_path / "cap", "--", exe, "0")
    assert doc["leaks"] is None


def test_a_spent_budget_stops_the_scan_and_says_what_it_did_not_read(compile_c, tmp_path: Path) -> None:
    exe = compile_c("leak_pattern")
    # 1 GB of untouched anonymous memory: a root far larger than one slice of the scan.
    doc = memtrace_json("malloc", "--device", "local", "--window", "30", "--leaks", "--leaks-budget", "0.001",
                        "--quiet", "--out", tmp_path / "cap", "--", exe, "0", "1024")
    scan = doc["leaks"]["scan"]
    assert not scan["complete"]
    assert scan["skipped"]["not_scanned_budget"] > 0
    assert scan["root_bytes"] + scan["skipped"]["not_scanned_budget"] >= 1 << 30
    assert doc["leaks"]["leaked"]["blocks"] + doc["leaks"]["reachable"]["blocks"] == doc["live"]["count"]
