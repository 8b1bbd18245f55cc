"""The live fold's record walk (capture.iter_stacks_and_aggs): the same STACK, AGG (and ALLOC)
tuples as the checked decoder, every other record stepped over, broken framing refused."""

from __future__ import annotations

import pytest

from memtrace.capture import (
    REC_AGG,
    REC_ALLOC,
    REC_STACK,
    AggRecord,
    AllocRecord,
    CaptureError,
    FreeRecord,
    LiveRecord,
    PeakHeadRecord,
    PeakRecord,
    StackRecord,
    encode_agent_records,
    iter_agent_tuples,
    iter_stacks_and_aggs,
)
from memtrace.stacks_seen import StacksSeen


def batch() -> bytes:
    events = encode_agent_records(7, [
        StackRecord(7, 1, (0x401000, 0x402000, 0x403000)),
        *(AllocRecord(7, 0, 0, 1, 0x10000 + 64 * i, 64, 64) for i in range(50)),
        *(FreeRecord(7, 0, 0x10000 + 64 * i, 64) for i in range(50)),
        StackRecord(7, 2, tuple(0x500000 + i for i in range(64))),
        AllocRecord(7, 1, 0, 2, 0x20000, 4096, 4096),
    ])
    aggregates = encode_agent_records(0, [
        AggRecord(1, {"allocs": 50, "bytes": 3200}),
        StackRecord(0, 3, (0x600000, 0x601000)),
        PeakHeadRecord(1, 3, 4096, 1, 10),
        PeakRecord(2, 4096, 1),
        LiveRecord(2, 0x20000, 4096, 5, 0),
        AggRecord(2, {"allocs": 1, "bytes": 4096}),
    ])
    return events + aggregates


def test_walk_yields_what_the_checked_decoder_yields() -> None:
    data = batch()
    want = [r for r in iter_agent_tuples(data) if r[0] in (REC_STACK, REC_AGG)]
    assert list(iter_stacks_and_aggs(data)) == want and len(want) == 5
    with_allocs = [r for r in iter_agent_tuples(data) if r[0] in (REC_STACK, REC_AGG, REC_ALLOC)]
    assert list(iter_stacks_and_aggs(data, allocs=True)) == with_allocs and len(with_allocs) == 56
    # Without aggs the rows are stepped over: the stack after one still comes, whole.
    stacks_only = [r for r in want if r[0] == REC_STACK]
    assert list(iter_stacks_and_aggs(data, aggs=False)) == stacks_only and len(stacks_only) == 3
    raw = [(*r[:4], tuple(r[4].cast("Q"))) for r in iter_stacks_and_aggs(data, aggs=False, raw_frames=True)]
    assert raw == stacks_only


@pytest.mark.parametrize("what, mangle", [
    ("unknown type", lambda d: d[:8] + bytes([99]) + d[9:]),
    ("chunk past the end", lambda d: d[:-8]),
    ("stack past its chunk", lambda d: d[:4] + (int.from_bytes(d[4:8], "little") - 8).to_bytes(4, "little") + d[8:]),
])
def test_broken_framing_raises(what: str, mangle) -> None:  # noqa: ANN001
    with pytest.raises(CaptureError):
        list(iter_stacks_and_aggs(mangle(batch())))


def test_the_live_fold_learns_the_stacks_and_families_bytes() -> None:
    seen = StacksSeen(want_families=True)
    seen.batch(batch())
    assert seen._frames[1] == (0x401000, 0x402000, 0x403000)
    assert seen._frames[2] == tuple(0x500000 + i for i in range(64))
    assert seen._bytes[1] == 3200 and seen._bytes[2] == 4096       # from the AGG records


def test_without_families_the_batches_wait_for_the_names(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = StacksSeen(want_families=False)
    seen.batch(batch())
    assert seen.pending == []                                 # held, not read
    assert seen.symbolize(None) == []                         # no one to name them yet: only read
    every = {0x401000, 0x402000, 0x403000, 0x600000, 0x601000} | {0x500000 + i for i in range(64)}
    assert seen.pending == sorted(every)
    assert seen._bytes == {}                                  # no families: the rows were stepped over
    seen.batch(batch())                                       # the same stacks again: nothing new
    seen.symbolize(None)
    assert seen.pending == sorted(every)
    # Past HELD_MAX bytes held, a batch is read at once.
    monkeypatch.setattr("memtrace.stacks_seen.HELD_MAX", 1)
    other = StacksSeen(want_families=False)
    other.batch(batch())
    assert other.pending == sorted(every)
