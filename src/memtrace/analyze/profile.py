"""A capture as a stack profile: (stack, bytes, count) samples for one view.

The types of the views protocol: every summary answers ``summary.profile(view)`` with a
:class:`Profile` (:class:`memtrace.analyze.context.CaptureContext` gives the defaults, a
summary class its own views), and its tracer declares which views there are
(``Tracer.views``).  The flame graph, the folded/speedscope/pprof/parquet exports and ``diff``
read profiles, never a tracer's name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from msgspec import Struct

from memtrace.frames import Frame

UNSTACKED = Frame(0, function="(no stack: below the stack threshold)")
BEFORE_TRACING = Frame(0, function="(allocated before tracing: no stack)")    # --leaks: found by the allocator walk
ALL_ROWS = 10 ** 9      # "every row" for summaries whose to_json slices by top


class Sample(Struct):
    frames: list[Frame]          # innermost first
    bytes: int
    count: int


class Profile(Struct):
    tracer: str
    view: str
    target: str | None
    samples: list[Sample] = msgspec.field(default_factory=list)
    missing: str | None = None   # why this view has nothing: "not in this capture"
    unit: str = "bytes"          # what a sample's ``bytes`` weighs: "bytes", or "count" (fds, threads)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.samples)

    @property
    def total_count(self) -> int:
        return sum(s.count for s in self.samples)


def samples_of(rows: Iterable[Mapping[str, Any]]) -> list[Sample]:
    """Stack rows of a summary's JSON ({"frames", "bytes", "count" | "blocks" | "calls"}) as samples."""
    out = []
    for r in rows:
        frames = [Frame.from_json(f) for f in r.get("frames") or []] or \
            [BEFORE_TRACING if r.get("allocated_before_tracing") else UNSTACKED]
        count = r.get("count", r.get("blocks", r.get("calls", 1)))
        out.append(Sample(frames, int(round(r.get("bytes") or 0)), int(round(count or 0))))
    return out


def named_stack_lists(doc: Mapping[str, Any], prefix: str = "") -> list[tuple[str, list[dict[str, Any]]]]:
    """Every list of rows with "frames" anywhere in a summary's JSON, with its dotted name."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for k, v in doc.items():
        if isinstance(v, list) and v and all(isinstance(r, dict) and "frames" in r for r in v):
            out.append((prefix + k, v))
        elif isinstance(v, dict):
            out += named_stack_lists(v, prefix + k + ".")
    return out


def rows_at(doc: Mapping[str, Any], path: str) -> list[dict[str, Any]] | None:
    """The row list at a dotted path of a summary's JSON (None: no list there)."""
    node: Any = doc
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return [r for r in node if isinstance(r, dict)] if isinstance(node, list) else None
