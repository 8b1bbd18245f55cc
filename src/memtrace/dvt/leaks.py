"""``--leaks`` with ``--backend dvt``: the device's own leak scan mapped onto memtrace's leaks view.

Instruments' Leaks service builds the app's memory graph on the device (as Xcode's memory graph
debugger and ``leaks(1)`` do) and answers with the leaked blocks' count and addresses.  The
Allocations recording knows every live block's size and allocating stack, so each leaked address
found there is a leaked block *with its stack*; the recording's other live blocks are the still
reachable ones.  A leaked address the recording never saw allocated (a block from before the
recording library loaded) is counted under "no stack".  The result has the shape the agent's own
scan sends (``analyze/leaks.py`` reads both).
"""

from __future__ import annotations

from typing import Any

from memtrace.capture import NO_STACK
from memtrace.dvt.allocations import EventTranslator

MAX_LEAKED_LISTED = 1000     # as the agent's scan: addresses listed, the rest counted


def leak_result(leaked_count: int, leaked_addresses: list[int], translator: EventTranslator,
                scan_ms: int | None = None) -> dict[str, Any]:
    leaked_by: dict[int, list[int]] = {}
    reachable_by: dict[int, list[int]] = {}
    listed: list[list[Any]] = []
    leaked_set = set(leaked_addresses)
    unknown = 0
    for addr in leaked_addresses:
        entry = translator.live.get(addr)
        if entry is None:
            unknown += 1
            row = leaked_by.setdefault(NO_STACK, [NO_STACK, 0, 0])
            row[1] += 1
            continue
        size, sid = entry
        row = leaked_by.setdefault(sid, [sid, 0, 0])
        row[1] += 1
        row[2] += size
        if len(listed) < MAX_LEAKED_LISTED:
            listed.append([hex(addr), size, sid])
    for addr, (size, sid) in translator.live.items():
        if addr in leaked_set:
            continue
        row = reachable_by.setdefault(sid, [sid, 0, 0])
        row[1] += 1
        row[2] += size
    leaked_blocks = sum(r[1] for r in leaked_by.values())
    # The device may count more leaks than it lists addresses for.
    not_addressed = max(0, int(leaked_count) - len(leaked_addresses))
    return {
        "type": "result", "tracer": "malloc", "kind": "leaks", "when": "window-end", "source": "device",
        "scanner": "Instruments Leaks (the device's memory graph)",
        "complete": True, "stopped": True, "threads_stopped": None, "threads_not_stopped": None,
        "candidates": len(translator.live), "candidates_total": len(translator.live), "undecided_blocks": 0,
        "leaked_blocks": leaked_blocks + not_addressed,
        "leaked_bytes": sum(r[2] for r in leaked_by.values()),
        "reachable_blocks": sum(r[1] for r in reachable_by.values()),
        "reachable_bytes": sum(r[2] for r in reachable_by.values()),
        # The device's scan says leaked or not: every leaked block is reported as definitely lost
        # (its memory graph does not split out the blocks reachable only from other leaked ones).
        "definitely_by_stack": list(leaked_by.values()), "indirectly_by_stack": [], "possibly_by_stack": [],
        "reachable_by_stack": list(reachable_by.values()), "verdicts": "device: leaked or reachable",
        "leaked_listed": len(listed), "leaked": listed,
        "root_ranges": None, "root_bytes": None, "block_bytes": None,
        "skipped": {}, "leaked_not_recorded": unknown, "leaked_without_address": not_addressed,
        "stop_ms": None, "scan_ms": scan_ms, "budget_ms": None,
    }
