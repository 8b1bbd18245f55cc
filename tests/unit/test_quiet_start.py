"""A short local target's quiet start (capture_loop.CaptureLoop._start_quiet / _end_quiet): the
batches the writer holds carry their STACK_TAIL records unexpanded (capture.DeferredBytes), and
once released the capture -- every STACK record whole, in order -- and the addresses queued for
names are those of a loop that wrote each batch as it came; an interrupt while the held records
are written loses none of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memtrace import layout, tracers
from memtrace.capture import CaptureWriter, RecordType, StackRecord, decode_agent_records, read_records
from memtrace.capture_loop import CaptureLoop, CaptureOptions
from memtrace.target import TargetSpec

from .test_stack_tails import chunk, full, tail

OUTER = [0x4000 + i for i in range(30)]
S0, S1, S2 = [0x100, *OUTER], [0x200, 0x201, *OUTER], [0x300, *OUTER[-8:]]


class Source:
    pid = 1
    spawned = False
    is_local = True


def batches() -> list[bytes]:
    # s1 is a tail of s0 in the same batch; s2, in the next batch, a tail of s1.
    return [chunk(0, full(0, S0) + tail(1, 0, 30, S1[:2])), chunk(0, tail(2, 1, 8, S2[:1]))]


def run(path: Path, quiet: bool, interrupt_at: int | None = None) -> CaptureLoop:
    loop = CaptureLoop(Source(), tracers.all_tracers()["malloc"],  # type: ignore[arg-type]
                       TargetSpec(device="local", pid=1, launch="none"), CaptureOptions(tracer="malloc"))
    loop.writer = CaptureWriter(path)
    loop._host_symbols = quiet      # (a local target without a panel starts quietly)
    loop._start_quiet()
    assert loop.writer.holding == quiet
    for t, data in enumerate(batches(), 1):
        loop._route("events:batch", {"type": "events:batch", "t": t, "counters": [t] * layout.N_COUNTERS}, data)
    if interrupt_at is not None:
        real = loop._whole_stacks_once
        calls: list[int] = []

        def interrupted(data: bytes) -> bytes:
            calls.append(1)
            made = real(data)       # (the StackTails moved on: the interrupt comes after)
            if len(calls) == interrupt_at:
                raise KeyboardInterrupt
            return made

        loop._whole_stacks_once = interrupted  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            loop._end_quiet()
        assert loop.writer.holding      # what it had not written is still held
    loop._end_quiet()
    assert not loop.writer.holding and loop.write_error is None
    loop.writer.write(RecordType.END, {"ended": "completed", "reason": "window ended"})
    loop.writer.close()
    return loop


def stacks(path: Path) -> list[tuple[int, tuple[int, ...]]]:
    return [(r.stack_id, r.frames) for rec in read_records(path) if rec.type == RecordType.BATCH
            for r in decode_agent_records(rec.data) if isinstance(r, StackRecord)]


def records(path: Path) -> list[tuple[Any, ...]]:
    return [(r.type, r.data) for r in read_records(path)]


@pytest.mark.parametrize("interrupt_at", [None, 1, 2])
def test_a_quiet_start_writes_what_a_busy_one_does(tmp_path: Path, interrupt_at: int | None) -> None:
    busy = run(tmp_path / "busy.mtc", quiet=False)
    quiet = run(tmp_path / "quiet.mtc", quiet=True, interrupt_at=interrupt_at)
    want = [(0, tuple(S0)), (1, tuple(S1)), (2, tuple(S2))]
    assert stacks(tmp_path / "busy.mtc") == stacks(tmp_path / "quiet.mtc") == want
    assert records(tmp_path / "quiet.mtc") == records(tmp_path / "busy.mtc")
    assert (quiet._tails.expanded, quiet._tails.broken) == (busy._tails.expanded, busy._tails.broken) == (2, 0)
    # The names' queue: every address, once, whichever way the batches were read.
    quiet.stacks.symbolize(None)
    busy.stacks.symbolize(None)
    assert sorted(quiet.stacks.pending) == sorted(busy.stacks.pending) == sorted(set(S0) | set(S1) | set(S2))
