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

iOS (DEVICE-UNVERIFIED, see docs/census-limit-jetsam.md): ``agents/limit.js`` in the target reads
phys_footprint (task_info(TASK_VM_INFO)) and ``os_proc_available_memory()``, and with --watch records
memory-pressure notifications from a dispatch source of its own; ``agents/census.js`` in frida-server's
root context reads the limits memorystatus_control gives only to root (apps get EPERM): the
memlimit properties, whether the process is managed, its priority entry.  :func:`combine` joins them:
the memorystatus limit is preferred, and ``os_proc_available_memory() == 0`` is taken as "unknown"
unless the process is managed (xnu returns 0 for unmanaged daemons and for anything over its limit).
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


# xnu bsd/sys/kern_memorystatus.h: the priority entry's state bit of a process in the foreground.
MEMORYSTATUS_ACTIVE = 0x080


def combine(target: dict[str, Any], root: dict[str, Any] | None) -> dict[str, Any]:
    """One iOS sample from the target's own figures and what root read for it (pure).

    ``available`` is os_proc_available_memory() only where it means something: a managed process's
    0 is "at or over its limit"; an unmanaged one's (a daemon's) 0 is "no answer".  The limit is the
    memorystatus one when root could read it -- the inactive limit for a process in the background
    (its priority entry's state lacks kMemorystatusActive: xnu applies the inactive limit then), the
    active one otherwise, else the priority list's -- or else footprint + available.
    """
    root = root or {}
    footprint = target.get("footprint")
    raw = target.get("available")
    managed = root.get("managed")
    errors = dict(target.get("errors") or {})
    errors.update({f"root:{k}": v for k, v in (root.get("errors") or {}).items()})
    state = root.get("state")
    background = isinstance(state, int) and not state & MEMORYSTATUS_ACTIVE
    memlimit = (root.get("inactive") if background else None) or root.get("active") or root.get("limit")
    available: int | None = raw
    available_source: str | None = "os_proc_available_memory" if raw is not None else None
    if raw == 0 and managed is not True:
        available, available_source = None, None
    if available is None and memlimit and isinstance(footprint, int):
        available, available_source = max(memlimit - footprint, 0), "memorystatus limit - footprint"
    if memlimit:
        limit, limit_source = memlimit, "memorystatus"
    elif isinstance(footprint, int) and available is not None:
        limit, limit_source = footprint + available, "footprint + os_proc_available_memory"
    else:
        limit, limit_source = None, None
    out = {
        "t": target.get("t"), "footprint": footprint, "footprint_peak": target.get("footprint_peak"),
        "available": available, "available_source": available_source, "os_proc_available_memory": raw,
        "limit": limit, "limit_source": limit_source, "managed": managed,
        "limit_bytes_remaining": target.get("limit_bytes_remaining"),
        "memlimit": {k: root.get(k) for k in ("active", "active_fatal", "inactive", "inactive_fatal")}
        if root else None,
        "priority": root.get("priority"), "errors": errors,
        "limit_kind": None if not memlimit else "inactive" if background and root.get("inactive") else "active",
    }
    return out


class IOSLimitProbe:
    """``agents/limit.js`` in the target and ``agents/census.js`` in frida-server's root context
    (``root_pid``, 0 = the system session); collects pressure notifications.  DEVICE-UNVERIFIED."""

    def __init__(self, device: Any, pid: int, root_pid: int = 0) -> None:
        self.pid = pid
        self.events: list[dict[str, Any]] = []
        self.detached: str | None = None
        self.root_error: str | None = None
        self.session, self.script = load_agent(device, pid, "limit")
        self.script.on("message", self._on_message)
        self.session.on("detached", self._on_detached)
        try:
            self.root_session, self.root_script = load_agent(device, root_pid, "census")
        except TargetError as e:
            self.root_session = self.root_script = None
            self.root_error = str(e)
        else:
            self.root_error = None

    def _on_message(self, message: dict[str, Any], data: Any) -> None:
        payload = message.get("payload") if message.get("type") == "send" else None
        if isinstance(payload, dict) and payload.get("type") == "limit:pressure":
            self.events.append({k: v for k, v in payload.items() if k != "type"})

    def _on_detached(self, reason: str, *rest: Any) -> None:
        self.detached = str(reason)

    def watch(self) -> list[str]:
        return list(self.script.exports_sync.watch())

    def root_limits(self) -> dict[str, Any]:
        if self.root_script is None:
            return {"errors": {"attach": self.root_error}}
        return dict(self.root_script.exports_sync.memlimit(self.pid))

    def sample(self) -> dict[str, Any]:
        s = combine(dict(self.script.exports_sync.sample()), self.root_limits())
        s["pid"] = self.pid
        return s

    def close(self) -> None:
        for script, session in ((self.script, self.session), (self.root_script, self.root_session)):
            if script is None:
                continue
            try:
                if script is self.script:
                    script.exports_sync.unwatch()      # its dispatch source's handler is the script's
                script.unload()
                session.detach()
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
