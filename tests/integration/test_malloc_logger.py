"""Darwin's malloc_logger path, exercised on Linux through the real C decoder and callback.

libmalloc calls ``malloc_logger(type, arg1, arg2, arg3, result, skip)``; these are the argument
patterns of libmalloc's own calls (stack_logging.h bits: alloc 2, dealloc 4, zone 8,
vm_allocate 16, vm_deallocate 32, cleared 64, mapped_file 128; VM tag in the top byte).
"""

from __future__ import annotations

import contextlib
import sys
import time

import frida
import pytest

from memtrace import capture, layout
from memtrace.agentbuild import build_agent
from memtrace.capture import AllocRecord, FreeRecord, decode_agent_records

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

ALLOC, DEALLOC, ZONE, VM_ALLOC, VM_DEALLOC, CLEARED, MAPPED = 2, 4, 8, 16, 32, 64, 128
OP_ALLOC, OP_FREE, OP_REALLOC, OP_VM_ALLOC, OP_VM_FREE = (layout.LOGGER_OPS[k] for k in (
    "alloc", "free", "realloc", "vm_alloc", "vm_free"))


# TinyCC ("internal") is the compiler an iPhone has; Linux defaults to the external gcc toolchain.
@pytest.fixture(params=["external", "internal"])
def agent(compile_c, request):
    yield from _agent(compile_c, request.param, events=True)


@pytest.fixture(params=["external", "internal"])
def aggregate_agent(compile_c, request):
    yield from _agent(compile_c, request.param, events=False)


def _agent(compile_c, toolchain: str, events: bool):
    device = frida.get_local_device()
    pid = device.spawn([str(compile_c("steady"))], stdio="pipe")
    session = device.attach(pid)
    agent = build_agent("malloc")
    script = session.create_script(agent.source)
    batches: list[bytes] = []
    script.on("message", lambda m, d: batches.append(d) if d and m.get("payload", {}).get("type") == "events:batch"
              else None)
    script.load()
    api = script.exports_sync
    init = api.init({"liveThreshold": 4096, "stackThreshold": 8192, "frames": 8, "sampleBytes": 0, "ringKb": 64,
              "threadSlots": 64, "rings": 8, "stackTable": 1024, "liveTable": 4096, "toolchain": toolchain,
              "backend": "auto", "events": events}, agent.c_sources)
    assert init["info"]["toolchain"] == toolchain
    yield api, batches
    try:
        api.stop()
        session.detach()
    finally:
        # The target is never resumed; frida-core may already have reaped it on detach.
        with contextlib.suppress(frida.ProcessNotFoundError):
            device.kill(pid)


@pytest.mark.parametrize("type_, args, expected", [
    (ALLOC | ZONE, (0x1, 100, 0, 0x5000), {"op": OP_ALLOC, "kind": 0, "ptr": 0x5000, "size": 100}),
    (ALLOC | ZONE | CLEARED, (0x1, 4096, 0, 0x6000), {"op": OP_ALLOC, "kind": 1, "ptr": 0x6000, "size": 4096}),
    (ALLOC | DEALLOC | ZONE, (0x1, 0x5000, 300, 0x7000),
     {"op": OP_REALLOC, "kind": 2, "ptr": 0x7000, "size": 300, "old_ptr": 0x5000}),
    (DEALLOC | ZONE, (0x1, 0x7000, 0, 0), {"op": OP_FREE, "kind": 3, "old_ptr": 0x7000}),
    (VM_ALLOC | (88 << 24), (0x103, 1 << 20, 0, 0x100000),
     {"op": OP_VM_ALLOC, "kind": 12, "ptr": 0x100000, "size": 1 << 20, "tag": 88}),
    (VM_ALLOC | MAPPED, (0x103, 8192, 0, 0x200000), {"op": OP_VM_ALLOC, "kind": 14, "size": 8192}),
    (VM_DEALLOC, (0x103, 0x100000, 1 << 20, 0),
     {"op": OP_VM_FREE, "kind": 13, "old_ptr": 0x100000, "size": 1 << 20, "tag": 0}),
    (0, (0, 0, 0, 0), {"op": 0}),
])
def test_decode_libmalloc_patterns(agent, type_: int, args: tuple[int, ...], expected: dict[str, int]) -> None:
    api, _ = agent
    got = api.decode_logger_event(type_, *[hex(a) for a in args])
    for key, value in expected.items():
        assert int(got[key]) == value, (key, got)


def test_logger_callback_streams_allocs_frees_and_vm_in_events_mode(agent) -> None:
    api, batches = agent
    api.start()
    api.feed_logger(ALLOC | ZONE, "0x1", hex(10000), "0x0", "0x5000")           # stacked + live
    api.feed_logger(ALLOC | DEALLOC | ZONE, "0x1", "0x5000", hex(20000), "0x9000")  # realloc
    api.feed_logger(DEALLOC | ZONE, "0x1", "0x9000", "0x0", "0x0")
    api.feed_logger(VM_ALLOC | (88 << 24), "0x103", hex(1 << 20), "0x0", "0x100000")
    api.flush()
    time.sleep(0.3)
    records = [r for b in batches for r in decode_agent_records(b)]
    ours = [r for r in records if isinstance(r, (AllocRecord, FreeRecord))
            and (getattr(r, "ptr", 0) in (0x5000, 0x9000, 0x100000))]
    summary = [(type(r).__name__, capture.KIND_NAMES[r.kind], r.ptr) for r in ours]
    assert summary == [("AllocRecord", "malloc", 0x5000), ("FreeRecord", "realloc", 0x5000),
                       ("AllocRecord", "realloc", 0x9000), ("FreeRecord", "free", 0x9000),
                       ("AllocRecord", "vm_allocate", 0x100000)]


def test_logger_callback_feeds_the_aggregates(aggregate_agent) -> None:
    """The logger backend goes through the same core as the hooks: per-stack totals, live table, peak."""
    api, batches = aggregate_agent
    api.start()
    api.feed_logger(ALLOC | ZONE, "0x1", hex(10000), "0x0", "0x5000")             # stacked + live
    api.feed_logger(ALLOC | DEALLOC | ZONE, "0x1", "0x5000", hex(20000), "0x9000")  # realloc
    api.feed_logger(DEALLOC | ZONE, "0x1", "0x9000", "0x0", "0x0")
    api.feed_logger(VM_ALLOC | (88 << 24), "0x103", hex(1 << 20), "0x0", "0x100000")
    api.stop()      # hooks out: the final drain ships the peak's composition and the live table
    time.sleep(0.3)
    records = [r for b in batches for r in decode_agent_records(b)]
    assert not [r for r in records if isinstance(r, (AllocRecord, FreeRecord))], "no per-event records by default"
    (block,) = [r for r in records if isinstance(r, capture.LiveRecord) and r.ptr == 0x100000]
    assert block.size == 1 << 20
    totals: dict[str, int] = {}
    for r in records:
        if isinstance(r, capture.AggRecord) and r.stack_id == block.stack_id:
            totals.update(r.values)
    # The four events were fed from one call site: one stack, three allocations, two frees.
    assert (totals["allocs"], totals["bytes"]) == (3, 10000 + 20000 + (1 << 20))
    assert (totals["frees"], totals["freed_bytes"]) == (2, 10000 + 20000)
    # The peak: the 10000 and 20000-byte blocks were gone before the 1 MiB mapping came.
    heads = [r for r in records if isinstance(r, capture.PeakHeadRecord)]
    peaks = [r for r in records if isinstance(r, capture.PeakRecord) and r.stack_id == block.stack_id]
    assert heads and heads[-1].bytes >= 1 << 20
    assert (peaks[-1].bytes, peaks[-1].count) == (1 << 20, 1)
