"""How close a process is to its memory ceiling, and the device selection shared by census/limit/jetsam.

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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace.errors import InputError, TargetError

AGENTS_DIR = Path(__file__).parent / "agents"
FRIDA_REMOTE_PORT = 27042
UNLIMITED = None


# --- device selection ------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSpec:
    """``auto | local | usb | id:UDID | remote:HOST[:PORT]``."""

    kind: str
    udid: str | None = None
    host: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        if self.kind == "id":
            return f"id:{self.udid}"
        if self.kind == "remote":
            return f"remote:{self.host}" + (f":{self.port}" if self.port else "")
        return self.kind


def parse_device_spec(text: str) -> DeviceSpec:
    text = (text or "auto").strip()
    if text in ("auto", "local", "usb"):
        return DeviceSpec(text)
    if text.startswith("id:") and len(text) > 3:
        return DeviceSpec("id", udid=text[3:])
    if text.startswith("remote:") and len(text) > 7:
        host, sep, port = text[7:].rpartition(":")
        if not sep or not port.isdigit():
            host, port = text[7:], ""
        if not host:
            raise InputError(f"--device {text}: no host given")
        return DeviceSpec("remote", host=host, port=int(port) if port else None)
    raise InputError(f"--device {text}: expected auto, local, usb, id:UDID or remote:HOST[:PORT]")


def get_frida_device(spec: DeviceSpec, timeout: float = 5.0) -> Any:
    """The Frida device for ``spec``; ``auto`` prefers a USB device and falls back to local."""
    import frida

    try:
        if spec.kind == "local":
            return frida.get_local_device()
        if spec.kind == "usb":
            return frida.get_usb_device(timeout=timeout)
        if spec.kind == "id":
            return frida.get_device(spec.udid, timeout=timeout)
        if spec.kind == "remote":
            return frida.get_device_manager().add_remote_device(
                f"{spec.host}:{spec.port or FRIDA_REMOTE_PORT}")
        for device in frida.enumerate_devices():
            if device.type == "usb":
                return device
        return frida.get_local_device()
    except (frida.InvalidArgumentError, frida.TimedOutError, frida.ServerNotRunningError,
            frida.TransportError) as e:
        raise TargetError(f"--device {spec}: {e}") from e


def device_is_local(device: Any) -> bool:
    return getattr(device, "type", None) == "local"


def load_agent(device: Any, pid: int, agent: str) -> tuple[Any, Any]:
    """Attach to ``pid`` on ``device`` and load ``agents/<agent>.js``; returns (session, script)."""
    import frida

    source = (AGENTS_DIR / f"{agent}.js").read_text(encoding="utf-8")
    try:
        session = device.attach(pid)
    except (frida.ProcessNotFoundError, frida.PermissionDeniedError, frida.ProcessNotRespondingError,
            frida.NotSupportedError, frida.TransportError) as e:
        raise TargetError(f"cannot attach to pid {pid}: {e}") from e
    script = session.create_script(source, name=f"memtrace-{agent}")
    script.load()
    return session, script


def find_pid(device: Any, name: str) -> int:
    """The pid of the one process called ``name`` (exact match first, then case-insensitive)."""
    processes = device.enumerate_processes()
    exact = [p for p in processes if p.name == name]
    matches = exact or [p for p in processes if p.name.lower() == name.lower()]
    if not matches:
        raise TargetError(f"no process named {name!r} on {device.name}")
    if len(matches) > 1:
        pids = ", ".join(str(p.pid) for p in matches[:8])
        raise TargetError(f"{len(matches)} processes named {name!r} ({pids}); use --pid")
    return matches[0].pid
