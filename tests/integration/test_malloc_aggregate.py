"""The aggregate core on real programs: the peak and what held it, the live set by stack, temporary
allocations, a 4-thread storm with every allocation stacked, each call counted as its own kind
(signal handlers included), the timeline, the live table at the end, and --events.  Exact numbers."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import AllocRecord, FreeRecord, RecordType, decode_agent_records, read_records

from ..conftest import memtrace_json, run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

MIB = 1024 * 1024


def by_function(rows: list[dict], key: str = "bytes") -> dict[str, tuple[int, int]]:
    """(count, bytes) per innermost function, rows of one function (several call sites) summed."""
    out: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for r in rows:
        name = r["frames"][0]["function"] if r["frames"] else "(no stack)"
        out[name] += r[key]
        counts[name] += r["count" if "count" in r else "calls"]
    return {name: (counts[name], out[name]) for name in out}


@pytest.mark.slow
def test_peak_of_a_burst_freed_at_once_and_the_live_set_by_stack(compile_c, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    s = memtrace_json("malloc", "--device", "local", "--top", "20", "--out", out, "--", compile_c("burst"), "150")
    assert s["ended"] == "target-exited" and s["mode"] == "aggregate"
    # 64 MiB allocated and freed within a millisecond, between two drains: the peak still has it.
    peak = s["peak"]
    assert (peak["bytes"], peak["held_bytes"], peak["count"], peak["exact"]) == (68 * MIB, 68 * MIB, 68, True)
    assert by_function(peak["by_stack"]) == {"burst_block": (64, 64 * MIB), "keep_early": (4, 4 * MIB)}
    assert peak["t"] is not None and peak["t"] > 0
    assert s["live"] == {"count": 6, "bytes": 4 * MIB + 512 * 1024, "estimated_bytes": 4 * MIB + 512 * 1024}
    assert by_function(s["live_by_stack"]) == {"keep_early": (4, 4 * MIB), "keep_late": (2, 512 * 1024)}
    assert by_function(s["top_stacks"]) == {"burst_block": (64, 64 * MIB), "small_burst": (16, 16 * MIB),
                                            "keep_early": (4, 4 * MIB), "keep_late": (2, 512 * 1024)}
    assert all(v == 0 for v in s["dropped"].values())
    # The live table itself, shipped at the end, holds exactly those blocks.
    summary = summarize(read_records(out))
    assert summary.live_dump_complete
    dumped = Counter()
    for _ptr, size, sid, _tick in summary.live_blocks:
        dumped[summary.stack_frames(sid)[0].function] += size
    assert dumped == {"keep_early": 4 * MIB, "keep_late": 512 * 1024}


@pytest.mark.slow
def test_timeline_samples_the_tracked_bytes_at_every_drain(compile_c, tmp_path: Path) -> None:
    s = memtrace_json("malloc", "--device", "local", "--out", tmp_path / "cap", "--", compile_c("burst"), "400")
    tl = s["timeline"]
    n = len(tl["t"])
    assert n >= 5, "a 1.2 s run drained every 100 ms"
    assert all(len(tl[k]) == n for k in ("tracked_bytes", "tracked_blocks", "peak_bytes", "in_use", "footprint"))
    assert tl["t"] == sorted(tl["t"])
    assert all(p <= 68 * MIB for p in tl["peak_bytes"]) and tl["peak_bytes"][-1] == 68 * MIB
    # keep_early's 4 MiB alone before keep_late; 4.5 MiB at the end.  The burst lasts well under a
    # millisecond and seldom meets a sample -- but a loaded machine can preempt it mid-way and a
    # drain then samples it (seen once beside hook storms): never above the peak, whole MiBs of it
    # (with keep_late's 512 KiB once small_burst runs).
    assert 4 * MIB in tl["tracked_bytes"]
    assert tl["tracked_bytes"][-1] == 4 * MIB + 512 * 1024 and tl["tracked_blocks"][-1] == 6
    assert all(b <= 68 * MIB and b % MIB in (0, 512 * 1024) for b in tl["tracked_bytes"]), tl["tracked_bytes"]
    # The footprint at every drain; the allocator's own in-use count wherever it was sampled: from a
    # second after the first sample on (a fast-growing heap's early read cost a short program 5 %),
    # then at every drain unless a read was slow, which backs the sampling off (malloc.js
    # sampledInUse: null until then).
    assert all(x is not None and x > 0 for x in tl["footprint"])
    read = [i for i, x in enumerate(tl["in_use"]) if x is not None]
    assert read and all(tl["in_use"][i] > 0 for i in read), tl["in_use"]
    assert tl["t"][read[0]] - tl["t"][0] >= 0.99, (tl["t"], tl["in_use"])
    series = {st["frames"][0]["function"]: st["live"] for st in tl["stacks"]}
    assert series["keep_early"][-1] == 4 * MIB
    # The peak is placed between the drain before it and the first drain that saw it (no clock is
    # read where it is raised): between those two samples, 10 ms either side for the clocks' reads.
    first = tl["peak_bytes"].index(68 * MIB)
    assert first > 0, "the burst came after keep_early's first drain"
    assert tl["t"][first - 1] - 0.01 <= s["peak"]["t"] <= tl["t"][first] + 0.01, (s["peak"]["t"], tl["t"])


@pytest.mark.slow
def test_temporary_allocations_counted_by_stack(compile_c, tmp_path: Path) -> None:
    s = memtrace_json("malloc", "--device", "local", "--stack-threshold", "0", "--top", "20",
                      "--out", tmp_path / "cap", "--", compile_c("temporaries"))
    temp = s["temporary"]
    by = by_function(temp["by_stack"])
    assert by == {"temp_pairs": (1000, 64000), "realloc_chain": (3, 100 + 200 + 300)}
    assert (temp["calls"], temp["bytes"]) == (1003, 64000 + 600)


@pytest.mark.slow
def test_four_threads_every_allocation_stacked_nothing_dropped(compile_c, tmp_path: Path) -> None:
    n = 250_000
    s = memtrace_json("malloc", "--device", "local", "--stack-threshold", "0", "--live-threshold", "0",
                      "--window", "120", "--out", tmp_path / "cap", "--", compile_c("threads"), str(n), timeout=300)
    assert s["ended"] == "target-exited"
    assert s["coverage"]["stacked_bytes"] == s["gross_bytes"] and s["coverage"]["stack_coverage"] == 1.0
    assert all(v == 0 for v in s["dropped"].values()), s["dropped"]
    rows = [r for r in s["top_stacks"] if r["frames"][0]["function"] == "thread_worker"]
    assert sorted((r["count"], r["bytes"]) for r in rows) == [(4, 4 * 16384), (4 * n, 4 * n * 64)]
    # Every pair is temporary: freed before the thread's next allocation.
    temp = by_function(s["temporary"]["by_stack"])
    assert temp["thread_worker"] == (4 * n + 4, 4 * n * 64 + 4 * 16384)
    assert not [r for r in s["live_by_stack"] if r["frames"][0]["function"] == "thread_worker"]


@pytest.mark.slow
def test_a_peak_between_threads_is_high_by_no_more_than_their_credit(compile_c, tmp_path: Path) -> None:
    # keeper frees 100 x 32 B, then spender's 1 MiB makes the peak: keeper's frees may still be its
    # credit (kept out of the shared total so that threads do not fight over it), the peak high by
    # at most 4 KiB a thread -- never low -- while the composition at that instant, the timeline and
    # the live set are exact.
    s = memtrace_json("malloc", "--device", "local", "--out", tmp_path / "cap", "--", compile_c("credit_peak"))
    assert s["ended"] == "target-exited"
    peak = s["peak"]
    composition = by_function(peak["by_stack"])
    assert composition.pop("spender_block") == (1, MIB), peak["by_stack"]
    assert "keeper_small" not in composition and "keeper_kept" not in composition
    held = sum(r["bytes"] for r in peak["by_stack"])
    assert peak["held_bytes"] == held <= peak["bytes"] <= held + 4096, (peak["bytes"], held)
    assert by_function(s["live_by_stack"])["keeper_kept"] == (1, 2048)
    # Sampled after the peak (keeper's credit not in the total yet for most of them): exact.
    tl, live = s["timeline"], s["live"]["bytes"]
    after = [b for t, b in zip(tl["t"], tl["tracked_bytes"], strict=True) if t > peak["t"] + 0.06]
    assert len(after) >= 2 and after[-1] == live, (after, live)
    assert all(b in (live - 2048, live) for b in after), (after, live)


@pytest.mark.slow
def test_each_kind_as_itself(compile_c, tmp_path: Path) -> None:
    """reallocarray is hooked (and its release seen); realloc(NULL, n) and reallocarray's own realloc
    are glibc's inside the entry, not calls of the program's; aligned_alloc is memalign's address in
    glibc, yet each call is counted as the name its caller used."""
    s = memtrace_json("malloc", "--device", "local", "--stack-threshold", "0", "--top", "20",
                      "--out", tmp_path / "cap", "--", compile_c("kinds"))
    calls = s["calls"]
    assert (calls["reallocarray"], calls["realloc"], calls["malloc"]) == (2, 1, 0)
    assert (calls["aligned_alloc"], calls["memalign"]) == (3, 2)
    assert s["nested"]["allocator_internal"] == 4
    assert s["gross_bytes"] == 1000 + 2000 + 5000 + 5 * 8192
    assert s["live"]["count"] == 0, "every release was seen, reallocarray's included"
    assert by_function(s["top_stacks"])["use_reallocarray"] == (2, 3000)


@pytest.mark.parametrize("opts", [[], ["--stack-threshold", "0", "--live-threshold", "0"]],
                         ids=["default", "every-allocation-stacked"])
@pytest.mark.slow
def test_signal_handler_allocations_counted_exactly(compile_c, tmp_path: Path, opts: list[str]) -> None:
    # The counts are exact only if the capture saw the whole run: a window that ends mid-storm
    # (memtrace detaches; the target then finishes untraced and still prints its totals) leaves
    # them short with nothing dropped -- a load-dependent failure (10,790,398 of 20,000,001 once)
    # that was the window, not lost calls.  So: a window and a silence limit no load reaches
    # (~5 s of storm on 2 idle CPUs; the per-test timeout bounds a hang), and the ending checked first.
    proc = run_memtrace("malloc", "--device", "local", "--json", *opts, "--window", "240", "--rpc-timeout", "120",
                        "--out", tmp_path / "cap", "--", compile_c("signals"), timeout=300)
    import json

    s = json.loads(proc.stdout)
    assert s["ended"] == "target-exited", s["reason"]
    m = re.search(r"main_pairs (\d+) handler_calls (\d+)", proc.stderr)
    assert m, proc.stderr
    main_pairs, handler = int(m.group(1)), int(m.group(2))
    assert handler > 0
    assert s["calls"]["malloc"] == main_pairs
    assert s["calls"]["calloc"] == handler
    assert s["tiers"][1]["calls"] == handler          # 257 B - 1 KB: the handler's calloc(1, 1000) only
    assert s["calls"]["free"] >= main_pairs + handler
    assert all(v == 0 for v in s["dropped"].values())
    assert s["live"]["count"] == 0, "a free made in a handler still leaves the live table"
    if opts:
        # With every block tracked, the storm spends its time in the tracking path: handlers land there,
        # are counted as nested calls and shown, their stacks skipped.
        assert s["nested"]["calls"] > 0 and s["nested"]["bytes"] % 1000 == 0


@pytest.mark.slow
def test_events_mode_streams_every_tracked_event_and_agrees(compile_c, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    s = memtrace_json("malloc", "--device", "local", "--events", "--stack-threshold", "4096",
                      "--live-threshold", "4096", "--top", "20", "--out", out, "--", compile_c("pattern"))
    assert s["mode"] == "events"
    allocs = frees = 0
    for rec in read_records(out):
        if rec.type == RecordType.BATCH and rec.data:
            for r in decode_agent_records(rec.data):
                allocs += isinstance(r, AllocRecord)
                frees += isinstance(r, FreeRecord)
    # pattern.c's allocations of at least 4096 B: 1000 x 4 KB, 10 x 100000, 20 callocs, realloc's 16384
    # and 65536, 5 posix_memalign; all but the 415 live ones freed.
    assert (allocs, frees) == (1037, 1037 - 415)
    assert s["live"]["count"] == 415
    assert s["dropped"]["dropped_records"] == 0
