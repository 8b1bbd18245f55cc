"""How close a process is to its memory ceiling.

Linux (``--device local``): computed from /proc and the cgroup filesystem, no injection:
footprint = RssAnon + VmSwap (the memory the kernel charges to the process and cannot drop
by evicting file pages; the closest analogue of Darwin's phys_footprint), and every bound
that can stop it growing:

- ``cgroup``: memory.max - memory.current (v2) or memory.limit_in_bytes - memory.usage_in_bytes (v1),
  the smallest over the process's cgroup and its ancestors;
- ``RLIMIT_AS``: soft limit - VmSize; ``RLIMIT_DATA``: soft limit - VmData (from /proc/PID/limits);
- ``MemAvailable``: the system's estimate, the last resort when nothing tighter applies.

The binding bound is the one with the least memory still available.

iOS: ``agents/limit.js`` runs in the target (DEVICE-UNVERIFIED, see docs/census-limit-jetsam.md):
phys_footprint from task_info(TASK_VM_INFO), ``os_proc_available_memory()``, and
memorystatus_control(GET_MEMLIMIT_PROPERTIES); with --watch it also records memory-pressure
notifications delivered to the process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrace.errors import TargetError
from memtrace.frida_host import load_agent

# --- Linux ------------------------------------------------------------------------------------


def parse_limits(text: str) -> dict[str, int | None]:
    """/proc/PID/limits -> {"Max address space": soft limit bytes or None (unlimited), ...}."""
    out: dict[str, int | None] = {}
    for line in text.splitlines()[1:]:
        # Columns are fixed-width: a name of up to 26 chars, then soft, hard, units.
        name, rest = line[:26].strip(), line[26:].split()
        if name and rest:
            out[name] = None if rest[0] == "unlimited" else (int(rest[0]) if rest[0].isdigit() else None)
    return out


def _mem_available(reader: Any, proc_root: Path) -> int | None:
    try:
        return _census().parse_kb_fields(reader(proc_root / "meminfo")).get("MemAvailable")
    except OSError:
        return None


def _census() -> Any:
    from memtrace import census

    return census


def linux_sample(pid: int, proc_root: Path = Path("/proc"), reader: Any = None,
                 scanner: Any = None) -> dict[str, Any]:
    """Footprint, every bound on growth, and the binding one, for one Linux process."""
    census = _census()
    reader = reader or census.read_text
    scanner = scanner or census.LinuxScanner(proc_root, reader)
    base = proc_root / str(pid)
    try:
        status_text = reader(base / "status")
        limits = parse_limits(reader(base / "limits"))
        cg = scanner.limit_for(pid)
    except (FileNotFoundError, ProcessLookupError):
        raise TargetError(f"pid {pid}: no such process (or it exited)") from None
    except PermissionError as e:
        raise TargetError(f"pid {pid}: cannot read {e.filename}: permission denied") from None
    status = census.parse_kb_fields(status_text)
    if "VmRSS" not in status:
        raise TargetError(f"pid {pid}: no address space (kernel thread or zombie)")
    footprint = status.get("RssAnon", 0) + status.get("VmSwap", 0)
    bounds: list[dict[str, Any]] = []
    if cg.limit is not None:
        used = cg.usage if cg.usage is not None else footprint
        bounds.append({"name": "cgroup", "limit": cg.limit, "used": used,
                       "available": max(cg.limit - used, 0),
                       "detail": f"cgroup v{cg.version} {cg.path} memory limit minus its charged usage"})
    for key, name, used_field in (("Max address space", "RLIMIT_AS", "VmSize"),
                                  ("Max data size", "RLIMIT_DATA", "VmData")):
        soft = limits.get(key)
        if soft is not None:
            used = status.get(used_field, 0)
            bounds.append({"name": name, "limit": soft, "used": used, "available": max(soft - used, 0),
                           "detail": f"soft limit minus {used_field}"})
    mem_available = _mem_available(reader, proc_root)
    if mem_available is not None:
        bounds.append({"name": "MemAvailable", "limit": footprint + mem_available, "used": footprint,
                       "available": mem_available, "detail": "system-wide estimate (/proc/meminfo)"})
    binding = min(bounds, key=lambda b: b["available"]) if bounds else None
    return {
        "t": time.time(),
        "pid": pid,
        "name": census.parse_status_name(status_text),
        "footprint": footprint,
        "available": binding["available"] if binding else None,
        # The footprint at which the binding bound stops growth (iOS: footprint + available).
        "limit": footprint + binding["available"] if binding else None,
        "binding": binding["name"] if binding else None,
        "bounds": bounds,
    }


# --- iOS --------------------------------------------------------------------------------------


class IOSLimitProbe:
    """``agents/limit.js`` in the target (DEVICE-UNVERIFIED); collects pressure notifications."""

    def __init__(self, device: Any, pid: int) -> None:
        self.pid = pid
        self.events: list[dict[str, Any]] = []
        self.detached: str | None = None
        self.session, self.script = load_agent(device, pid, "limit")
        self.script.on("message", self._on_message)
        self.session.on("detached", self._on_detached)

    def _on_message(self, message: dict[str, Any], data: Any) -> None:
        payload = message.get("payload") if message.get("type") == "send" else None
        if isinstance(payload, dict) and payload.get("type") == "limit:pressure":
            self.events.append({k: v for k, v in payload.items() if k != "type"})

    def _on_detached(self, reason: str, *rest: Any) -> None:
        self.detached = str(reason)

    def watch(self) -> list[str]:
        return list(self.script.exports_sync.watch())

    def sample(self) -> dict[str, Any]:
        s = dict(self.script.exports_sync.sample())
        s["pid"] = self.pid
        return s

    def close(self) -> None:
        try:
            self.script.unload()
            self.session.detach()
        except Exception:  # noqa: BLE001 - the target may already be gone; nothing left to free
            pass


# --- the series -------------------------------------------------------------------------------


def watch_series(sample: Callable[[], dict[str, Any]], seconds: float, interval: float,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> tuple[list[dict[str, Any]], str | None]:
    """Sample every ``interval`` s for ``seconds`` s; returns (series, why it stopped early or None)."""
    series: list[dict[str, Any]] = []
    start = clock()
    while True:
        try:
            s = sample()
        except TargetError as e:
            return series, str(e)
        series.append({"t": round(clock() - start, 3), "footprint": s.get("footprint"),
                       "available": s.get("available"), "limit": s.get("limit")})
        remaining = seconds - (clock() - start)
        if remaining <= 0:
            return series, None
        sleep(min(interval, remaining))


def limit_document(platform: str, first: dict[str, Any], series: list[dict[str, Any]] | None,
                   events: list[dict[str, Any]], stopped: str | None) -> dict[str, Any]:
    """The ``memtrace limit --json`` document (``"kind": "limit"``)."""
    doc = {"kind": "limit", "version": 1, "platform": platform, **first}
    doc.pop("t", None)
    if series is not None:
        doc["series"] = series
        doc["stopped"] = stopped
    if events:
        doc["pressure_events"] = events
    return doc
