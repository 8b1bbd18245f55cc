"""64-bit values from the agent, exactly.

A JavaScript Number holds integers exactly only up to 2^53, so the agent never sends a 64-bit
value as one past that: it sends its decimal string instead (core.js ``exactU64``).  The host
makes every such string an int before anything is written or shown: the capture holds ints.
"""

from __future__ import annotations

from typing import Any

# The BATCH payload's 64-bit values (agents/runtime/flush.js, agents/malloc.js onBatch).
_TOP = ("lost", "live", "stacks")
_NESTED = {"tracked": ("bytes", "blocks"), "peak": ("bytes", "epoch"),
           "sample": ("tracked_bytes", "tracked_blocks", "peak_bytes", "in_use", "footprint")}


def exact_int(v: Any) -> Any:
    """An exactU64 value as an int: its decimal string made an int, anything else as it came."""
    if isinstance(v, str) and v.isdigit():
        return int(v)
    return v


def exact_batch_ints(payload: dict[str, Any]) -> None:
    """An ``events:batch`` payload's 64-bit values as ints, in place (counters, lost, live, stacks,
    tracked bytes and blocks, the peak, the timeline sample and its top stacks)."""
    counters = payload.get("counters")
    if isinstance(counters, list):
        payload["counters"] = [exact_int(c) for c in counters]
    for key in _TOP:
        if key in payload:
            payload[key] = exact_int(payload[key])
    for key, fields in _NESTED.items():
        part = payload.get(key)
        if isinstance(part, dict):
            for name in fields:
                if name in part:
                    part[name] = exact_int(part[name])
    sample = payload.get("sample")
    if isinstance(sample, dict) and isinstance(sample.get("top"), list):
        sample["top"] = [[exact_int(v) for v in row] if isinstance(row, list) else row for row in sample["top"]]
