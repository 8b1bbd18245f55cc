"""The wire's STACK_TAIL records (a stack as its inner frames plus the count of outer frames it
shares with the stack defined just before it) made STACK records again by capture.StackTails, as
the capture loop does with every batch before anything else reads it."""

from __future__ import annotations

import struct

from memtrace import layout
from memtrace.capture import (
    AggRecord,
    FreeRecord,
    StackRecord,
    StackTails,
    decode_agent_records,
    encode_agent_records,
)

_CHUNK = struct.Struct(layout.CHUNK_HEADER.format)
_TAIL = struct.Struct(layout.STACK_TAIL_RECORD.format)
_PAD = struct.Struct(layout.PAD_RECORD.format)


def tail(stack_id: int, parent: int, shared: int, own: list[int]) -> bytes:
    return _TAIL.pack(layout.REC_STACK_TAIL, len(own) & 0xFF, len(own) >> 8, stack_id, parent, shared) + \
        struct.pack(f"<{len(own)}Q", *own)


def full(stack_id: int, frames: list[int]) -> bytes:
    return encode_agent_records(0, [StackRecord(0, stack_id, tuple(frames))])[_CHUNK.size:]


def chunk(tid: int, body: bytes) -> bytes:
    return _CHUNK.pack(tid, len(body)) + body


def stacks(data: bytes) -> dict[int, tuple[int, ...]]:
    return {r.stack_id: r.frames for r in decode_agent_records(data) if isinstance(r, StackRecord)}


def test_tails_become_whole_stacks_within_and_across_batches() -> None:
    outer = [0x4000 + i for i in range(40)]         # main ... the pass: what the stacks share
    s0 = [0x100, 0x101, *outer]
    s1 = [0x200, *outer]                             # shares all 40 outer frames with s0
    s2 = [0x300, 0x301, 0x302, *outer[-10:]]         # shares the outermost 10 with s1
    s3 = [0x400, *outer[-10:]]                       # in the next batch: shares 10 with s2
    rows = encode_agent_records(0, [AggRecord(0, {"allocs": 3, "bytes": 96})])
    first = chunk(0, full(0, s0) + tail(1, 0, 40, s1[:1]) + tail(2, 1, 10, s2[:3])) + rows
    tails = StackTails()
    out = tails.expand(first)
    assert stacks(out) == {0: tuple(s0), 1: tuple(s1), 2: tuple(s2)}
    # Everything else as it was: the rows' chunk follows, byte for byte.
    assert out.endswith(rows)
    assert [r for r in decode_agent_records(out) if isinstance(r, AggRecord)] == [AggRecord(0, {"allocs": 3, "bytes": 96})]
    second = chunk(0, tail(3, 2, 10, s3[:1]))
    assert stacks(tails.expand(second)) == {3: tuple(s3)}
    assert (tails.expanded, tails.broken) == (3, 0)


def test_a_batch_without_tails_is_returned_as_it_came_but_read_for_the_last_stack() -> None:
    outer = [0x9000 + i for i in range(8)]
    plain = chunk(0, full(7, [0x1, *outer])) + encode_agent_records(42, [FreeRecord(42, 3, 0xABC0, 0)])
    tails = StackTails()
    assert tails.expand(plain) is plain
    # The next batch's tail takes its outer frames from that batch's last stack.
    assert stacks(tails.expand(chunk(0, tail(8, 7, 8, [0x2])))) == {8: (0x2, *outer)}


def test_padding_and_thread_chunks_are_stepped_over() -> None:
    outer = [0x7000 + i for i in range(5)]
    pad = _PAD.pack(layout.REC_PAD, 0, 0, 24) + bytes(16)
    # A thread's own chunk (events mode) is never a definitions chunk, whatever its bytes.
    thread = encode_agent_records(5, [FreeRecord(5, 3, 0x10, 0)])
    data = thread + chunk(0, full(0, [0x1, *outer]) + pad + tail(1, 0, 5, [0x2, 0x3]))
    out = StackTails().expand(data)
    assert out.startswith(thread)
    assert stacks(out) == {0: (0x1, *outer), 1: (0x2, 0x3, *outer)}


def test_a_tail_whose_parent_never_came_keeps_its_own_frames_and_is_counted() -> None:
    tails = StackTails()
    tails.expand(chunk(0, full(0, [0x1, 0x2, 0x3])))
    # Stack 1's definition was lost: stack 2 names it as its parent.
    out = tails.expand(chunk(0, tail(2, 1, 2, [0x9])))
    assert stacks(out) == {2: (0x9,)}
    assert (tails.expanded, tails.broken) == (0, 1)


def test_a_tail_of_a_broken_tail_is_broken_too_until_a_whole_stack_comes() -> None:
    tails = StackTails()
    tails.expand(chunk(0, full(0, [0x1, 0x2, 0x3, 0x4])))
    # Stack 1 was lost; 2 names it, 3 names 2 (whose outer frames the host never had): both broken,
    # neither made up from 2's inner frames.  Stack 4, a whole one (a drain's first), restarts the chain.
    out = tails.expand(chunk(0, tail(2, 1, 2, [0x9, 0x8, 0x7]) + tail(3, 2, 2, [0x6]) + full(4, [0x5, 0x3, 0x4])
                             + tail(5, 4, 2, [0xA])))
    assert stacks(out) == {2: (0x9, 0x8, 0x7), 3: (0x6,), 4: (0x5, 0x3, 0x4), 5: (0xA, 0x3, 0x4)}
    assert (tails.expanded, tails.broken) == (1, 2)
