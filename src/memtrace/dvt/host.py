"""``memtrace malloc --backend dvt``: a RecordSource (memtrace.record_source) over Instruments' services.

No agent is injected.  The app is launched through DVT process control with the environment the
Allocations service prepares (its recording library loads into the app as it starts), attached
to, and resumed; the service then streams every malloc, realloc and free with its backtrace.
:class:`~memtrace.dvt.allocations.EventTranslator` turns the stream into the agent's own
``--events`` records, sent to the loop every 100 ms as ``events:batch`` records, so the loop
writes, watches and ends the capture exactly as it does for Frida (window, Ctrl-C, death
evidence, END).  ``--leaks`` asks the Leaks service for the device's own memory graph at the
window's end and sorts the recorded live blocks into leaked and still reachable by its verdict.

What the services cannot give, said in the capture's RECON (``info.covers``) and the summary:
recording starts at launch (no attach to a running app); no per-stack aggregates in the target, so
the peak and temporaries come from the event stream; stacks are symbolized on the host (the
device's symbols: ``memtrace symbolize --symbols``).

pymobiledevice3 is asyncio throughout; one event loop on a thread of its own owns every client,
and the loop's synchronous calls wait for it with deadlines.  DEVICE-UNVERIFIED (see
:mod:`memtrace.dvt`).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import Awaitable, Callable, Coroutine
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

from memtrace import devices
from memtrace.dvt.allocations import EventTranslator
from memtrace.dvt.loop import ServiceLoop
from memtrace.errors import InputError, MemtraceError, TargetError
from memtrace.errors import first_line as _first_line
from memtrace.launchers import Launched
from memtrace.record_source import ConfigFor, Ended, Instrumented, Notice, Records, RecordSource, SourceEvent

T = TypeVar("T")

FLUSH_S = 0.1               # as the agents: a batch (or a sign of life) every 100 ms
CONNECT_TIMEOUT_S = 30.0    # lockdown, tunnel, developer disk image, DVT channels
CALL_TIMEOUT_S = 15.0       # one service request
LEAKS_TIMEOUT_S = 120.0     # the device builds a whole memory graph
MODULES_AFTER_S = 0.5       # after the resume, when dyld has mapped the app's images
COVERS = ("launch-time recording through Instruments' Allocations service: every malloc, realloc and free "
          "from the app's launch, with backtraces; no attach to a running app")



class DvtHost:
    """A RecordSource whose "agent" is the device's Allocations service."""

    def __init__(self, target: Any, rpc_timeout: float, api_factory: Callable[[], SimpleNamespace] | None = None,
                 with_vm: bool = False, tracer: str | None = None) -> None:
        if not target.app:
            raise InputError("--backend dvt launches an app through Instruments: give --app BUNDLE_ID")
        if target.pid is not None or target.name is not None or target.argv:
            raise InputError("--backend dvt records from an app's launch: give --app BUNDLE_ID, not --pid/--name/PROGRAM")
        self.target = target
        # The one tracer whose records Instruments' Allocations gives (the registry entry that
        # returns this host names itself); None: whichever loads first.
        self.tracer = tracer
        self.rpc_timeout = rpc_timeout
        self._api_factory = api_factory
        self.events: queue.Queue[SourceEvent] = queue.Queue()
        self.translator = EventTranslator()
        self.with_vm = with_vm
        self.launched: Launched | None = None
        self.gone: str | None = None
        self.udid: str | None = None
        self._api: SimpleNamespace | None = None
        self._service = ServiceLoop("memtrace-dvt")
        self._stack = contextlib.AsyncExitStack()
        self._dvt: Any = None
        self._pc: Any = None
        self._alloc: Any = None
        self._vm: Any = None
        self._announced: set[int] = set()
        self._tasks: list[asyncio.Task[Any]] = []
        self._resumed = False
        self._attached = False
        self._final_sent = False     # the last batch (live blocks, final totals) went out
        self._mask = 0
        self._t0 = time.monotonic()

    # -- what the loop reads ------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.launched.pid if self.launched is not None else None

    @property
    def spawned(self) -> bool:
        return self.launched is not None

    @property
    def is_local(self) -> bool:
        return False

    @property
    def hold_info(self) -> dict[str, Any] | None:
        return None         # nothing is injected: no hold

    @property
    def versions(self) -> dict[str, str]:
        try:
            return {"pymobiledevice3": version("pymobiledevice3")}
        except PackageNotFoundError:
            return {}

    def held_images(self) -> Path | None:
        return None

    # -- the event loop's side ------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float, what: str) -> T:
        return self._service.run(coro, timeout, what)

    @property
    def api(self) -> SimpleNamespace:
        if self._api is None:
            if self._api_factory is not None:
                self._api = self._api_factory()
            else:
                from memtrace.dvt.api import dvt_api

                self._api = dvt_api()
        return self._api

    # -- RecordSource ------------------------------------------------------------------

    def open(self) -> dict[str, Any]:
        spec = devices.parse_device_spec(self.target.device)
        if spec.kind in ("local", "remote"):
            raise InputError(f"--backend dvt: --device {self.target.device}: Instruments' services are reached "
                             "over USB (usb, auto or id:UDID)")
        self.udid = spec.udid
        return self._run(self._open(), CONNECT_TIMEOUT_S, "connecting to the device's developer services")

    async def _open(self) -> dict[str, Any]:
        from memtrace import launchers

        api = self.api
        if self.udid is None:
            # The first USB device, as `--device usb` means everywhere: its UDID names the tunnel.
            try:
                probe = await api.create_using_usbmux(serial=None, **launchers.NO_AUTOPAIR)
            except api.PasswordRequiredError:
                raise TargetError(launchers.LOCKED_MESSAGE) from None
            except Exception as e:  # noqa: BLE001 -- usbmux missing, no device: one line
                raise TargetError(f"no iOS device over USB: {_first_line(e)}") from None
            self.udid = probe.udid
            version = getattr(probe, "product_version", None)
            await launchers._close(probe)
        else:
            version = None
        provider = await self._stack.enter_async_context(launchers._Pmd3Session(api, str(self.udid)))
        version = getattr(provider, "product_version", version)
        await launchers._mount_developer_image(api, provider)
        try:
            self._dvt = await self._stack.enter_async_context(api.DvtProvider(provider))
            self._pc = await self._stack.enter_async_context(api.ProcessControl(self._dvt))
            self._alloc = await self._stack.enter_async_context(api.Allocations(self._dvt))
        except api.PasswordRequiredError:
            raise TargetError(launchers.LOCKED_MESSAGE) from None
        return {"id": self.udid, "name": getattr(provider, "product_type", None) or "iOS device", "type": "usb",
                "os": {"platform": "darwin", "version": version}, "backend": "dvt"}

    def launch(self, *, hold_constructors: bool = True, follow_children: bool = False) -> Launched:
        t = time.monotonic()
        pid = self._run(self._launch(), CONNECT_TIMEOUT_S, f"launching {self.target.app}")
        self.launched = Launched(pid, t, suspended=True, spawned=True,
                                 how="Instruments' process control with the Allocations environment")
        return self.launched

    async def _launch(self) -> int:
        api = self.api
        self._mask = api.MALLOC_EVENTS_MASK | (api.VM_EVENTS_MASK if self.with_vm else 0)
        try:
            environment = await self._alloc.launch_environment(events_mask=self._mask)
            return int(await self._pc.launch(self.target.app, kill_existing=True, start_suspended=True,
                                             environment=environment))
        except Exception as e:  # noqa: BLE001 -- the device's refusal, in one line with what to do
            raise TargetError(f"Instruments could not launch {self.target.app}: {_first_line(e)} "
                              "(the app must be installed and development-signed, the device unlocked)") from None

    def resume(self) -> None:
        if self.launched is None or not self.launched.suspended:
            return
        self._run(self._pc.resume(self.launched.pid), CALL_TIMEOUT_S, "resuming the app")
        self.launched.suspended = False
        pid = self.launched.pid
        self._service.soon(lambda: self._tasks.append(asyncio.ensure_future(self._modules_soon(pid))))

    def alive(self) -> bool:
        return self.launched is not None and self.gone is None

    def attach(self) -> None:
        assert self.launched is not None
        self._run(self._attach(self.launched.pid), CALL_TIMEOUT_S, f"recording pid {self.launched.pid}")

    async def _attach(self, pid: int) -> None:
        try:
            await self._alloc.attach(pid, events_mask=self._mask)
        except Exception as e:  # noqa: BLE001 -- ProcessInspectionError: not debuggable, gone
            raise TargetError(f"Instruments could not record pid {pid}: {_first_line(e)} "
                              "(the app must be development-signed: get-task-allow)") from None
        self._t0 = time.monotonic()      # the recording's time zero (the timeline's, the peak's)
        self._attached = True
        self._tasks.append(asyncio.ensure_future(self._pump()))
        self._tasks.append(asyncio.ensure_future(self._flusher()))

    async def _modules(self, pid: int) -> None:
        """The images mapped in the app (their __TEXT regions, from the VM Tracker), announced as the
        agent announces modules: the host symbolizes the stacks against them (and ``memtrace
        symbolize`` can, later, with the device's symbols).  Images mapped later come with the next
        snapshot; one that fails leaves raw addresses, and says so."""
        try:
            if self._vm is None:
                self._vm = await self._stack.enter_async_context(self.api.VMTracking(self._dvt))
            snapshot = await self._vm.snapshot(pid)
        except Exception as e:  # noqa: BLE001 -- frames stay addresses; the capture says why
            self._send({"type": "agent:warning", "message": f"no module list from the VM Tracker: {_first_line(e)}"})
            return
        fresh = []
        for region in sorted(snapshot.regions, key=lambda r: r.start):
            if region.type != "__TEXT" or not region.path or region.start in self._announced:
                continue
            self._announced.add(region.start)
            fresh.append({"name": region.path.rsplit("/", 1)[-1], "path": region.path, "base": hex(region.start),
                          "size": region.size})
        if fresh:
            self._send({"type": "modules:update", "t": round(time.monotonic() - self._t0, 3), "modules": fresh})

    async def _modules_soon(self, pid: int) -> None:
        # dyld maps the app's images as it starts: read them once it has run a little.
        await asyncio.sleep(MODULES_AFTER_S)
        await self._modules(pid)

    async def _pump(self) -> None:
        translator, clock, t0 = self.translator, time.monotonic, self._t0
        try:
            async for event in self._alloc:
                translator.now_ms = (clock() - t0) * 1000
                translator.feed(event)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 -- the channel broke: the recording ends, and says why
            self._send({"type": "agent:warning", "message": f"the Allocations stream broke: {_first_line(e)}"})
        self._flush(final=True)
        if self.gone is None:
            # The service closes its stream when the recorded process goes away.
            self.gone = "process-terminated"
            self.events.put(Ended("process-terminated"))

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self._flush()

    def _flush(self, final: bool = False) -> None:
        if self._final_sent:
            return
        self._final_sent = final
        self._send(*self.translator.take(round((time.monotonic() - self._t0) * 1000, 1), final))

    def _send(self, payload: dict[str, Any], data: bytes | None = None) -> None:
        self.events.put(Records(payload, data or b""))

    def next_event(self, timeout: float) -> SourceEvent | None:
        try:
            return self.events.get(timeout=timeout) if timeout > 0 else self.events.get_nowait()
        except queue.Empty:
            return None

    def load(self, agent: str) -> None:
        if self.tracer is not None and agent != self.tracer:
            raise InputError(f"--backend dvt records {self.tracer} only (Instruments' Allocations), not {agent}")

    def instrument(self, agent: str, config_for: ConfigFor) -> Instrumented:
        self.load(agent)
        hello = self._rpc_hello()
        return Instrumented(hello=hello, init=self._rpc_init(config_for("darwin")), platform="darwin")

    def calibrate(self, timeout: float | None = None) -> dict[str, Any]:
        return self._rpc_calibrate()

    def start(self, calibrate: bool = False) -> dict[str, Any]:
        return self._rpc_start()

    def release_fork(self, entry: str, pid: int) -> None:
        raise MemtraceError("--backend dvt does not follow children")

    def stop(self, timeout: float) -> dict[str, Any] | None:
        self._rpc_stop()
        return None

    def scan_leaks(self, config: dict[str, Any], timeout: float) -> None:
        """--leaks: the Leaks service's memory graph at the window's end, as a RESULT."""
        self._rpc_leaks(config)

    def symbolize(self, addresses: list[int]) -> list[list[Any]] | None:
        return None         # no agent to symbolize in: stacks are symbolized on the host

    def modules_seen(self, loaded: bool, feed_unwind: bool) -> list[Notice]:
        return []           # nobody waits for the host, and the device's stacks need no unwind tables

    def _rpc_hello(self) -> dict[str, Any]:
        return {"platform": "darwin", "backend": "dvt", "agent": None}

    def _rpc_init(self, config: dict[str, Any], *_: Any) -> dict[str, Any]:
        return {"recon": [], "info": {"backend": "dvt", "service": "com.apple.instruments.server.services.objectalloc",
                                      "events_mask": self._mask, "covers": COVERS},
                "process": {"guard": False, "why": "nothing is injected with --backend dvt"}}

    def _rpc_calibrate(self) -> dict[str, Any]:
        live = self._run(self._live_bytes(), CALL_TIMEOUT_S, "reading the recording")
        # The recording's own view of the heap: what is live among the blocks it saw allocated.
        return {"allocator": {"source": "allocations recording", "in_use": live, "footprint": live}}

    async def _live_bytes(self) -> int:
        return sum(size for size, _ in self.translator.live.values())


    def _rpc_start(self) -> dict[str, Any]:
        return {}

    def _rpc_stop(self) -> dict[str, Any]:
        self._run(self._stop(), CALL_TIMEOUT_S, "stopping the recording")
        if self.launched is not None and self.gone is None:
            # Images the app loaded during the window (dlopen'd frameworks, bundles).
            self._run(self._modules(self.launched.pid), CALL_TIMEOUT_S, "reading the app's images")
        return {}

    async def _stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._attached:
            self._flush(final=True)

    def _rpc_leaks(self, config: dict[str, Any]) -> dict[str, Any]:
        assert self.launched is not None
        body = self._run(self._leaks(self.launched.pid), LEAKS_TIMEOUT_S, "the device's memory graph")
        self._send(body)
        return {"ok": True}

    async def _leaks(self, pid: int) -> dict[str, Any]:
        from memtrace.dvt.leaks import leak_result

        t = time.monotonic()
        try:
            async with self.api.Leaks(self._dvt) as leaks:
                graph = await leaks.memory_graph(pid, leaked_only=True)
        except Exception as e:  # noqa: BLE001 -- one line, in the capture
            return {"type": "agent:warning", "message": f"the device's leak scan failed: {_first_line(e)}"}
        return leak_result(graph.leaked_count, graph.leaked_addresses, self.translator,
                           scan_ms=round((time.monotonic() - t) * 1000))

    def c_sources(self, agent: str) -> list[str]:
        return []

    def process_sources(self, agent: str) -> list[str]:
        return []

    def detach(self) -> None:
        with contextlib.suppress(MemtraceError):
            self._run(self._stop(), CALL_TIMEOUT_S, "stopping the recording")

    def kill(self) -> None:
        if self.launched is None or self._pc is None:
            return
        with contextlib.suppress(Exception):
            self._run(self._pc.kill(self.launched.pid), CALL_TIMEOUT_S, "killing the app")

    def exit_status(self, timeout: float) -> dict[str, Any] | None:
        return None

    def ack(self) -> None:
        pass

    def child_source(self, pid: int, held: Path | None = None) -> RecordSource:
        raise MemtraceError("--backend dvt does not follow children")

    def close(self) -> None:
        async def shut() -> None:
            await self._stop()
            with contextlib.suppress(Exception):
                await self._stack.aclose()

        self._service.close(shut, CALL_TIMEOUT_S)


Opener = Callable[[], Awaitable[Any]]


if TYPE_CHECKING:
    _IS_A_SOURCE: type[RecordSource] = DvtHost     # mypy checks DvtHost against the protocol
