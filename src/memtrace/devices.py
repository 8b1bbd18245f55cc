"""``--device``: the one resolver every command uses (tracers, census, limit, jetsam --pull).

    auto              a USB iOS device if one is attached (waiting briefly for one that is still
                      being enumerated), else this machine
    local             this machine (Frida's local device)
    usb               the USB device (waits up to the timeout)
    id:UDID           the device with that id
    remote:HOST[:PORT] a frida-server reachable over the network (default port 27042)

frida-tools' flags are accepted by the tracer commands as aliases (``-U``, ``-R``, ``-D ID``,
``-H HOST``): :func:`spec_from_frida_flags` turns them into a spec string.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memtrace.errors import InputError, TargetError
from memtrace.errors import first_line as _first_line

FRIDA_REMOTE_PORT = 27042
# How long `auto` waits for a USB device that is attached but not yet enumerated: usbmuxd reports
# a device once it has its lockdown pairing answered, a moment after the cable goes in, and
# falling back to local then would trace the wrong machine.  Only where a usbmuxd runs (without
# one no iPhone can appear, and local runs should not pay the wait).
AUTO_USB_WAIT = 1.5
AUTO_USB_POLL = 0.1
USBMUXD_SOCKET = "/var/run/usbmuxd"     # Linux and macOS; Windows' usbmuxd listens on TCP 27015
DEVICE_CHOICES = "auto|local|usb|id:UDID|remote:HOST[:PORT]"


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed ``--device`` value."""

    kind: str                    # auto | local | usb | id | remote
    udid: str | None = None
    host: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        if self.kind == "id":
            return f"id:{self.udid}"
        if self.kind == "remote":
            return f"remote:{self.host}" + (f":{self.port}" if self.port else "")
        return self.kind


def parse_device_spec(text: str | None) -> DeviceSpec:
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


def spec_from_frida_flags(device: str | None, usb: bool, remote: bool, device_id: str | None,
                          host: str | None) -> str:
    """frida-tools' ``-U`` / ``-R`` / ``-D ID`` / ``-H HOST`` as a ``--device`` spec (one at most)."""
    given = [f for f, on in (("-U", usb), ("-R", remote), ("-D", device_id is not None), ("-H", host is not None))
             if on]
    if len(given) > 1:
        raise InputError(f"give only one of {', '.join(given)}")
    if given and device not in (None, "auto"):
        raise InputError(f"--device {device} and {given[0]}: give only one")
    if usb:
        return "usb"
    if remote:
        return "remote:127.0.0.1"
    if device_id is not None:
        # frida-tools' -D takes a bare id; memtrace's own spellings are accepted too.
        return device_id if device_id in ("local", "usb") or ":" in device_id else f"id:{device_id}"
    if host is not None:
        return f"remote:{host}"
    return device or "auto"


def resolve(spec: DeviceSpec | str, timeout: float = 5.0) -> Any:
    """The Frida device for ``spec``; errors name the spec and what went wrong, in one line."""
    import frida

    if isinstance(spec, str):
        spec = parse_device_spec(spec)
    try:
        if spec.kind == "local":
            return frida.get_local_device()
        if spec.kind == "usb":
            return frida.get_usb_device(timeout=timeout)
        if spec.kind == "id":
            return frida.get_device(spec.udid or "", timeout=timeout)
        if spec.kind == "remote":
            device = frida.get_device_manager().add_remote_device(f"{spec.host}:{spec.port or FRIDA_REMOTE_PORT}")
            # Adding a remote device does not connect: ask it something now, so an unreachable
            # frida-server is one clear line here rather than a traceback at first use.
            device.query_system_parameters()
            return device
        return _auto(frida)
    except device_errors(frida) as e:
        hint = " (is frida-server running there, on that port?)" if spec.kind == "remote" else ""
        raise TargetError(f"--device {spec}: {_first_line(e)}{hint}") from None


def device_errors(frida: Any) -> tuple[type[BaseException], ...]:
    """What Frida raises when a device cannot be found or reached."""
    return (frida.InvalidArgumentError, frida.TimedOutError, frida.ServerNotRunningError, frida.TransportError,
            frida.NotSupportedError, frida.ProtocolError, frida.PermissionDeniedError, frida.InvalidOperationError)


def usbmuxd_present() -> bool:
    """Could a USB iOS device show up here at all?  (usbmuxd is how Frida sees one.)"""
    return sys.platform == "win32" or os.path.exists(os.environ.get("USBMUXD_SOCKET_ADDRESS", USBMUXD_SOCKET))


def _auto(frida: Any, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
          usbmuxd: Callable[[], bool] = usbmuxd_present) -> Any:
    wait = AUTO_USB_WAIT if usbmuxd() else 0.0
    deadline = clock() + wait
    while True:
        for device in frida.enumerate_devices():
            if device.type == "usb":
                return device
        if clock() >= deadline:
            return frida.get_local_device()
        sleep(AUTO_USB_POLL)


def is_local(device: Any) -> bool:
    return getattr(device, "type", None) == "local"


def describe(device: Any) -> dict[str, Any]:
    """Who the device is, for a capture's RECON record: id, name, type, OS, platform, arch."""
    import socket

    import frida

    info: dict[str, Any] = {"id": device.id, "name": device.name, "type": device.type}
    try:
        params = device.query_system_parameters()
        info["os"] = params.get("os", {})
        info["platform"] = params.get("platform")
        info["arch"] = params.get("arch")
        if params.get("hardware"):
            info["hardware"] = params["hardware"]       # an iPhone's model: which DeviceSupport folder
        info["hostname"] = params.get("name") or socket.gethostname()
    except (frida.NotSupportedError, frida.InvalidOperationError):
        pass
    except (frida.ServerNotRunningError, frida.TransportError, frida.TimedOutError, frida.ProtocolError) as e:
        raise TargetError(f"device {device.name}: {_first_line(e)}") from None
    return info


def platform_of(device: Any) -> str | None:
    """What the device runs (``darwin``, ``linux``, ...) as Frida reports it; None if it cannot say."""
    import frida

    try:
        return device.query_system_parameters().get("platform")
    except (frida.NotSupportedError, frida.InvalidOperationError):
        return None
    except device_errors(frida) as e:
        raise TargetError(f"device {device.name}: {_first_line(e)}") from None


def list_devices() -> str:
    """The devices Frida sees, for an error message: ``local (Local System), usb:abc (iPhone)``."""
    import frida

    try:
        found = frida.enumerate_devices()
    except Exception:  # noqa: BLE001 -- only decorates an error message
        return "none could be listed"
    # Frida's built-in "socket" and "barebone" (GDB stub) entries are never what the user means.
    shown = [f"{d.type}:{d.id} ({d.name})" if d.type != "local" else f"local ({d.name})"
             for d in found if d.type in ("local", "usb", "remote") and d.id not in ("socket", "barebone")]
    return ", ".join(shown) or "none"


def require_ios_for_app(device: Any, app: str) -> None:
    """``--app`` names an iOS app: on this machine there is none to launch or attach to."""
    if is_local(device):
        raise TargetError(f"--app {app}: --app needs an iOS device (this is the local device); devices found: "
                          f"{list_devices()}. Choose one with --device usb|id:UDID|remote:HOST, or trace a "
                          f"program here with -- PROGRAM ARGS")


def find_pid(device: Any, name: str) -> int:
    """The pid of the one process called ``name`` (exact match first, then case-insensitive)."""
    processes = device.enumerate_processes()
    exact = [p for p in processes if p.name == name]
    matches = exact or [p for p in processes if p.name.lower() == name.lower()]
    if not matches:
        raise TargetError(f"--name {name}: no running process with that name on {device.name}")
    if len(matches) > 1:
        pids = ", ".join(str(p.pid) for p in sorted(matches, key=lambda p: p.pid)[:12])
        raise TargetError(f"--name {name}: {len(matches)} processes have that name (pids {pids}); "
                          f"choose one with --pid")
    return matches[0].pid


