"""malloc --leaks, offline: the agent's scan result, by stack.

The agent's RESULT record (``kind: "leaks"``) gives every candidate block by verdict and stack id,
``[stack id, blocks, bytes]`` rows, in valgrind memcheck's categories: definitely lost (no pointer
to it from live memory or from any other block), indirectly lost (pointed at only from lost
blocks), possibly lost (reached only through pointers into its middle) and still reachable.
*Leaked* is definitely + indirectly lost: what ``valgrind --leak-check=full`` counts as lost.  The
scan took each tracked block's requested size and stack from the core's live table; blocks the
allocator walk found that the table does not hold were allocated before tracing (their usable
size, no stack: key LEAK_BEFORE_TRACING_KEY).  The stacks' frames come from the capture's stack
definitions, as everywhere else in memtrace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import Struct

from memtrace.capture import Result
from memtrace.frames import Frame, stack_key
from memtrace.layout import LEAK_BEFORE_TRACING_KEY
from memtrace.schema import UNSET, Addr, Count, Maybe, Row

# What the scan did not read, by the agent's reason key, in words (console and report).
SKIP_REASONS = {
    "stacks_of_no_stopped_thread": "stacks below the stopped threads' stack pointers, and stacks no thread runs "
                                   "on (Frida's own)",
    "exited_threads_dead_frames": "exited threads' dead frames (their TLS and thread control block are scanned)",
    "exiting_thread_frames": "of them, the exiting thread's frames below its call to exit (exit's and Frida's: "
                             "only dead slots of the program's)",
    "scanning_thread_stack": "the scanning thread's own stack",
    "parent_agent_memory": "a fork child's copy of its parent's agent (Frida's memory and memtrace's tables, "
                           "mostly reserved, never touched: not the program's; address space)",
    "unreadable": "unreadable memory",
    "never_touched_pages": "pages never touched (zero, not read)",
    "not_scanned_budget": "not reached in the time budget",
}
# Skips that leave no root unread (dead frames, zero pages): the scan is as good as complete.
HARMLESS_SKIPS = ("stacks_of_no_stopped_thread", "exited_threads_dead_frames", "exiting_thread_frames",
                  "never_touched_pages", "parent_agent_memory")
# The verdicts, as the result's by-stack keys and the JSON's group names.
VERDICTS = (("definitely_lost", "definitely_by_stack"), ("indirectly_lost", "indirectly_by_stack"),
            ("possibly_lost", "possibly_by_stack"), ("reachable", "reachable_by_stack"))


# The verdicts as the console and the report title them (valgrind's words; leaked = the first two).
LEAK_GROUPS = (("definitely_lost", "LEAKED: definitely lost"), ("indirectly_lost", "LEAKED: indirectly lost"),
               ("possibly_lost", "possibly lost (only pointers into the middle)"), ("reachable", "still reachable"))


def leak_no_stack(row: dict[str, Any]) -> str:
    return "(allocated before tracing: no stack)" if row.get("allocated_before_tracing") else "(no stack)"


def examined_text(scan: dict[str, Any]) -> str:
    """How many blocks the scan examined, and that it was every one (or which were not, and why)."""
    n = int(scan.get("examined") or scan.get("candidates") or 0)
    before = int(scan.get("before_tracing_blocks") or 0)
    parts = [f"{n:,} blocks"]
    if scan.get("frida_own_blocks"):
        parts.append(f"{int(scan['frida_own_blocks']):,} of them Frida's own (reached only from its threads), "
                     "in no verdict")
    if scan.get("tracked_blocks") is not None:
        full = int(scan.get("live_table_full") or 0)
        parts.append(f"{int(scan['tracked_blocks']):,} traced, {before:,} allocated before tracing"
                     + (f" (or among the {full:,} the live table had no room for: no stack)" if full else ""))
    missed = scan.get("not_examined") or {}
    reasons = []
    if missed.get("over_capacity"):
        reasons.append(f"{missed['over_capacity']:,} beyond the scan's table")
    if missed.get("undecided_darwin_logger"):
        reasons.append(f"{missed['undecided_darwin_logger']:,} the malloc logger left undecided")
    alloc = scan.get("allocator") or {}
    if alloc and not alloc.get("main_arena_found"):
        reasons.append("glibc's arenas not found: blocks allocated before tracing were not looked for")
    if alloc.get("walk_errors"):
        reasons.append(f"{alloc['walk_errors']} heap walk(s) stopped at an inconsistent chunk "
                       f"({alloc.get('unwalked_bytes', 0):,} bytes not walked)")
    if not scan.get("complete"):
        reasons.append("the time budget ran out: unreached blocks are not proved lost")
    if reasons:
        parts.append("NOT every block: " + "; ".join(reasons))
    else:
        parts.append("every live heap block examined")
    return "; ".join(parts)


def skipped_text(skipped: dict[str, int], fmt: Callable[[int], str]) -> list[str]:
    """The scan's unread memory as phrases (``fmt`` formats bytes); blocks over capacity as a count."""
    out = []
    for key, value in skipped.items():
        if not value:
            continue
        if key == "candidates_over_capacity":
            out.append(f"{value:,} blocks over the table's capacity")
        else:
            out.append(f"{SKIP_REASONS.get(key, key.replace('_', ' '))} {fmt(value)}")
    return out


class LeakGroup(Struct):
    blocks: int = 0
    bytes: int = 0
    by_stack: dict[int, list[int]] = msgspec.field(default_factory=dict)   # stack id -> [blocks, bytes]

    def add(self, sid: int, blocks: int, nbytes: int) -> None:
        self.blocks += blocks
        self.bytes += nbytes
        acc = self.by_stack.setdefault(sid, [0, 0])
        acc[0] += blocks
        acc[1] += nbytes

    def rows(self, frames_of: Callable[[int], list[Frame]], top: int | None) -> list[dict[str, Any]]:
        """Rows keyed by the whole symbolized stack, largest first."""
        merged: dict[Any, dict[str, Any]] = {}
        for sid, (n, nbytes) in self.by_stack.items():
            before = sid == LEAK_BEFORE_TRACING_KEY
            frames = [] if before else frames_of(sid)
            key = ("before-tracing",) if before else stack_key(frames) if frames else ("no-stack", sid)
            row = merged.get(key)
            if row is None:
                row = merged[key] = {"blocks": 0, "bytes": 0, "stack_ids": [], "frames": frames,
                                     "before_tracing": before}
            row["blocks"] += n
            row["bytes"] += nbytes
            row["stack_ids"].append(sid)
        out = sorted(merged.values(), key=lambda r: (-r["bytes"], min(r["stack_ids"])))
        out = out if top is None else out[:top]
        return [{"blocks": r["blocks"], "bytes": r["bytes"], "count": r["blocks"],
                 "stack_id": min(r["stack_ids"]), "stack_ids": sorted(r["stack_ids"]),
                 "allocated_before_tracing": r["before_tracing"],
                 "frames": [f.to_json() for f in r["frames"]]} for r in out]


class LeakScan(Struct):
    """One scan: what the agent measured, and its blocks by verdict."""

    scan: dict[str, Any]
    groups: dict[str, LeakGroup] = msgspec.field(default_factory=lambda: {name: LeakGroup() for name, _ in VERDICTS})

    @property
    def leaked(self) -> LeakGroup:
        """Definitely + indirectly lost: valgrind's lost."""
        out = LeakGroup()
        for name in ("definitely_lost", "indirectly_lost"):
            for sid, (n, nbytes) in self.groups[name].by_stack.items():
                out.add(sid, n, nbytes)
        return out

    @property
    def reachable(self) -> LeakGroup:
        return self.groups["reachable"]

    def to_json(self, frames_of: Callable[[int], list[Frame]], top: int | None = 10,
                live_table_full: int = 0) -> dict[str, Any]:
        s = self.scan
        skipped = s.get("skipped") or {}
        examined = int(s.get("candidates") or 0)
        not_examined = {
            "over_capacity": int(skipped.get("candidates_over_capacity") or 0),
            "undecided_darwin_logger": int(s.get("undecided_blocks") or 0),
        }
        groups = {name: {"blocks": g.blocks, "bytes": g.bytes, "by_stack": g.rows(frames_of, top)}
                  for name, g in ((n, self.groups[n]) for n, _ in VERDICTS)}
        leaked = self.leaked
        return {
            "leaked": {"blocks": leaked.blocks, "bytes": leaked.bytes, "by_stack": leaked.rows(frames_of, top)},
            **groups,
            "scan": {
                "when": s.get("when"), "complete": bool(s.get("complete")),
                "world_stopped": bool(s.get("stopped")),
                "threads_stopped": s.get("threads_stopped"), "threads_not_stopped": s.get("threads_not_stopped"),
                # at exit: the exiting thread's stack read from its call to exit (x86-64 Linux), and
                # whether its registers at that call were found
                "exit_call_threads": s.get("exit_call_threads", 0),
                "exit_call_registers": s.get("exit_call_registers", 0),
                # what finding it cost with the world stopped: threads, stack words, reads, ms
                "exit_search": s.get("exit_search"),
                "candidates": examined, "examined": examined,
                "every_block_examined": bool(s.get("complete")) and not any(not_examined.values()),
                "not_examined": not_examined,
                "tracked_blocks": s.get("tracked_blocks"),
                "before_tracing_blocks": s.get("before_tracing_blocks", 0),
                # of which, at most this many were traced but found no room in the live table
                "live_table_full": live_table_full,
                "before_tracing_bytes": s.get("before_tracing_bytes", 0),
                # examined, but reached only from Frida's threads (their DTVs): the agent's, in no verdict
                "frida_own_blocks": s.get("frida_own_blocks", 0), "frida_own_bytes": s.get("frida_own_bytes", 0),
                "allocator": s.get("allocator"),
                "root_ranges": s.get("root_ranges"),
                "root_bytes": s.get("root_bytes"), "block_bytes": s.get("block_bytes"),
                # a followed fork child: its copy of the parent's agent, left out of the roots
                # (ranges, how old the parent's list of it was when the child's agent read it, whether
                # it was cut short)
                "inherited_agent": s.get("inherited_agent"),
                "skipped": skipped, "undecided_blocks": s.get("undecided_blocks", 0),
                "leaked_not_listed": max(0, int(s.get("leaked_blocks") or 0) - int(s.get("leaked_listed") or 0)),
                "stop_ms": s.get("stop_ms"), "collect_ms": s.get("collect_ms"), "scan_ms": s.get("scan_ms"),
                "world_stopped_ms": s.get("world_stopped_ms"), "budget_ms": s.get("budget_ms"),
            },
        }


def is_leak_result(body: dict[str, Any]) -> bool:
    # Its kind says what it is: a leak scan is the only RESULT of that kind (malloc --leaks, or the
    # device's own scan through --backend dvt), and only malloc's analyzer asks.
    return body.get("kind") == "leaks"


def resolve(body: dict[str, Any]) -> LeakScan:
    """The scan of a RESULT record, its blocks grouped by verdict and stack id.  A record of an older
    agent (leaked and reachable only) reads as definitely lost and reachable."""
    keys = {key for _, key in VERDICTS} | {"leaked", "leaked_by_stack"}
    out = LeakScan(scan={k: v for k, v in body.items() if k not in keys})
    sources = [(name, key) for name, key in VERDICTS]
    if "definitely_by_stack" not in body:
        sources = [("definitely_lost", "leaked_by_stack"), ("reachable", "reachable_by_stack")]
    for name, key in sources:
        for sid, blocks, nbytes in body.get(key) or []:
            out.groups[name].add(sid, blocks, nbytes)
    return out


# ---- malloc --leaks' RESULT as the capture reader checks it (tracers/malloc.py's TRACER.result) ---


class _StackRow(Row):
    """[stack id, blocks, bytes]"""

    stack_id: Count
    blocks: Count
    bytes: Count


class _LeakedBlock(Row):
    """[address, size, stack id]"""

    address: Addr
    size: Count
    stack_id: Count


class LeakResult(Result):
    kind: Maybe[str] = UNSET
    when: str | None = None
    complete: Maybe[bool] = UNSET
    stopped: Maybe[bool] = UNSET
    candidates: Maybe[Count] = UNSET
    leaked_blocks: Maybe[Count] = UNSET
    leaked_bytes: Maybe[Count] = UNSET
    reachable_blocks: Maybe[Count] = UNSET
    reachable_bytes: Maybe[Count] = UNSET
    definitely_by_stack: Maybe[list[_StackRow]] = UNSET
    indirectly_by_stack: Maybe[list[_StackRow]] = UNSET
    possibly_by_stack: Maybe[list[_StackRow]] = UNSET
    reachable_by_stack: Maybe[list[_StackRow]] = UNSET
    leaked_by_stack: Maybe[list[_StackRow]] = UNSET      # agents before the verdicts: leaked = definitely lost
    leaked: Maybe[list[_LeakedBlock]] = UNSET
    skipped: Maybe[dict[str, Count]] = UNSET
