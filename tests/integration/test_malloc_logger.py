"""Darwin's malloc_logger path, exercised on Linux through the real C decoder and callback.

libmalloc calls ``malloc_logger(type, arg1, arg2, arg3, result, skip)``; these are the argument
patterns of libmalloc's own calls (stack_logging.h bits: alloc 2, dealloc 4, zone 8,
vm_allocate 16, vm_deallocate 32, cleared 64, mapped_file 128; VM tag in the top byte).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import frida
import pytest

from memtrace import layout
from memtrace.agentbuild import build_agent
from memtrace.analyze.malloc import summarize
from memtrace.capture import AllocRecord, RecordType, decode_agent_records, read_records
from memtrace.capture_loop import CaptureOptions, run_capture
from memtrace.target import TargetSpec
from memtrace.tracers.malloc import AGENT_SIZING_DARWIN
from memtrace.ui import SilentUI

from ..conftest import ROOT  # noqa: TID252
from .malloc_agent import HeldAgent, malloc_agent_in

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

ALLOC, DEALLOC, ZONE, VM_ALLOC, VM_DEALLOC, CLEARED, MAPPED = 2, 4, 8, 16, 32, 64, 128
OP_ALLOC, OP_FREE, OP_REALLOC, OP_VM_ALLOC, OP_VM_FREE, OP_VM_SKIP = (layout.LOGGER_OPS[k] for k in (
    "alloc", "free", "realloc", "vm_alloc", "vm_free", "vm_skip"))
SKIP_OWN, SKIP_FAILED, SKIP_OTHER = (layout.COUNTERS[k] for k in ("vm_allocator_own", "vm_failed", "vm_other_task"))
KIB, MIB = 1024, 1024 * 1024


# TinyCC ("internal") is the compiler an iPhone has; Linux defaults to the external gcc toolchain.
@pytest.fixture(params=["external", "internal"])
def agent(compile_c, request) -> Iterator[HeldAgent]:
    with malloc_agent_in([compile_c("steady")], request.param,
                         liveThreshold=4096, stackThreshold=8192, frames=8) as held:
        yield held


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
    # libmalloc's own regions (mach_vm_map, VM_MEMORY_MALLOC_* tags 1..13, the 128 hint bit): left out.
    (VM_ALLOC | MAPPED | (3 << 24), (0x103, 1 << 20, 0, 0x300000), {"op": OP_VM_SKIP, "skip": SKIP_OWN, "tag": 3}),
    (VM_ALLOC | MAPPED | (13 << 24), (0x103, 1 << 14, 0, 0x300000), {"op": OP_VM_SKIP, "skip": SKIP_OWN}),
    (VM_ALLOC | MAPPED | (14 << 24), (0x103, 1 << 14, 0, 0x300000), {"op": OP_VM_ALLOC, "tag": 14}),
    # mmap logs MAP_FAILED; a failed mach_vm_allocate on older libsyscalls logs address 0.
    (VM_ALLOC, (0x103, 4096, 0, 0xFFFFFFFFFFFFFFFF), {"op": OP_VM_SKIP, "skip": SKIP_FAILED}),
    (VM_ALLOC | (88 << 24), (0x103, 4096, 0, 0), {"op": OP_VM_SKIP, "skip": SKIP_FAILED}),
    # arg1 is the target task: another task's VM is not ours.
    (VM_ALLOC, (0x207, 4096, 0, 0x400000), {"op": OP_VM_SKIP, "skip": SKIP_OTHER}),
    (VM_DEALLOC, (0x207, 0x400000, 4096, 0), {"op": OP_VM_SKIP, "skip": SKIP_OTHER}),
    (0, (0, 0, 0, 0), {"op": 0}),
])
def test_decode_libmalloc_patterns(agent, type_: int, args: tuple[int, ...], expected: dict[str, int]) -> None:
    api, _ = agent
    got = api.decode_logger_event(type_, *[hex(a) for a in args], "0x103")
    for key, value in expected.items():
        assert int(got[key]) == value, (key, got)


def standin_program(compile_c, demo_bin: Path, name: str) -> Path:
    """A tests/programs/ program linked against the stand-in libmalloc (libmtmalloc on libmtdarwin)."""
    return compile_c(name, "-I", str(ROOT / "demo" / "darwin"), "-L", str(demo_bin), "-lmtmalloc", "-lmtdarwin",
                     f"-Wl,-rpath,{demo_bin}")


# tests/programs/standin_malloc.c, figure by figure.
MALLOC_CALLS, MALLOC_BYTES = 29, 1000 + 15000 + 1048576 + 40000 + 28656 + 24560 + 20000
CALLOC_BYTES = 10000
REALLOC_CALLS, REALLOC_BYTES = 8, 100000 + 7 * 8192
# Still allocated at exit and tracked: 3 x 5000, the calloc, 1 MiB, the moved 100000, seven realloc'd
# 8192s, B's four 4096s (the two 4088s were freed) and the async-frame 20000.
LIVE_COUNT, LIVE_BYTES = 18, 15000 + 10000 + 1048576 + 100000 + 7 * 8192 + 4 * 4096 + 20000
# Freed (or realloc'd) with no other allocation on the thread in between: the ten 100-byte pairs, the
# 40000 moved to 100000, and the block each race and no_reuse realloc'd.
TEMP_CALLS, TEMP_BYTES = 10 + 1 + 7, 10 * 100 + 40000 + 5 * 4096 + 2 * 4088
# Tracked allocations (>= 4096 B): the three 5000s, the calloc, 1 MiB, 40000 and its 100000, each race's
# old block where it is 4096 (4) and its 8192, B's 4096s (4), no_reuse's 4096 and 8192, the 20000.
TRACKED_ALLOCS = 3 + 1 + 1 + 2 + 4 + 6 + 4 + 2 + 1


@pytest.mark.parametrize("toolchain, events", [("external", False), ("internal", False), ("external", True)])
def test_stand_in_libmalloc_through_the_logger(compile_c, demo_bin: Path, tmp_path: Path, toolchain: str,
                                               events: bool) -> None:
    """libmtmalloc calls malloc_logger and libmtdarwin __syscall_logger exactly as libmalloc and libsyscall do:
    libmalloc's own regions stay out, VM is apart from malloc's gross and live figures, separated by tag,
    failures and another task's VM are left out and counted, and every realloc race ends right -- in the
    core's per-stack totals, its peak and temporaries, and with --events in the per-event stream too."""
    prog = standin_program(compile_c, demo_bin, "standin_malloc")
    # The device's layered default (tracers.malloc.AGENT_SIZING_DARWIN), as the stand-in stands for one.
    layered = {k: AGENT_SIZING_DARWIN[k] for k in ("liveThreshold", "stackThreshold")}
    result = run_capture("malloc", TargetSpec(device="local", argv=[str(prog)]),
                         CaptureOptions(tracer="malloc", window=30, out=tmp_path / "c",
                                        agent_config={"backend": "logger", "toolchain": toolchain, "events": events,
                                                      **layered}),
                         SilentUI(passthrough=False))
    assert result.ended == "target-exited"
    records = list(read_records(tmp_path / "c"))
    summary = summarize(records)
    recon = next(r.body for r in records if r.type == RecordType.RECON)
    assert recon["info"]["backend"] == "logger" and recon["info"]["toolchain"] == toolchain
    s = summary.to_json()
    assert s["mode"] == ("events" if events else "aggregate")
    assert {k: v for k, v in s["calls"].items() if v} == {
        "malloc": MALLOC_CALLS, "calloc": 1, "realloc": REALLOC_CALLS, "free": 12,
        "vm_allocate": 3, "vm_deallocate": 2, "mapped_file": 2}
    # Gross bytes and tiers are the malloc family's only: no VM region, no libmalloc region.
    assert s["gross_bytes"] == MALLOC_BYTES + CALLOC_BYTES + REALLOC_BYTES
    assert sum(t["bytes"] for t in s["tiers"]) == s["gross_bytes"]
    assert s["live"]["count"] == LIVE_COUNT and s["live"]["bytes"] == LIVE_BYTES
    assert s["dropped"] == {"dropped_records": 0, "dropped_record_bytes": 0, "dropped_stacks": 0,
                            "live_table_full": 0, "unslotted_calls": 0, "unmatched_frees": 0}
    # The realloc race: each reuse of a moved realloc's old block was seen and settled.
    assert summary.counters[layout.COUNTERS["realloc_reuse_seen"]] == 7
    vm = s["vm"]
    assert vm["calls"] == {"vm_allocate": 3, "vm_deallocate": 2, "mapped_file": 2}
    assert vm["bytes"] == {"vm_allocate": MIB + 256 * KIB + 64 * KIB, "vm_deallocate": 256 * KIB + 8 * KIB,
                           "mapped_file": 8 * KIB + 128 * KIB}
    assert [(r["tag"], r["name"], r["calls"], r["bytes"], r["live_count"], r["live_bytes"]) for r in vm["by_tag"]] == [
        (88, "IOSurface", 1, MIB, 1, MIB),
        (62, "SQLite page cache", 1, 256 * KIB, 0, 0),
        (0, "untagged", 3, 64 * KIB + 8 * KIB + 128 * KIB, 2, 64 * KIB + 128 * KIB)]
    assert vm["live"] == {"count": 3, "bytes": MIB + 64 * KIB + 128 * KIB}
    # libmalloc's own: two regions (tiny, small) and four large blocks (1 MiB, 40000, 100000, 20000).
    assert vm["left_out"] == {"allocator_own": 6, "failed": 1, "other_task": 2, "untracked_frees": 0}
    # The peak is the end's live set, reached by the last allocation (no race leaves an entry behind).
    assert (s["peak"]["bytes"], s["peak"]["count"]) == (LIVE_BYTES, LIVE_COUNT)
    assert (s["temporary"]["calls"], s["temporary"]["bytes"]) == (TEMP_CALLS, TEMP_BYTES)
    # The live table at the end holds the same blocks as the rows, VM regions apart.
    assert len(summary.live_blocks) == LIVE_COUNT and sum(b[1] for b in summary.live_blocks) == LIVE_BYTES
    streamed = [r for rec in records if rec.type == RecordType.BATCH for r in decode_agent_records(rec.data)
                if isinstance(r, AllocRecord) and r.kind not in layout.VM_KINDS]
    # Events mode streams each tracked allocation; the default streams none (VM regions are records in both).
    assert len(streamed) == (TRACKED_ALLOCS if events else 0)
    # The C walk goes on past a frame whose saved frame pointer has Swift's async bit.
    stacks = [[f.function for f in row.frames] for row in summary.stack_rows(None)]
    async_stack = next(st for st in stacks if "alloc_below" in st)
    assert async_stack[async_stack.index("alloc_below"):][:4] == [
        "alloc_below", "swift_like_async_frame", "async_outer", "main"]


def test_agent_thread_allocations_are_the_agents(agent) -> None:
    """Calls the agent's own JavaScript thread makes (symbolization loads CoreSymbolication on Darwin)
    are passed through uncounted (own_calls says how many)."""
    api = agent.api
    api.start()
    before = agent.counters()
    assert api.malloc_on_agent_thread(50, 10000) == {"ignored": True}
    after = agent.counters()
    malloc, free, own = layout.KINDS["malloc"], layout.KINDS["free"], layout.COUNTERS["own_calls"]
    assert after[layout.C_CALLS + malloc] == before[layout.C_CALLS + malloc]
    assert after[layout.C_CALLS + free] == before[layout.C_CALLS + free]
    assert after[layout.COUNTERS["nested_calls"]] == before[layout.COUNTERS["nested_calls"]]
    assert after[own] - before[own] >= 100
    api.stop()


def test_the_agents_own_heap_is_taken_out_of_the_calibration(agent) -> None:
    """What the agent's own thread holds in the allocator (Darwin: CoreSymbolication's caches) is in
    mallinfo's in-use but is not the target's: its usable bytes are counted apart (own_bytes) and
    the allocator's in-use delta has them taken out (issue 23)."""
    from memtrace.analyze.malloc import MallocSummary

    api, _ = agent
    api.start()
    before = api.calibrate()
    assert api.malloc_on_agent_thread(20, 100_000, True) == {"ignored": True}
    after = api.calibrate()
    own = after["own_bytes"] - before["own_bytes"]
    assert 20 * 100_000 <= own < 20 * 100_000 + 20 * 64         # usable sizes: the request, rounded
    s = MallocSummary()
    s.calibration = {"before": {"phase": "before", **before}, "after": {"phase": "after", **after}}
    alloc = s.coverage()["allocator"]
    raw = after["allocator"]["in_use"] - before["allocator"]["in_use"]
    assert raw >= own and alloc["memtrace_own_bytes"] == own and alloc["in_use_delta"] == raw - own
    # Freed again by the agent: nothing left to take out.
    assert api.malloc_on_agent_thread(5, 50_000, False) == {"ignored": True}
    assert api.calibrate()["own_bytes"] == after["own_bytes"]
    api.stop()


# One step of a session (an attach, an rpc, an unload): init compiles the C core with gcc inside a
# target whose four threads never rest, ~25 s at load 30 on 2 CPUs; nothing else takes a second.
STEP_BOUND_S = 180


def _threads_of(pid: int) -> str:
    """Each thread of `pid`: state, kernel wait channel and ptrace tracer (a world stop's helper)."""
    out = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        with contextlib.suppress(OSError):
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            tracer = next(line.split()[1] for line in (task / "status").read_text().splitlines()
                          if line.startswith("TracerPid:"))
            out.append(f"{task.name}:{state}/{(task / 'wchan').read_text() or '-'}/tracer {tracer}")
    return ", ".join(out) or "gone"


def bounded(what: str, pid: int, call: Callable[[], Any]) -> Any:
    """`call()` on a thread of its own: a step that does not return fails the test, naming the step
    and where the target's threads wait, instead of stalling the suite until pytest-timeout."""
    done: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(call())
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
            failed.append(e)

    worker = threading.Thread(target=run, daemon=True, name=f"bounded {what}")
    worker.start()
    worker.join(STEP_BOUND_S)
    if worker.is_alive():
        pytest.fail(f"{what} did not return in {STEP_BOUND_S} s; the target's threads: {_threads_of(pid)}")
    if failed:
        raise failed[0]
    return done[0]


@pytest.mark.slow
def test_unloading_while_threads_are_in_the_logger(compile_c, demo_bin: Path) -> None:
    """Restoring malloc_logger and unloading the script at once could leave a thread inside the freed
    callback: uninstall waits for in-flight calls to drain.  Four threads allocate through the logger
    while the agent is loaded, started, stopped and unloaded again and again; the target lives on.
    Each session's pthread key is retired by keeping it (its destructor stub turned into a return):
    no later session is given an index whose values are an earlier session's slot pointers."""
    prog = standin_program(compile_c, demo_bin, "standin_malloc")
    device = frida.get_local_device()
    pid = device.spawn([str(prog), "--hammer", "4"], stdio="pipe")
    device.resume(pid)
    agent = build_agent("malloc")
    config = {"liveThreshold": 4096, "stackThreshold": 8192, "frames": 8, "sampleBytes": 0, "ringKb": 64,
              "threadSlots": 64, "rings": 8, "stackTable": 1024, "liveTable": 4096, "backend": "logger"}
    keys: list[int] = []
    try:
        time.sleep(0.3)
        for cycle in range(8):
            # The first session's core is compiled by gcc (Linux's default), the others' by TinyCC (the
            # device's): gcc runs inside the target, where its four threads leave it a sliver of 2 CPUs
            # (~30 s a session at load 30, eight of them near the suite's 600 s), TinyCC takes 0.3 s.
            config["toolchain"] = "external" if cycle == 0 else "internal"
            session = bounded(f"cycle {cycle}: attach", pid, lambda: device.attach(pid))
            script = session.create_script(agent.source)
            bounded(f"cycle {cycle}: load", pid, script.load)
            api = script.exports_sync
            info = bounded(f"cycle {cycle}: init", pid,
                           functools.partial(api.init, config, agent.c_sources, agent.process_sources))["info"]
            assert info["backend"] == "logger"
            bounded(f"cycle {cycle}: start", pid, api.start)
            time.sleep(0.05)
            bounded(f"cycle {cycle}: stop", pid, api.stop)
            drain = bounded(f"cycle {cycle}: logger_drain", pid, api.logger_drain)
            assert drain["drained"] is True and drain["inflight"] == 0
            assert bounded(f"cycle {cycle}: thread_key", pid, api.thread_key) == {"key": info["tlsKey"],
                                                                                  "retired": "kept"}
            keys.append(info["tlsKey"])
            bounded(f"cycle {cycle}: unload", pid, script.unload)
            bounded(f"cycle {cycle}: detach", pid, session.detach)
        time.sleep(0.2)
        assert any(p.pid == pid for p in device.enumerate_processes())
        assert len(set(keys)) == len(keys), keys
    finally:
        with contextlib.suppress(frida.ProcessNotFoundError):
            device.kill(pid)


def test_agent_tables_stay_untouched_until_used_and_are_reported(compile_c, demo_bin: Path, tmp_path: Path) -> None:
    """The core's tables are fresh pages, never cleared by hand: at start ~90 MiB are reserved and next
    to nothing is resident.  Calibration reports the agent's own resident bytes, and the footprint
    delta is given without them."""
    prog = standin_program(compile_c, demo_bin, "standin_malloc")
    run_capture("malloc", TargetSpec(device="local", argv=[str(prog)]),
                CaptureOptions(tracer="malloc", window=30, out=tmp_path / "c", agent_config={"backend": "logger"}),
                SilentUI(passthrough=False))
    calib = {r.body["phase"]: r.body for r in read_records(tmp_path / "c") if r.type == RecordType.CALIBRATION}
    before, after = calib["before"]["agent"], calib["at-exit"]["agent"]
    assert before["source"] == "mincore" and before["reserved"] >= 64 * MIB
    assert before["resident"] < before["reserved"] // 64
    assert before["resident"] <= after["resident"] < after["reserved"]
    fp = summarize(read_records(tmp_path / "c")).coverage()["footprint"]
    assert fp["agent_delta"] == after["resident"] - before["resident"]
    assert fp["delta_without_agent"] == fp["delta"] - fp["agent_delta"]
    # Table by table: the parts add up to the whole, and the blocks the stand-in keeps live are in the
    # live table, its stacks in the stack index.
    assert sum(after["resident_by_table"].values()) == after["resident"]
    assert set(after["resident_by_table"]) >= {"live_table", "stack_index", "slots", "agg"}
    assert sum(fp["agent_delta_by_table"].values()) == fp["agent_delta"]
    assert fp["agent_delta_by_table"]["live_table"] > 0 and fp["agent_delta_by_table"]["stack_index"] > 0
