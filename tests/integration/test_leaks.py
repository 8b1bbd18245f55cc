"""malloc --leaks on a real program with a known pattern (tests/programs/leak_pattern.c).

The scan must sort the pattern's blocks exactly: dropped pointers and a two-block cycle leaked; a
global array, a block held only from another block, and a sleeping thread's local variable
reachable.  (tests/integration/test_leak_parity.py holds memtrace against valgrind.)
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import memtrace_json, run_memtrace

from memtrace import layout

from .malloc_agent import HeldAgent, malloc_agent_in

LEAKED = {"leak_dropped": (5, 25000), "leak_cycle": (2, 12000)}
REACHABLE = {"keep_global": (4, 28000), "keep_nested": (1, 8000), "keep_nested_child": (1, 9000),
             "keep_on_stack": (1, 10000)}


def by_function(rows: list[dict]) -> dict[str, tuple[int, int]]:
    blocks: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    for r in rows:
        name = "(before tracing)" if r.get("allocated_before_tracing") else \
            r["frames"][0].get("function") if r["frames"] else "(no stack)"
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
    # Anything else reachable is the C library's own (stdout's buffer, blocks from before the hooks
    # went in, threads' DTVs): never one of ours.
    assert not set(reachable) - set(REACHABLE) - {"_IO_file_doallocate", "(before tracing)", "calloc"}
    # Every block the scan examined has exactly one verdict, and every tracked live block was examined.
    verdicts = ("definitely_lost", "indirectly_lost", "possibly_lost", "reachable")
    assert sum(leaks[v]["blocks"] for v in verdicts) + scan["frida_own_blocks"] == scan["examined"]
    assert scan["every_block_examined"] and scan["not_examined"] == {"over_capacity": 0, "undecided_darwin_logger": 0}
    assert scan["examined"] - scan["before_tracing_blocks"] == scan["tracked_blocks"] == doc["live"]["count"]


@pytest.mark.slow
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


@pytest.mark.slow
def test_leak_scan_as_the_target_exits(compile_c, tmp_path: Path) -> None:
    exe = compile_c("leak_pattern")
    doc = memtrace_json("malloc", "--device", "local", "--window", "30", "--leaks", "--quiet",
                        "--out", tmp_path / "cap", "--", exe, "0")
    assert doc["ended"] == "target-exited"
    check_pattern(doc, "exit")


@pytest.mark.slow
def test_without_leaks_there_is_no_scan(compile_c, tmp_path: Path) -> None:
    exe = compile_c("leak_pattern")
    doc = memtrace_json("malloc", "--device", "local", "--window", "30", "--quiet",
                        "--out", tmp_path / "cap", "--", exe, "0")
    assert doc["leaks"] is None


@pytest.mark.slow
def test_a_spent_budget_stops_the_scan_and_says_what_it_did_not_read(compile_c, tmp_path: Path) -> None:
    exe = compile_c("leak_pattern")
    # 1 GB of untouched anonymous memory: a root far larger than one slice of the scan.
    doc = memtrace_json("malloc", "--device", "local", "--window", "30", "--leaks", "--leaks-budget", "0.001",
                        "--quiet", "--out", tmp_path / "cap", "--", exe, "0", "1024")
    scan = doc["leaks"]["scan"]
    assert not scan["complete"]
    assert scan["skipped"]["not_scanned_budget"] > 0
    assert scan["root_bytes"] + scan["skipped"]["not_scanned_budget"] + scan["skipped"]["never_touched_pages"] >= 1 << 30
    assert sum(doc["leaks"][v]["blocks"] for v in ("definitely_lost", "indirectly_lost", "possibly_lost", "reachable")) \
        + scan["frida_own_blocks"] == scan["examined"]
    assert not scan["every_block_examined"]


def test_the_scan_does_not_show_in_the_targets_counts(compile_c, tmp_path: Path) -> None:
    """The scan's own work (listing threads and ranges, stopping the world) makes no malloc-family
    call the target's counts would show: the same window counts the same calls with and without it."""
    exe = compile_c("leak_pattern")
    counts = []
    for extra in ((), ("--leaks",)):
        doc = memtrace_json("malloc", "--device", "local", "--window", "3", *extra, "--quiet",
                            "--out", tmp_path / f"cap{len(extra)}", "--", exe, "60")
        counts.append(doc["calls"])
    assert counts[1] == counts[0]
    assert counts[0]["malloc"] > 0


@pytest.fixture(params=["internal", "external"])
def malloc_agent(compile_c, request) -> Iterator[HeldAgent]:
    """The malloc agent, started with every call stacked (as --leaks has it), in leak_pattern held
    at its first instruction: the program itself makes no call, so any counted call is someone else's."""
    with malloc_agent_in([compile_c("leak_pattern"), "60"], request.param,
                         liveThreshold=0, stackThreshold=0, frames=16) as agent:
        yield agent


def test_fridas_own_threads_never_count_as_the_targets(malloc_agent) -> None:
    """A thread Frida starts after the hooks are in (Process.enumerateThreads reads registers from
    one, which callocs, reallocs and frees with the target's malloc: 3 listings were counted as the
    program's 3 callocs, 6 reallocs and 51 frees) is Frida's: its calls pass through as memtrace's
    own (own_calls), never in the target's counts.  The same holds for Frida's threads from before the hooks (a GLib pool worker
    freeing its cache as it exits: test_fridas_idle_threads_exiting_count_nothing)."""
    api = malloc_agent.api
    api.start()
    own = api.frida_threads()
    assert own["threads"] >= 2 and own["code_ranges"] >= 1     # the loader and JavaScript threads at least
    before = malloc_agent.counters()
    api.list_threads_through_frida(5)
    after = malloc_agent.counters()
    calls = {k: after[layout.C_CALLS + v] - before[layout.C_CALLS + v] for k, v in layout.KINDS.items()}
    assert calls == dict.fromkeys(layout.KINDS, 0)
    nested, own_calls = layout.COUNTERS["nested_calls"], layout.COUNTERS["own_calls"]
    assert after[nested] == before[nested]
    assert after[own_calls] - before[own_calls] >= 5 * 10    # the helper thread's calls did go through the hooks


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("malloc_agent", ["external"], indirect=True)
def test_fridas_idle_threads_exiting_count_nothing(malloc_agent) -> None:
    """GLib's pool workers in Frida's agent exit after 15 s idle; glibc then frees each one's tcache
    with the target's free (12 and 6 calls, 3 runs in 3, counted as the program's, which never calls
    free: the 6 frees --leaks once showed when its window outlasted 15 s).  They are Frida's: nothing
    counts, and the agent forgets their ids once they have exited (ids wrap at pid_max)."""
    api = malloc_agent.api
    api.start()
    before = malloc_agent.counters()
    deadline = time.monotonic() + 60
    while api.frida_threads()["forgotten"] == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert api.frida_threads()["forgotten"] >= 1
    after = malloc_agent.counters()
    calls = {k: after[layout.C_CALLS + v] - before[layout.C_CALLS + v] for k, v in layout.KINDS.items()}
    assert calls == dict.fromkeys(layout.KINDS, 0)
    own_calls = layout.COUNTERS["own_calls"]
    assert after[own_calls] - before[own_calls] >= 1     # its exit's frees did go through the hooks, as own


def test_pages_never_touched_are_not_read(compile_c, tmp_path: Path) -> None:
    """1 GB of anonymous memory mapped and never touched: the scan reads none of it (it would fault
    every page in), says so, and still sorts the pattern exactly."""
    exe = compile_c("leak_pattern")
    doc = memtrace_json("malloc", "--device", "local", "--window", "3", "--leaks", "--quiet",
                        "--out", tmp_path / "cap", "--", exe, "60", "1024")
    scan = doc["leaks"]["scan"]
    assert scan["complete"]
    assert scan["skipped"]["never_touched_pages"] >= 1 << 30
    assert scan["root_bytes"] < 64 << 20
    assert by_function(doc["leaks"]["leaked"]["by_stack"]) == LEAKED
