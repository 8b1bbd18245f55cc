"""How a capture ended, classified with its evidence (docs/domain/sessions.md, "How captures die").

Pure: the session hands over timings, the agent's last words and the rate
history; this module names the death and says why.  Thresholds are options.
Classes: completed, interrupted, target-exited, launch-storm, perpetual-stream,
slow-start, anti-debug, detached.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class DeathThresholds:
    storm_seconds: float = 10.0      # a death this soon after instrumentation can be a launch storm
    storm_rate: float = 20_000.0     # ... if allocation calls per second reached this
    stream_rate: float = 2_000.0     # a stream that never settles keeps at least this rate
    settle_fraction: float = 0.5     # "settled" = final rate below this fraction of the peak
    slow_start_calls: int = 0        # a window with no more calls than this is a slow start
    rpc_timeout: float = 20.0        # an agent silent this long is anti-debug


def classify_end(
    *,
    window: float,
    attach_delay: float,
    t_start: float | None,
    t_attach: float | None,
    t_gone: float | None,
    t_now: float,
    interrupted: bool,
    detach_reason: str | None,
    exit_info: dict[str, Any] | None,
    crash_info: dict[str, Any] | None,
    timeout_info: dict[str, Any] | None,
    rates: list[dict[str, Any]],
    thresholds: DeathThresholds,
    calls_total: int | None = None,
    exit_status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    alive = None
    if t_start is not None:
        alive = round((t_gone if t_gone is not None else t_now) - t_start, 3)
    recent = rates[-3:]
    peak = max((r["calls_per_s"] for r in rates), default=0.0)
    calls = calls_total if calls_total is not None else (rates[-1]["calls"] if rates else 0)
    mean_rate = calls / alive if alive else 0.0
    evidence: dict[str, Any] = {
        "alive_after_start_s": alive,
        "attach_delay_s": attach_delay,
        "window_s": window,
        "calls": calls,
        "mean_calls_per_s": round(mean_rate, 1),
        "peak_calls_per_s": round(max(peak, 0.0), 1),
        "last_rates": [{"t": r["t"], "calls_per_s": r["calls_per_s"]} for r in recent],
        "thresholds": asdict(thresholds),
    }
    if detach_reason:
        evidence["detach_reason"] = detach_reason
    if exit_info:
        evidence["exit"] = exit_info
    if crash_info:
        evidence["crash"] = crash_info
    if exit_status:
        evidence["exit_status"] = exit_status      # read by the host (a local child), see exitwatch

    def out(ended: str, reason: str) -> dict[str, Any]:
        return {"ended": ended, "reason": reason, "evidence": evidence}

    if timeout_info is not None:
        evidence["timeout"] = timeout_info
        return out("anti-debug", f"the agent did not answer {timeout_info['what']} within "
                                 f"{timeout_info['timeout_s']:g} s (script load or rpc hung)")
    if interrupted:
        return out("interrupted", "ended early by the user (Ctrl-C); data up to then is kept")
    if detach_reason in ("device-lost", "connection-terminated"):
        return out("detached", f"lost the device or its connection ({detach_reason})")
    if t_gone is None:
        if t_start is not None and calls <= thresholds.slow_start_calls:
            return out("slow-start", f"no traced activity in the {window:g} s window "
                                     f"(still starting, or idle); try a longer --attach-delay")
        return out("completed", f"the {window:g} s window completed")
    code = (exit_status or {}).get("exit_status")
    if exit_info is not None or code is not None:
        status = (exit_info or {}).get("status")
        status = code if status is None else status
        said = f"exit status {status}" if status is not None else "normal process exit"
        return out("target-exited", f"the target exited on its own ({said})")
    if t_attach is None:
        return out("target-exited", "the target ended before memtrace attached (during --attach-delay)")
    rate_at_death = max(mean_rate, recent[-1]["calls_per_s"] if recent else 0.0)
    if exit_status and exit_status.get("signal_name"):
        how = f"was killed by {exit_status['signal_name']}" + (" (core dumped)" if exit_status.get("core_dumped")
                                                               else "")
    else:
        how = "crashed" if crash_info else "was killed (no exit() seen: a signal such as SIGKILL, or a watchdog)"
    if t_start is None or (alive is not None and alive <= thresholds.storm_seconds
                           and max(rate_at_death, peak) >= thresholds.storm_rate):
        return out("launch-storm", f"the target {how} {alive if alive is not None else 0:g} s after "
                                   f"instrumentation under {max(rate_at_death, peak):,.0f} calls/s")
    settled = bool(recent) and recent[-1]["calls_per_s"] < thresholds.settle_fraction * peak
    if not settled and rate_at_death >= thresholds.stream_rate:
        evidence["confidence"] = "suspected"
        return out("perpetual-stream", f"the target {how} after {alive:g} s while its allocation rate "
                                       f"never settled ({rate_at_death:,.0f} calls/s); a second attempt at "
                                       f"another --attach-delay confirms it")
    return out("target-exited", f"the target {how} after {alive:g} s")
