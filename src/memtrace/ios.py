"""pymobiledevice3 boundary: pull JetsamEvent reports from an iOS device.

pymobiledevice3 (v8+) is asyncio throughout: ``create_using_usbmux``/``create_using_tcp`` are
coroutines returning a lockdown client (an async context manager), and ``CrashReportsManager``
must be used with ``async with``; its ``ls(path, depth)`` and ``pull(out, entry, ...)`` are
coroutines; ``flush()`` asks the crash report mover to move pending reports into the folder first.
One ``asyncio.run`` drives the whole pull so nothing leaks between event loops.

Tests replace the two factories (``lockdown_factory``, ``manager_factory``); nothing else here
talks to a device.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from memtrace.errors import TargetError

JETSAM_NAME = re.compile(r"^JetsamEvent.*\.ips$")
LOCKDOWN_PORT = 62078
# Reports live at the top of the crash-report folder; older devices move them to Retired/.
LIST_DEPTH = 2

LockdownFactory = Callable[["DeviceTarget"], Awaitable[Any]]
ManagerFactory = Callable[[Any], Any]


class DeviceTarget:
    """Where a lockdown client connects: usbmux (first device or one UDID) or TCP."""

    def __init__(self, udid: str | None = None, host: str | None = None, port: int | None = None) -> None:
        self.udid = udid
        self.host = host
        self.port = port

    def __repr__(self) -> str:
        if self.host:
            return f"remote:{self.host}:{self.port or LOCKDOWN_PORT}"
        return f"id:{self.udid}" if self.udid else "usb"


async def _default_lockdown(target: DeviceTarget) -> Any:
    from pymobiledevice3.lockdown import create_using_tcp, create_using_usbmux

    if target.host:
        return await create_using_tcp(hostname=target.host, port=target.port or LOCKDOWN_PORT)
    return await create_using_usbmux(serial=target.udid)


def _default_manager(lockdown: Any) -> Any:
    from pymobiledevice3.services.crash_reports import CrashReportsManager

    return CrashReportsManager(lockdown)


async def _pull(target: DeviceTarget, out: Path, lockdown_factory: LockdownFactory,
                manager_factory: ManagerFactory) -> list[Path]:
    lockdown = await lockdown_factory(target)
    pulled: list[Path] = []
    async with lockdown, manager_factory(lockdown) as manager:
        # Reports still pending (a kill moments ago) are moved into the folder first, as the
        # crash report mover does for Xcode.
        await manager.flush()
        entries = await manager.ls("/", LIST_DEPTH)
        for entry in sorted(entries):
            name = posixpath.basename(entry)
            if not JETSAM_NAME.match(name):
                continue
            # pull() of a single file into an existing directory writes <out>/<basename>.
            await manager.pull(str(out), entry=entry, erase=False, progress_bar=False)
            local = out / name
            if local.is_file():
                pulled.append(local)
    return pulled


def pull_jetsam_reports(target: DeviceTarget, out: Path, *,
                        lockdown_factory: LockdownFactory | None = None,
                        manager_factory: ManagerFactory | None = None) -> list[Path]:
    """Copy every ``JetsamEvent*.ips`` from the device's crash reports into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        return asyncio.run(_pull(target, out, lockdown_factory or _default_lockdown,
                                 manager_factory or _default_manager))
    except TargetError:
        raise
    except Exception as e:  # pymobiledevice3 raises many unrelated types; the user needs one line.
        first = (str(e).splitlines() or [""])[0] or type(e).__name__
        raise TargetError(f"cannot pull crash reports from {target!r}: {first}") from e
