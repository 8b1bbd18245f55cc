"""malloc --leaks, offline: the agent's scan result, by stack.

The agent's RESULT record (``kind: "leaks"``) gives the leaked and the still reachable blocks by
stack id, ``[stack id, blocks, bytes]`` rows: the scan took each candidate's requested size and
stack from the core's live table, so the result stands on its own (the stacks' frames come from
the capture's stack definitions, as everywhere else in memtrace).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memtrace.frames import Frame, stack_key

# What the scan did not read, by the agent's reason key, in words (console and report).
SKIP_REASONS = {
    "stacks_of_no_stopped_thread": "stacks of threads that were not running (exited threads' cached stacks, "
                                   "Frida's own)",
    "scanning_thread_stack": "the scanning thread's own stack",
    "unreadable": "unreadable memory",
    "not_scanned_budget": "not reached in the time budget",
}


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


@dataclass
class LeakGroup:
    blocks: int = 0
    bytes: int = 0
    by_stack: dict[int, list[int]] = field(default_factory=dict)   # stack id -> [blocks, bytes]

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
            frames = frames_of(sid)
            key = stack_key(frames) if frames else ("no-stack", sid)
            row = merged.get(key)
            if row is None:
                row = merged[key] = {"blocks": 0, "bytes": 0, "stack_ids": [], "frames": frames}
            row["blocks"] += n
            row["bytes"] += nbytes
            row["stack_ids"].append(sid)
        out = sorted(merged.values(), key=lambda r: (-r["bytes"], min(r["stack_ids"])))
        out = out if top is None else out[:top]
        return [{"blocks": r["blocks"], "bytes": r["bytes"], "count": r["blocks"],
                 "stack_id": min(r["stack_ids"]), "stack_ids": sorted(r["stack_ids"]),
                 "frames": [f.to_json() for f in r["frames"]]} for r in out]


@dataclass
class LeakScan:
    """One scan: what the agent measured, and its blocks sorted into leaked and reachable."""

    scan: dict[str, Any]
    leaked: LeakGroup = field(default_factory=LeakGroup)
    reachable: LeakGroup = field(default_factory=LeakGroup)

    def to_json(self, frames_of: Callable[[int], list[Frame]], top: int | None = 10) -> dict[str, Any]:
        s = self.scan
        return {
            "leaked": {"blocks": self.leaked.blocks, "bytes": self.leaked.bytes,
                       "by_stack": self.leaked.rows(frames_of, top)},
            "reachable": {"blocks": self.reachable.blocks, "bytes": self.reachable.bytes,
                          "by_stack": self.reachable.rows(frames_of, top)},
            "scan": {
                "when": s.get("when"), "complete": bool(s.get("complete")),
                "world_stopped": bool(s.get("stopped")),
                "threads_stopped": s.get("threads_stopped"), "threads_not_stopped": s.get("threads_not_stopped"),
                "candidates": s.get("candidates"), "root_ranges": s.get("root_ranges"),
                "root_bytes": s.get("root_bytes"), "block_bytes": s.get("block_bytes"),
                "skipped": s.get("skipped") or {}, "undecided_blocks": s.get("undecided_blocks", 0),
                "leaked_not_listed": max(0, int(s.get("leaked_blocks") or 0) - int(s.get("leaked_listed") or 0)),
                "stop_ms": s.get("stop_ms"), "scan_ms": s.get("scan_ms"), "budget_ms": s.get("budget_ms"),
            },
        }


def is_leak_result(body: dict[str, Any]) -> bool:
    return body.get("kind") == "leaks" and body.get("tracer") == "malloc"


def resolve(body: dict[str, Any]) -> LeakScan:
    """The scan of a RESULT record, its blocks grouped by stack id."""
    out = LeakScan(scan={k: v for k, v in body.items() if k not in ("leaked", "leaked_by_stack", "reachable_by_stack")})
    for group, key in ((out.leaked, "leaked_by_stack"), (out.reachable, "reachable_by_stack")):
        for sid, blocks, nbytes in body.get(key) or []:
            group.add(sid, blocks, nbytes)
    return out
