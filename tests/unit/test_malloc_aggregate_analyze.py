"""The aggregate stream offline: its records round-trip, and the analyzer reads per-stack totals (the
latest wins), the composition of the latest peak, temporaries, sampled weights, pseudo stacks and the
timeline from them.  (The real core writing them: tests/integration/test_malloc_aggregate.py.)"""

from __future__ import annotations

from pathlib import Path

from memtrace import layout
from memtrace.analyze.malloc import summarize
from memtrace.capture import (
    AggRecord,
    CaptureWriter,
    LiveRecord,
    PeakHeadRecord,
    PeakRecord,
    RecordType,
    StackRecord,
    decode_agent_records,
    encode_agent_records,
    read_records,
)

COUNTERS = [0] * layout.N_COUNTERS


def counters(**values: int) -> list[int]:
    out = list(COUNTERS)
    for name, v in values.items():
        out[layout.COUNTERS[name]] = v
    return out


def body(t: int, **extra: object) -> dict[str, object]:
    return {"t": t, "mode": "aggregate", "counters": COUNTERS, "t0": 100, "clock": [5_000_000 + t * 1000, t],
            **extra}


def test_aggregate_records_round_trip() -> None:
    records = [StackRecord(0, 3, (0x10, 0x20)),
               AggRecord(3, {"allocs": 5, "bytes": 5000, "temp": 2, "sampled_weight": 1 << 40}),
               PeakHeadRecord(2, 9, 12345, 3, 777), PeakRecord(3, 12000, 2), PeakRecord(layout.NO_STACK, 345, 1),
               LiveRecord(3, 0xABC0, 4096, 17, 0)]
    assert list(decode_agent_records(encode_agent_records(0, records))) == records


def test_summary_from_totals_peak_and_samples(tmp_path: Path) -> None:
    p = tmp_path / "c.mtc"
    with CaptureWriter(p) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        w.write(RecordType.BATCH, body(200, peak={"bytes": 30000, "epoch": 4},
                                       sample={"t": 200, "tracked_bytes": 30000, "tracked_blocks": 3,
                                               "peak_bytes": 30000, "in_use": 1, "footprint": 2,
                                               "top": [[1, 20000], [2, 10000]]}),
                encode_agent_records(0, [
                    StackRecord(0, 1, (0x10,)), StackRecord(0, 2, (0x20,)),
                    AggRecord(1, {"allocs": 2, "bytes": 20000}),
                    AggRecord(2, {"allocs": 1, "bytes": 10000}),
                    PeakHeadRecord(2, 4, 30000, 3, 5_150_000), PeakRecord(1, 20000, 2), PeakRecord(2, 10000, 1)]))
        # Later: stack 1 frees both its blocks (one a temporary), stack 2 only changes its sampled figures,
        # a nested call's block is tracked without a stack; the peak did not move.
        w.write(RecordType.BATCH, {**body(300, peak={"bytes": 30000, "epoch": 4}, live_done=True),
                                   "counters": counters(temp_calls=7, temp_bytes=700, nested_calls=1,
                                                        nested_bytes=5000)},
                encode_agent_records(0, [
                    AggRecord(1, {"frees": 2, "freed_bytes": 20000, "temp": 1, "temp_bytes": 10000}),
                    AggRecord(2, {"sampled": 1, "sampled_bytes": 100, "sampled_weight": 4096, "allocs": 2,
                                  "bytes": 10100, "sampled_count_fp": 4096 * 256 // 100,
                                  "extra_weight": 3996}),
                    AggRecord(layout.NESTED_STACK, {"allocs": 1, "bytes": 5000}),
                    LiveRecord(2, 0xA000, 10000, 1, 0), LiveRecord(2, 0xB000, 100, 2, 1),
                    LiveRecord(layout.NESTED_STACK, 0xC000, 5000, 2, 0)]))
    s = summarize(read_records(p))
    assert s.aggregates and s.mode == "aggregate"
    one, two, nested = s.stack_stats[1], s.stack_stats[2], s.stack_stats[layout.NESTED_STACK]
    assert (one.count, one.bytes, one.live_count, one.live_bytes, one.temp_count) == (2, 20000, 0, 0, 1)
    assert (two.count, two.bytes, two.live_count, two.live_bytes) == (1, 10000, 2, 10100)
    assert two.est_bytes == 10000 + 4096 and round(two.est_count, 2) == round(1 + 4096 / 100, 2)
    assert two.live_est_bytes == 10100 + 3996
    assert (nested.count, nested.live_bytes) == (1, 5000)
    # Bytes on real stacks only: the nested call's block has none.
    assert s.stacked_bytes == 20000 + 10000 and (s.live_count, s.live_bytes) == (3, 15100)
    j = s.to_json()
    assert j["peak"]["bytes"] == 30000 and j["peak"]["exact"] is True and j["peak"]["t"] == 0.05
    assert [(r["stack_id"], r["bytes"], r["count"]) for r in j["peak"]["by_stack"]] == [(1, 20000, 2), (2, 10000, 1)]
    assert j["temporary"]["calls"] == 7 and j["temporary"]["by_stack"][0]["stack_id"] == 1
    assert j["nested"] == {"calls": 1, "bytes": 5000, "allocator_internal": 0, "unreconciled": 0}
    assert [r["frames"][0]["function"] for r in j["live_by_stack"] if r["stack_id"] == layout.NESTED_STACK] == [
        "<nested call: stack skipped>"]
    assert j["timeline"]["t"] == [0.1] and j["timeline"]["stacks"][0]["live"] == [20000]
    assert s.live_dump_complete and sorted(b[1] for b in s.live_blocks) == [100, 5000, 10000]


def test_a_composition_older_than_the_last_peak_is_marked_inexact(tmp_path: Path) -> None:
    p = tmp_path / "c.mtc"
    with CaptureWriter(p) as w:
        w.write(RecordType.BATCH, body(200, peak={"bytes": 100, "epoch": 1}),
                encode_agent_records(0, [AggRecord(1, {"allocs": 1, "bytes": 100}),
                                         PeakHeadRecord(1, 1, 100, 1, 5_100_000), PeakRecord(1, 100, 1)]))
        # The target died: its last peak (epoch 2) was never composed.
        w.write(RecordType.BATCH, body(300, peak={"bytes": 300, "epoch": 2}),
                encode_agent_records(0, [AggRecord(1, {"allocs": 2, "bytes": 300})]))
    s = summarize(read_records(p))
    assert s.peak is not None and (s.peak.bytes, s.peak.exact) == (100, False)


def test_a_first_frame_in_no_module_is_kept_and_says_unknown(tmp_path: Path) -> None:
    """JIT code, an anonymous executable mapping: the frame is shown as ``0x... (unknown)``, never
    dropped.  Captures of agents before the core put the real caller in place of a trampoline's
    return address still have that leading frame cut."""
    from memtrace.analyze.malloc import summarize as fold
    from memtrace.capture import AllocRecord, CaptureWriter, RecordType, StackRecord, encode_agent_records
    from memtrace.capture import read_records as read

    jit, app = 0x7F00DEAD0010, 0x555500001040
    for exact in (True, False):
        path = tmp_path / f"c{exact}.mtc"
        with CaptureWriter(path) as w:
            w.write(RecordType.META, {"tool": "memtrace", "tracer": "malloc", "target": {"label": "jit"}})
            w.write(RecordType.RECON, {"symbols": [], "info": {"callerFrame": "exact"} if exact else {}})
            w.write(RecordType.MODULES, {"modules": [{"name": "app", "path": "/app", "base": hex(0x555500000000),
                                                      "size": 0x10000}]})
            w.write(RecordType.SYMBOLS, {"rows": [[hex(app), "app", app - 0x555500000000, "main", None, None]],
                                         "by": "synthetic"})
            counters = [0] * layout.N_COUNTERS
            counters[layout.C_CALLS + layout.KINDS["malloc"]] = 1
            counters[layout.C_BYTES + layout.KINDS["malloc"]] = 4096
            data = encode_agent_records(1, [StackRecord(1, 1, (jit, app)),
                                            AllocRecord(1, 0, 1, 1, 0x1000, 4096, 4096)])
            w.write(RecordType.BATCH, {"type": "events:batch", "counters": counters}, data)
            w.write(RecordType.END, {"ended": "completed", "reason": "test", "evidence": {}})
        frames = fold(read(path)).stack_rows(1)[0].frames
        names = [f.name() for f in frames]
        assert names == (["0x7f00dead0010 (unknown)", "main (app)"] if exact else ["main (app)"]), names


def test_rows_group_stacks_by_their_symbolized_frames(tmp_path: Path) -> None:
    """Stack ids whose frames read the same (two call sites on one line; one inlined call expanded
    the same way) are one row; a stack cut by the core, or one frame more, is a row of its own;
    only the rows a table returns are symbolized, each with its first stack id's frames."""
    p = tmp_path / "c.mtc"
    cut = layout.TRUNCATED_FRAME
    with CaptureWriter(p) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "t"}})
        w.write(RecordType.MODULES, {"modules": [{"name": "prog", "path": "/prog", "base": "0x1000", "size": 4096}]})
        w.write(RecordType.SYMBOLS, {"by": "host", "rows": [
            ["0x1010", "prog", 16, "work", "w.c", 7], ["0x1018", "prog", 24, "work", "w.c", 7],
            ["0x1020", "prog", 32, "main", "m.c", 3, [["helper", "h.h", 9]]],
            ["0x1028", "prog", 40, "main", "m.c", 3, [["helper", "h.h", 9]]],
            ["0x1030", "prog", 48, "main", "m.c", 4]]})
        w.write(RecordType.BATCH, body(200), encode_agent_records(0, [
            StackRecord(0, 1, (0x1010, 0x1020)), StackRecord(0, 2, (0x1018, 0x1028)),
            StackRecord(0, 3, (0x1010, 0x1020, cut)), StackRecord(0, 4, (0x1010, 0x1030)),
            StackRecord(0, 5, (0x1010,)),
            AggRecord(1, {"allocs": 1, "bytes": 100}), AggRecord(2, {"allocs": 2, "bytes": 300}),
            AggRecord(3, {"allocs": 1, "bytes": 50}), AggRecord(4, {"allocs": 1, "bytes": 1000}),
            AggRecord(5, {"allocs": 1, "bytes": 10})]))
    s = summarize(read_records(p))
    rows = s.stack_rows(None)
    assert [(r.stack_ids, r.est_bytes, r.count) for r in rows] == [([4], 1000, 1), ([1, 2], 400, 3), ([3], 50, 1),
                                                                   ([5], 10, 1)]
    assert [f.function for f in rows[1].frames] == ["work", "helper", "main"]
    assert [f.address for f in rows[1].frames] == [0x1010, 0x1020, 0x1020]      # stack 1's, the first id
    assert rows[2].frames[-1].function == "<truncated: outer frames not walked>"
    top = s.stack_rows(1)
    assert [(r.stack_ids, [f.function for f in r.frames]) for r in top] == [([4], ["work", "main"])]
    by_calls = s.stack_rows(2, order=lambda r: (-r.count, min(r.stack_ids)))
    assert [r.stack_ids for r in by_calls] == [[1, 2], [3]]
    # Symbols that arrive later change the rows: a new line for 0x1018 splits stacks 1 and 2.
    s.symbols.add_rows([["0x1018", "prog", 24, "work", "w.c", 8]])
    assert [r.stack_ids for r in s.stack_rows(None)] == [[4], [2], [1], [3], [5]]
