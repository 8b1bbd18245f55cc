"""malloc --leaks on the host: when to ask the agent for the scan, and what its progress says.

The scan itself runs in the target (``cmodule/leaks.c`` through ``agents/leaks.js``): at the end
of the window (here, before the hooks come out) or as the process exits (the agent's dispose
path, by itself).  Its result is a RESULT record the malloc analyzer reads
(:mod:`memtrace.analyze.leaks`).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from memtrace.units import fmt_bytes

DEFAULT_BUDGET_S = 30.0
RPC_MARGIN_S = 30.0      # stopping, listing ranges and sending the result, beyond the scan's budget


def at_window_end(loop: Any) -> None:
    """The capture loop's hook: scan now if the capture asked for it; progress shows meanwhile."""
    config = loop.agent_config()
    if not config.get("leaks"):
        return
    loop.ui.phase("leak scan: stopping the world")
    budget = float(config.get("leaksBudget") or DEFAULT_BUDGET_S)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(loop.source.scan_leaks, config, budget + RPC_MARGIN_S)
        while not future.done():
            loop.drain(wait=0.1)
        future.result()
    loop.drain(wait=0.05)


def leak_progress(p: dict[str, Any]) -> str:
    total = p.get("roots_total") or 0
    done = p.get("roots_done") or 0
    pct = f"{100 * done / total:.0f}%" if total else "?"
    return (f"leak scan: roots {pct} of {fmt_bytes(total)}, {fmt_bytes(p.get('blocks_scanned') or 0)} of blocks, "
            f"{(p.get('elapsed_ms') or 0) / 1000:.1f} s")
