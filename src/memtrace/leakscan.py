"""malloc --leaks on the host: when to ask the agent for the scan, and what its progress says.

The scan itself runs in the target (``cmodule/leaks.c`` through ``agents/leaks.js``): at the end
of the window (here, before the hooks come out) or as the process exits (the agent's dispose
path, by itself).  Its result is a RESULT record the malloc analyzer reads
(:mod:`memtrace.analyze.leaks`).
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any

from memtrace.errors import AgentTimeout
from memtrace.record_source import Notice
from memtrace.units import fmt_bytes

DEFAULT_BUDGET_S = 30.0
RPC_MARGIN_S = 30.0      # stopping, listing ranges and sending the result, beyond the scan's budget


def _rpc_margin() -> float:
    # MEMTRACE_LEAKS_RPC_MARGIN: tests make the wait end before any scan can (a late scan's path).
    try:
        return float(os.environ.get("MEMTRACE_LEAKS_RPC_MARGIN", RPC_MARGIN_S))
    except ValueError:
        return RPC_MARGIN_S


def at_window_end(loop: Any) -> None:
    """The capture loop's hook: scan now if the capture asked for it; progress shows meanwhile."""
    config = loop.agent_config()
    if not config.get("leaks"):
        return
    loop.ui.phase("leak scan: stopping the world")
    budget = float(config.get("leaksBudget") or DEFAULT_BUDGET_S)
    wait = budget + _rpc_margin()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(loop.source.scan_leaks, config, wait)
        while not future.done():
            loop.drain(wait=0.1)
        try:
            future.result()
        except AgentTimeout:
            # A live target whose threads keep every CPU busy starves the agent's thread (issue 27:
            # 64 spinning threads, the scan's preparation alone 33 s): late, not hung and not
            # anti-debug.  The hooks still come out (the agent's stop runs once the scan is done,
            # with its own wait), and a result that arrives meanwhile is kept.
            said = (f"the leak scan did not finish within {wait:g} s (its budget and {wait - budget:g} s); "
                    "the capture has its result only if it arrives before the hooks are out")
            loop._notice(Notice({"message": said}, said))
    loop.drain(wait=0.05)


def leak_progress(p: dict[str, Any]) -> str:
    total = p.get("roots_total") or 0
    done = p.get("roots_done") or 0
    pct = f"{100 * done / total:.0f}%" if total else "?"
    return (f"leak scan: roots {pct} of {fmt_bytes(total)}, {fmt_bytes(p.get('blocks_scanned') or 0)} of blocks, "
            f"{(p.get('elapsed_ms') or 0) / 1000:.1f} s")
