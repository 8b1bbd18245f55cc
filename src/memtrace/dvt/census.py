"""``memtrace census`` on a stock iPhone: every process's memory from Instruments' Sysmontap.

Sysmontap samples every process from outside, as Instruments' Activity Monitor does: nothing is
injected and no jailbreak is needed (Developer Mode; iOS 17+ through tunneld).  One sample gives,
per process, ``physFootprint`` (the footprint jetsam judges), ``memCompressed``, ``memPurgeable``
(purgeable memory the process holds) and ``memResidentSize``.  What it does not give are the
jetsam priority (band) and the per-process limit: the kernel answers those only to a process with
memorystatus rights (frida-server's census agent on a jailbroken device), so they are ``null``
here and the document says so in one line.

DEVICE-UNVERIFIED: the attribute names are those Sysmontap's DeviceInfo lists on iOS 15-18 as
pymobiledevice3 11.45 decodes them; never run against a device.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from memtrace.analyze import census as analysis
from memtrace.errors import MemtraceError, TargetError
from memtrace.errors import first_line as _first_line

SAMPLE_TIMEOUT_S = 30.0
INTERVAL_MS = 500
MISSING_NOTE = ("stock device (Instruments' Sysmontap, no jailbreak): no jetsam bands or limits -- the kernel "
                "gives those only to a process with memorystatus rights (a jailbroken device's frida-server)")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def rows_from_sysmon(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sysmontap's per-process attribute dicts as census rows."""
    rows = []
    for e in entries:
        pid = e.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            continue
        footprint = _int(e.get("physFootprint"))
        rows.append({
            "pid": pid, "name": e.get("name") if isinstance(e.get("name"), str) else None,
            "status": "ok" if footprint is not None else "partial",
            "footprint": footprint, "lifetime_max": None,
            "purgeable_volatile": _int(e.get("memPurgeable")), "purgeable_nonvolatile": None,
            "compressed": _int(e.get("memCompressed")), "rss": _int(e.get("memResidentSize")),
            "reusable": None, "graphics": None, "pss": None, "swap": None,
            "priority": None, "band": None, "limit": None, "limit_source": None,
        })
    return rows


async def sample(api: SimpleNamespace, udid: str | None, interval_ms: int = INTERVAL_MS) -> tuple[list[dict[str, Any]],
                                                                                                  dict[str, Any]]:
    """One Sysmontap sample of every process, and the device it came from."""
    from memtrace import launchers

    if udid is None:
        probe = await api.create_using_usbmux(serial=None, **launchers.NO_AUTOPAIR)
        udid = str(probe.udid)
        await launchers._close(probe)
    async with launchers._Pmd3Session(api, udid) as provider:
        await launchers._mount_developer_image(api, provider)
        device = {"id": udid, "name": getattr(provider, "product_type", None) or "iOS device", "type": "usb",
                  "os_version": getattr(provider, "product_version", None), "source": "sysmontap"}
        async with api.DvtProvider(provider) as dvt:
            tap = await api.Sysmontap.create(dvt, interval=interval_ms)
            async with tap:
                async for entries in tap.iter_processes():
                    if entries:
                        return entries, device
    raise TargetError("Sysmontap sent no process sample")


def census_stock(udid: str | None, api_factory: Callable[[], SimpleNamespace] | None = None) -> dict[str, Any]:
    """The census document from a stock device (see :mod:`memtrace.analyze.census`)."""
    if api_factory is None:
        from memtrace.dvt.api import dvt_api

        api_factory = dvt_api
    api = api_factory()
    try:
        entries, device = asyncio.run(asyncio.wait_for(sample(api, udid), SAMPLE_TIMEOUT_S))
    except MemtraceError:
        raise
    except TimeoutError:
        raise TargetError(f"Sysmontap: no sample in {SAMPLE_TIMEOUT_S:g} s") from None
    except Exception as e:  # noqa: BLE001 -- the service's failure, one line
        first = _first_line(e)
        raise TargetError(f"Sysmontap (Instruments) could not sample the device: {first}") from None
    rows = rows_from_sysmon(entries)
    return {
        "kind": "census", "version": analysis.FORMAT_VERSION, "platform": "darwin", "device": device,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "host_pid": None,
        "rows": rows, "totals": analysis.totals(rows), "errors": {},
        "notes": [MISSING_NOTE, "DEVICE-UNVERIFIED: Sysmontap attributes as pymobiledevice3 11.45 decodes them; "
                                "purgeable = memPurgeable, compressed = memCompressed"],
    }
