"""``memtrace limit`` on a stock iPhone: footprint over time, memory-pressure messages, and the limit
this device model has been seen to kill at.

- Footprint: Instruments' Sysmontap samples the process from outside (``physFootprint``).
- Pressure: the device's live log (os_trace_relay, what Console.app shows): UIKit's "Received memory
  warning" in the app, and the kernel's memorystatus lines that name the process (a jetsam kill, a
  pressure level change).
- The limit: without a jailbreak nothing on the device tells a process's memorystatus limit, so it
  is read from history -- the device's own JetsamEvent reports (crash reports, no jailbreak needed):
  the footprints at which processes of this model were killed for ``per-process-limit``
  (``analyze/jetsam.py``'s ``limit_by_model``).  The document says where the number comes from.

Same interface as ``limit.IOSLimitProbe`` (``sample``, ``watch``, ``events``, ``detached``,
``close``), so the command and the series code are shared.  DEVICE-UNVERIFIED.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from memtrace.dvt.loop import ServiceLoop
from memtrace.errors import TargetError, first_line

T = TypeVar("T")
CALL_TIMEOUT_S = 30.0
SAMPLE_MS = 500

# What the live log says when memory runs short (message text, lowercased; first match wins).
PRESSURE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("jetsam", re.compile(r"memorystatus.*(kill|jettison)|jetsam.*kill")),
    ("warning", re.compile(r"received memory warning|didreceivememorywarning")),
    ("critical", re.compile(r"memorystatus.*(critical|pressure level.*(4|critical))")),
    ("warn", re.compile(r"memorystatus.*(warn|pressure level.*(2|warn))")),
)


def classify(message: str) -> str | None:
    text = message.lower()
    for name, pattern in PRESSURE_PATTERNS:
        if pattern.search(text):
            return name
    return None


def limit_from_history(jetsam_doc: dict[str, Any], product: str | None) -> tuple[int | None, str | None]:
    """The smallest footprint this model was killed at for per-process-limit (a limit then in force),
    and how it was found."""
    for row in jetsam_doc.get("limit_by_model") or []:
        if product is not None and row.get("product") == product:
            return int(row["footprint_min"]), (f"JetsamEvent history: {row['kills']} per-process-limit kill(s) on "
                                                f"{product} (min {row['footprint_min']:,} B, median "
                                                f"{row['footprint_median']:,} B)")
    return None, None


class StockLimitProbe:
    def __init__(self, udid: str | None, pid: int, api_factory: Callable[[], SimpleNamespace] | None = None,
                 history: bool = True) -> None:
        if api_factory is None:
            from memtrace.dvt.api import dvt_api

            api_factory = dvt_api
        self.api = api_factory()
        self.udid = udid
        self.pid = pid
        self.events: list[dict[str, Any]] = []
        self.detached: str | None = None
        self.latest: dict[str, Any] | None = None
        self.product: str | None = None
        self.limit: int | None = None
        self.limit_source: str | None = None
        self.errors: dict[str, str] = {}
        self._stack = contextlib.AsyncExitStack()
        self._service = ServiceLoop("memtrace-dvt-limit")
        self._tasks: list[asyncio.Future[Any]] = []
        self._first = threading.Event()
        self._provider: Any = None
        self._run(self._open(), "connecting to the device's developer services")
        if history:
            self._history()

    def _run(self, coro: Coroutine[Any, Any, T], what: str, timeout: float = CALL_TIMEOUT_S) -> T:
        return self._service.run(coro, timeout, what)

    async def _open(self) -> None:
        from memtrace import launchers

        api = self.api
        if self.udid is None:
            probe = await api.create_using_usbmux(serial=None, **launchers.NO_AUTOPAIR)
            self.udid = str(probe.udid)
            await launchers._close(probe)
        provider = await self._stack.enter_async_context(launchers._Pmd3Session(api, str(self.udid)))
        self._provider = provider
        self.product = getattr(provider, "product_type", None)
        await launchers._mount_developer_image(api, provider)
        dvt = await self._stack.enter_async_context(api.DvtProvider(provider))
        tap = await api.Sysmontap.create(dvt, interval=SAMPLE_MS)
        await self._stack.enter_async_context(tap)
        self._tasks.append(asyncio.ensure_future(self._sysmon(tap)))

    async def _sysmon(self, tap: Any) -> None:
        try:
            async for entries in tap.iter_processes():
                row = next((e for e in entries if e.get("pid") == self.pid), None)
                if row is not None:
                    self.latest = row
                    self._first.set()
                elif entries and self.latest is not None:
                    self.detached = "the process is no longer in Sysmontap's samples (it exited or was killed)"
                    self._first.set()
                    return
                elif entries:
                    self._first.set()
        except Exception as e:  # noqa: BLE001 -- the tap broke: say so in the document
            self.detached = f"Sysmontap stopped: {first_line(e)}"
            self._first.set()

    def _history(self) -> None:
        """The limit from the device's JetsamEvent reports (pulled into a temporary folder)."""
        from memtrace import ios
        from memtrace.analyze import jetsam

        with tempfile.TemporaryDirectory(prefix="memtrace-jetsam-") as tmp:
            try:
                paths = ios.pull_jetsam_reports(ios.DeviceTarget(udid=self.udid), Path(tmp))
                reports = [jetsam.parse_report(p.read_text(errors="replace"), p.name) for p in paths]
            except Exception as e:  # noqa: BLE001 -- history is a help, not a requirement
                self.errors["limit"] = f"no JetsamEvent history: {first_line(e)}"
                return
        self.limit, self.limit_source = limit_from_history(jetsam.aggregate(reports), self.product)
        if self.limit is None:
            self.errors["limit"] = (f"no per-process-limit kill of a {self.product or 'this model'} in the device's "
                                    f"{len(reports)} JetsamEvent report(s); a stock device does not tell the limit")

    def watch(self) -> list[str]:
        self._service.soon(lambda: self._tasks.append(asyncio.ensure_future(self._syslog())))
        return ["syslog"]

    async def _syslog(self) -> None:
        try:
            async with self.api.OsTraceService(self._provider) as trace:
                async for entry in trace.syslog():
                    kind = classify(entry.message)
                    if kind is None:
                        continue
                    mine = entry.pid == self.pid or str(self.pid) in entry.message
                    if not mine:
                        continue
                    fp = self.latest.get("physFootprint") if self.latest else None
                    self.events.append({"event": kind, "via": "syslog", "footprint": fp, "available": None,
                                        "t": time.time(), "message": entry.message[:300]})
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 -- no pressure messages: say so
            self.errors["pressure"] = f"no live log: {first_line(e)}"

    def sample(self) -> dict[str, Any]:
        if not self._first.wait(CALL_TIMEOUT_S):
            raise TargetError("Sysmontap sent no sample")
        if self.detached is not None:
            raise TargetError(self.detached)
        if self.latest is None:
            raise TargetError(f"pid {self.pid}: not among the device's processes (Sysmontap)")
        row = self.latest
        footprint = row.get("physFootprint")
        available = self.limit - footprint if self.limit is not None and isinstance(footprint, int) else None
        return {"pid": self.pid, "name": row.get("name"), "footprint": footprint, "available": available,
                "limit": self.limit, "limit_source": self.limit_source, "source": "sysmontap",
                "compressed": row.get("memCompressed"), "errors": dict(self.errors)}

    def close(self) -> None:
        async def shut() -> None:
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(BaseException):
                    await task
            with contextlib.suppress(Exception):
                await self._stack.aclose()

        self._service.close(shut)
