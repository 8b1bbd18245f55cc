"""Complete by default (issue 21) and no silent thread ceiling (issue 27): on a local target every
allocation gets a stack and every block is tracked, so the peak, the live set and their stacks
cover small blocks too; threads past the slot table are still counted exactly, and the summary
says what lost its stack.  Real programs on Frida's local device, exact numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import RecordType, read_records

from ..conftest import memtrace_json, run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


def rows_by_function(rows: list[dict]) -> dict[str, tuple[int, int]]:
    """(bytes, count) per innermost function."""
    out: dict[str, tuple[int, int]] = {}
    for r in rows:
        name = r["frames"][0]["function"] if r["frames"] else "(no stack)"
        b, c = out.get(name, (0, 0))
        out[name] = (b + r["bytes"], c + r["count"])
    return out


@pytest.mark.smoke
def test_default_peak_counts_every_small_block_with_its_stack(compile_c, tmp_path: Path) -> None:
    s = memtrace_json("malloc", "--device", "local", "--out", tmp_path / "cap", "--", compile_c("small_peak"))
    assert s["covers"]["complete"] is True
    assert (s["covers"]["stack_threshold"], s["covers"]["live_threshold"], s["covers"]["frames"]) == (0, 0, 64)
    # 200,000 blocks of 64 B plus the 1.6 MB array that holds them: the layered default saw 0 B of it.
    peak = s["peak"]
    assert (peak["bytes"], peak["count"], peak["exact"]) == (200_000 * 64 + 200_000 * 8, 200_001, True)
    assert rows_by_function(peak["by_stack"]) == {"hold_small": (200_000 * 64 + 200_000 * 8, 200_001)}
    # What is left at the end: the three 100-byte blocks, by their stack.
    assert s["live"]["count"] == 3 and s["live"]["bytes"] == 300
    assert rows_by_function(s["live_by_stack"]) == {"keep_small": (300, 3)}
    assert s["coverage"]["stack_coverage"] == 1.0
    assert all(v == 0 for v in s["dropped"].values())
    # The core came from the host's compiled assembly (agentbuild.precompiled_cmodule), not a compile
    # in the target -- under the hold before constructors too (the assembler gets the program's
    # environment back: runtime/process.js withCompilerEnv).
    recon = next(r.body for r in read_records(tmp_path / "cap") if r.type == RecordType.RECON)
    info = recon["info"]
    assert recon["hold"] == {"held": True}, recon["hold"]
    assert info["toolchain"] == "external" and info["precompiled"] is True, info


def test_every_live_block_of_a_sparse_heap_is_found_at_the_end(compile_c, tmp_path: Path) -> None:
    """The final drain walks the live table page run by page run (untouched runs stepped over whole):
    every block still live is shipped as a LIVE record -- 200 small blocks spread over ~16 MB of heap
    and 8 large mapped ones -- with its size and stack, as many as the rows say."""
    s = memtrace_json("malloc", "--device", "local", "--out", tmp_path / "cap", "--", compile_c("sparse_live"))
    big = sum((i + 1) << 20 for i in range(8))
    by_function = rows_by_function(s["live_by_stack"])
    assert by_function["spread_small"] == (200 * 64, 200)
    assert by_function["spread_big"] == (big, 8)
    summary = summarize(read_records(tmp_path / "cap"))
    records = summary.live_blocks
    assert (len(records), sum(r[1] for r in records)) == (s["live"]["count"], s["live"]["bytes"])
    sizes = sorted(r[1] for r in records)
    assert sizes.count(64) >= 200 and [z for z in sizes if z >= 1 << 20] == [(i + 1) << 20 for i in range(8)]


def test_layered_capture_on_request_says_what_it_covers(compile_c, tmp_path: Path) -> None:
    proc = run_memtrace("malloc", "--device", "local", "--stack-threshold", "8192", "--live-threshold", "4096",
                        "--out", tmp_path / "cap", "--", compile_c("small_peak"))
    text = " ".join(proc.stdout.split())
    assert "covers: stacks for allocations of 8.0 KB and up, blocks of 4.0 KB and up tracked" in text, text
    proc = run_memtrace("malloc", "--device", "local", "--out", tmp_path / "cap2", "--", compile_c("small_peak"))
    assert "covers: every allocation stacked, every block tracked" in " ".join(proc.stdout.split())


def _many_threads_counted(compile_c, out: Path, threads: int, pairs: int) -> dict:
    """many_threads: each thread makes `pairs` malloc(64)/free pairs and keeps one malloc(100),
    every one with its stack -- counted exactly, and only the kept blocks live at the end."""
    s = memtrace_json("malloc", "--device", "local", "--out", out, "--",
                      compile_c("many_threads"), str(threads), str(pairs), timeout=300)
    assert s["ended"] == "target-exited"
    assert rows_by_function(s["top_stacks"])["thread_allocs"] == (threads * (pairs * 64 + 100), threads * (pairs + 1))
    assert rows_by_function(s["live_by_stack"])["thread_allocs"] == (threads * 100, threads)
    return s


def test_crowded_thread_arenas_are_all_tracked(compile_c, tmp_path: Path) -> None:
    """8 threads each holding 300,000 blocks of 24 B at once: glibc gives each thread an arena, a
    64 MiB heap on a 64 MiB boundary dense with small blocks, and those dense stretches land on the
    same live-table buckets.  With 8 ways a bucket and no second place, 1.2 M of the 2.4 M blocks
    were untracked (the peak short by as much); a crowded bucket now sends a block to its alternate
    (cmodule/core.c, mt_live_alt), and every block is tracked, with its stack."""
    threads, blocks = 8, 300_000
    s = memtrace_json("malloc", "--device", "local", "--out", tmp_path / "cap", "--",
                      compile_c("crowded_arenas"), str(threads), str(blocks), timeout=300)
    assert s["ended"] == "target-exited"
    assert s["dropped"]["live_table_full"] == 0
    held = rows_by_function(s["peak"]["by_stack"])["hold_crowded"]
    # At the barrier every thread holds its blocks and its array of them.
    assert held == (threads * blocks * (24 + 8), threads * (blocks + 1))
    assert rows_by_function(s["top_stacks"])["hold_crowded"] == held
    assert "hold_crowded" not in rows_by_function(s["live_by_stack"])


def test_the_main_thread_keeps_glibc_main_arena(compile_c, tmp_path: Path) -> None:
    """The thread that loads the agent makes the process's first malloc call, so glibc handed it the
    main arena, and it ended without giving it back: the program's main thread then got an arena of
    its own, an mmap'd heap grown a page at a time by mprotect (3,106 calls in bench_real's C++
    program), which it never has natively.  The core hands the main thread the main arena on its
    first call (cmodule/core.c, mt_adopt_main_arena); a second thread still gets an arena of its own,
    as natively -- and every block is still counted and tracked."""
    exe = compile_c("main_arena")
    native = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.strip()
    assert native == "main_arena main=main thread=other"
    proc = run_memtrace("malloc", "--device", "local", "--json", "--out", tmp_path / "cap", "--", exe)
    assert native in proc.stderr          # with --json the target's stdout goes to stderr
    s = json.loads(proc.stdout)
    assert s["peak"]["bytes"] == 64 + 20_000 * 200 and s["peak"]["exact"] is True
    assert rows_by_function(s["top_stacks"])["main"] == (64 + 20_000 * 200, 20_001)


def test_two_thousand_threads_alive_at_once_all_counted(compile_c, tmp_path: Path) -> None:
    s = _many_threads_counted(compile_c, tmp_path / "cap", 2000, 10)
    assert s["dropped"]["unslotted_calls"] == 0
    # 2000 threads interning their first stacks at once on a busy machine may outwait the stack
    # lock's bound (never a hang): such a stack is dropped and counted, and there are few.
    assert s["dropped"]["dropped_stacks"] <= 20


def test_more_threads_than_lanes_count_every_pair_of_every_stack(compile_c, tmp_path: Path) -> None:
    """32 threads, 8 lanes: the threads past the lanes shared a lane with a thread that owned it and
    added without a lock prefix, so a locked add landing inside the owner's load and store was lost
    -- the malloc(64) stack read 3,199,951 of its 3,200,000 calls and ~1,000 of its blocks stayed
    "live" at exit.  Shared lanes are now never owned (cmodule/core.c, mt_shared_lane)."""
    _many_threads_counted(compile_c, tmp_path / "cap", 32, 100000)


@pytest.mark.slow
def test_threads_past_the_slot_table_are_counted_and_said(compile_c, tmp_path: Path) -> None:
    exe = compile_c("many_threads")
    full = memtrace_json("malloc", "--device", "local", "--out", tmp_path / "a", "--", exe, "300", "10",
                         timeout=300)
    few = memtrace_json("malloc", "--device", "local", "--thread-slots", "64", "--out", tmp_path / "b", "--",
                        exe, "300", "10", timeout=300)
    # Every allocation counted exactly, by kind, bytes and size tier, however many threads had no
    # slot: 11 mallocs a thread and stdout's buffer (uprobes on glibc's malloc count 3,301 natively).
    # (Frees are not compared: glibc's own thread-exit frees depend on the timing of thread exits.)
    for kind in ("malloc", "calloc", "realloc"):
        assert few["calls"][kind] == full["calls"][kind], kind
    assert few["calls"]["malloc"] == 300 * 11 + 1
    assert few["gross_bytes"] == full["gross_bytes"] and few["tiers"] == full["tiers"]
    assert few["calls"]["free"] >= 300 * 10
    # At most 64 threads (the main thread among them) had slots: the others' calls are said.
    unslotted = few["dropped"]["unslotted_calls"]
    assert unslotted >= (300 - 64) * (11 + 10)
    assert few["dropped"]["dropped_stacks"] >= (300 - 64) * 11
    # Their blocks are still tracked (the live set is whole), under the dropped-stack row.  glibc's
    # thread-exit frees (above) may leave a block or two more or less live in one run: the two live
    # sets differ by no more than the two runs' frees do, and every thread's kept block is live.
    assert abs(few["live"]["count"] - full["live"]["count"]) <= abs(full["calls"]["free"] - few["calls"]["free"]), (
        few["live"], full["live"], few["calls"], full["calls"])
    assert rows_by_function(full["live_by_stack"])["thread_allocs"] == (300 * 100, 300)
    assert few["live"]["count"] >= 300 and few["live"]["bytes"] >= 300 * 100
    proc = run_memtrace("malloc", "--device", "local", "--thread-slots", "64", "--out", tmp_path / "c", "--",
                        exe, "300", "10", timeout=300)
    assert "unslotted_calls" in proc.stdout and "dropped: nothing" not in proc.stdout


@pytest.mark.parametrize("frames", [None, 16])
def test_a_deeper_stack_keeps_its_innermost_frames_and_is_marked(compile_c, tmp_path: Path,
                                                                  frames: int | None) -> None:
    opts = ["--frames", str(frames)] if frames else []
    s = memtrace_json("malloc", "--device", "local", *opts, "--out", tmp_path / "cap", "--",
                      compile_c("deep_stack"), "100")
    (row,) = [r for r in s["live_by_stack"] if r["frames"] and r["frames"][0]["function"] == "alloc_deep"]
    names = [f["function"] for f in row["frames"]]
    walked = frames or 64
    # alloc_deep, then recurse x (walked - 1), then the mark: the outer 40-odd frames and main are cut.
    assert names == ["alloc_deep"] + ["recurse"] * (walked - 1) + ["<truncated: outer frames not walked>"]
    assert s["truncated_stacks"] >= 1
