"""malloc --leaks, offline: the agent's scan result joined with the live blocks it was run on.

The agent names the leaked blocks by address (a RESULT record, ``kind: "leaks"``).  At that
record the analyzer's live map holds every tracked block the scan saw (the agent flushed every
record made before it stopped the world), so each leaked address has its ALLOC record, hence its
stack and size; the still reachable blocks are the other live blocks.  Sizes are the requested
sizes of the ALLOC records, as everywhere else in memtrace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memtrace.frames import Frame, stack_key

# ALLOC record tuple (capture.iter_agent_tuples): type, kind, flags, stack_id, ptr, size, weight
_SID, _SIZE = 3, 5


@dataclass
class LeakGroup:
    blocks: int = 0
    bytes: int = 0
    by_stack: dict[int, list[int]] = field(default_factory=dict)   # stack id -> [blocks, bytes]

    def add(self, sid: int, size: int) -> None:
        self.blocks += 1
        self.bytes += size
        acc = self.by_stack.get(sid)
        if acc is None:
            self.by_stack[sid] = [1, size]
        else:
            acc[0] += 1
            acc[1] += size

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
    unmatched: int = 0          # leaked addresses the capture has no live ALLOC record for

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
                "skipped": s.get("skipped") or {}, "unsized_blocks": s.get("unsized_blocks", 0),
                "leaked_not_listed": max(0, int(s.get("leaked_blocks") or 0) - int(s.get("leaked_listed") or 0)),
                "unmatched": self.unmatched,
                "stop_ms": s.get("stop_ms"), "scan_ms": s.get("scan_ms"), "budget_ms": s.get("budget_ms"),
            },
        }


def is_leak_result(body: dict[str, Any]) -> bool:
    return body.get("kind") == "leaks" and body.get("tracer") == "malloc"


def resolve(body: dict[str, Any], live: dict[int, tuple[int, ...]]) -> LeakScan:
    """The scan at its RESULT record; ``live`` maps each live address to its ALLOC record."""
    out = LeakScan(scan={k: v for k, v in body.items() if k != "leaked"})
    leaked: set[int] = set()
    for text in body.get("leaked") or []:
        p = int(text, 16)
        leaked.add(p)
        rec = live.get(p)
        if rec is None:
            out.unmatched += 1
            continue
        out.leaked.add(rec[_SID], rec[_SIZE])
    for p, rec in live.items():
        if p not in leaked:
            out.reachable.add(rec[_SID], rec[_SIZE])
    return out
