"""How a capture ended, classified with its evidence (docs/domain/sessions.md, "How captures die").

Pure: the session hands over timings, the agent's last words and the rate
history; this module names the death and says why.  Thresholds are options.
Classes: completed, interrupted, target-exited, launch-storm, perpetual-stream,
slow-start, anti-debug, starved, detached.

Every death names what is known of it: the exit status or the signal (read by the host,
``exitwatch``), the crash the agent's exception handler saw (signal, faulting address, the
crashing thread's top frames), an exec that replaced the process, or a kill during injection.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from memtrace.priority import MACHINE_LOAD


@dataclass
class DeathThresholds:
    storm_seconds: float = 10.0      # a death this soon after instrumentation can be a launch storm
    storm_rate: float = 20_000.0     # ... if allocation calls per second reached this
    stream_rate: float = 2_000.0     # a stream that never settles keeps at least this rate
    settle_fraction: float = 0.5     # "settled" = final rate below this fraction of the peak
    slow_start_calls: int = 0        # a window with no more calls than this is a slow start
    rpc_timeout: float = 20.0        # an agent silent this long is anti-debug (or starved: the CPUs busy)


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
    exec_info: dict[str, Any] | None = None,
    stage: str | None = None,
    window_end: str | None = None,
) -> dict[str, Any]:
    """``stage``: what memtrace was doing to the target when it ended (spawn, attach delay,
    injection, agent load, window, detach); a death names it.  ``window`` is inf for a program run
    to its end; ``window_end`` what became of a target still alive when the window ended ("killed",
    "left running")."""
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
        "window_s": None if window == float("inf") else window,
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
        evidence["exit_status"] = exit_status      # read by the host (a local process), see exitwatch
    if exec_info:
        evidence["exec"] = exec_info
    if stage and t_gone is not None:
        evidence["stage"] = stage

    def out(ended: str, reason: str) -> dict[str, Any]:
        return {"ended": ended, "reason": reason, "evidence": evidence}

    if timeout_info is not None:
        evidence["timeout"] = timeout_info
        starved = timeout_info.get("starved")
        if starved:
            return out("starved", f"the agent did not answer {timeout_info['what']} within "
                                  f"{timeout_info['timeout_s']:g} s: {_starved_why(starved)} kept memtrace's "
                                  "threads from running (not anti-debug: the target ran all along)")
        return out("anti-debug", f"the agent did not answer {timeout_info['what']} within "
                                 f"{timeout_info['timeout_s']:g} s (script load or rpc hung)")
    if interrupted:
        return out("interrupted", "ended early by the user (Ctrl-C); data up to then is kept")
    if detach_reason in ("device-lost", "connection-terminated"):
        return out("detached", f"lost the device or its connection ({detach_reason})")
    if detach_reason == "channel-lost":
        fate = "" if not window_end else f"; the target {window_end}" if window_end.startswith("exited") \
            else f"; the target was {window_end}"
        return out("detached", f"lost the channel to the agent after {alive:g} s: the target closed Frida's "
                               "descriptors itself (the close system call made directly, which memtrace cannot "
                               f"intercept); data up to then is kept{fate}")
    if t_gone is None:
        # The window, not the target, ended the capture: said as such, with what became of it.
        cut = f"window ended after {window:g} s"
        if window_end:
            evidence["window_end"] = {"after_s": window, "target": window_end}
            cut += f"; the target was {window_end}"
        if t_start is not None and calls <= thresholds.slow_start_calls:
            return out("slow-start", f"no traced activity before the {cut} "
                                     f"(still starting, or idle); try a longer --attach-delay")
        return out("completed", cut)
    if exec_info is not None and detach_reason == "process-replaced":
        return out("target-exited", _replaced(exec_info, alive, exit_status))
    code = (exit_status or {}).get("exit_status")
    signalled = bool((exit_status or {}).get("signal_name"))
    if code is not None or (exit_info is not None and not signalled):
        status = code if code is not None else (exit_info or {}).get("status")
        said = f"exit status {status}" if status is not None else "normal process exit; status unknown"
        return out("target-exited", f"the target exited on its own ({said}){_untraced(t_start, t_attach, stage)}")
    how = death_how(exit_status, crash_info)
    if t_start is None:
        # Attached, but the agent never started: nothing ran under our hooks, so no storm.
        storm = "" if t_attach is None else " (not a launch storm: nothing ran under the hooks)"
        return out("target-exited", f"the target {how}{_untraced(t_start, t_attach, stage)}{storm}")
    rate_at_death = max(mean_rate, recent[-1]["calls_per_s"] if recent else 0.0)
    if alive is not None and alive <= thresholds.storm_seconds and max(rate_at_death, peak) >= thresholds.storm_rate:
        return out("launch-storm", f"the target {how} {alive:g} s after "
                                   f"instrumentation under {max(rate_at_death, peak):,.0f} calls/s")
    settled = bool(recent) and recent[-1]["calls_per_s"] < thresholds.settle_fraction * peak
    if not settled and rate_at_death >= thresholds.stream_rate:
        evidence["confidence"] = "suspected"
        return out("perpetual-stream", f"the target {how} after {alive:g} s while its allocation rate "
                                       f"never settled ({rate_at_death:,.0f} calls/s); a second attempt at "
                                       f"another --attach-delay confirms it")
    during = " (during detach)" if stage == "detach" else ""
    return out("target-exited", f"the target {how} after {alive:g} s{during}")


def _untraced(t_start: float | None, t_attach: float | None, stage: str | None) -> str:
    """For a target gone before the agent started: when, said after how it ended."""
    if t_start is not None:
        return ""
    if t_attach is None:
        during = f" during {stage}" if stage in ("spawn", "injection", "attach delay") else ""
        return f"{during} before memtrace attached"
    return f" during {stage or 'injection'}, before the agent started"


CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGTRAP", "SIGSYS"})


def death_how(exit_status: dict[str, Any] | None, crash_info: dict[str, Any] | None) -> str:
    """How a process that did not exit on its own died: "was killed by SIGKILL", "crashed with
    SIGSEGV at 0x0 in f (m) <- g (m) (core dumped)", or that the signal is unknown."""
    name = (exit_status or {}).get("signal_name")
    crash = crash_info or {}
    if name is None and crash.get("signal"):
        name = crash["signal"]          # the agent's exception handler saw it (no host status)
    dumped = " (core dumped)" if (exit_status or {}).get("core_dumped") else ""
    if name is None:
        if crash:
            return f"crashed{_crash_where(crash)}"
        return "was killed (no exit() seen; the signal is unknown: SIGKILL or a watchdog, say)"
    if name in CRASH_SIGNALS or (crash and not exit_status):
        return f"crashed with {name}{_crash_where(crash)}{dumped}"
    return f"was killed by {name}{dumped}"


def _crash_where(crash: dict[str, Any]) -> str:
    if not crash:
        return ""
    text = ""
    memory = crash.get("memory") or {}
    if memory.get("address"):
        text += f" ({memory.get('operation') or 'access'} of {memory['address']})"
    frames = crash.get("top") or []
    if frames:
        text += " in " + " <- ".join(frames)
    elif crash.get("address"):
        text += f" at {crash['address']}" + (f" ({crash['module']})" if crash.get("module") else "")
    return text


def _replaced(exec_info: dict[str, Any], alive: float | None, exit_status: dict[str, Any] | None) -> str:
    path = exec_info.get("path") or "?"
    text = f"the target replaced itself: exec of {path}"
    if alive is not None:
        text += f" after {alive:g} s"
    text += " (process-replaced)"
    if exec_info.get("followed"):
        return text + f"; traced on in {exec_info['followed']}"
    text += "; not followed (--follow-children traces it), its output passed through"
    if exit_status and exec_info.get("outlived_window") is not True:
        if "exit_status" in exit_status:
            text += f"; it then exited with exit status {exit_status['exit_status']}"
        else:
            text += f"; it then {death_how(exit_status, None)}"
    elif exec_info.get("outlived_window"):
        text += "; it was still running at the end of the window"
    return text


def _starved_why(starved: dict[str, Any]) -> str:
    """Who kept the CPUs busy, from memtrace.priority.starvation's evidence."""
    said = []
    if starved.get("target_runnable_threads", 0) > starved.get("target_cpus", 0):
        said.append(f"the target's {starved['target_runnable_threads']} runnable threads on "
                    f"{starved['target_cpus']} CPUs")
    load, cpus = starved.get("load_1min"), starved.get("machine_cpus", 1)
    if load is not None and (not said or load > MACHINE_LOAD * cpus):
        said.append(f"the machine's load ({load:g} on {cpus} CPUs)")
    return " and ".join(said)
