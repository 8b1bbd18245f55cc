"""Launch or attach, load an agent, stream its batches into a capture, end cleanly.

One engine for every tracer.  Frida callbacks only enqueue; the calling thread
does all the work (writing, symbolizing, progress), so a slow disk never stalls
Frida's thread and Ctrl-C lands in one place.  The engine never prints: it
reports to a :class:`memtrace.ui.UI`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import frida

from memtrace import __version__, launchers
from memtrace.agentbuild import agent_source, c_sources
from memtrace.analyze.families import classify as classify_family
from memtrace.analyze.symbols import SymbolTable
from memtrace.capture import (
    FILE_NAME,
    FLAG_SAMPLED,
    REC_ALLOC,
    REC_STACK,
    CaptureWriter,
    RecordType,
    alloc_totals,
    iter_agent_tuples,
)
from memtrace.deaths import DeathThresholds, classify_end
from memtrace.errors import InputError, MemtraceError, TargetError
from memtrace.exitwatch import ChildExitWatcher
from memtrace.symbols import HostSymbolizer
from memtrace.ui import UI, Progress, SilentUI


@dataclass
class TargetSpec:
    device: str = "auto"
    app: str | None = None
    pid: int | None = None
    name: str | None = None
    argv: list[str] = field(default_factory=list)
    launch: str = "auto"          # auto | frida | pmd3 | none

    def describe(self) -> str:
        if self.app:
            return self.app
        if self.pid is not None:
            return f"pid {self.pid}"
        if self.name:
            return self.name
        return " ".join(self.argv)

    def slug(self) -> str:
        if self.app:
            base = self.app
        elif self.pid is not None:
            base = f"pid{self.pid}"
        elif self.name:
            base = self.name
        else:
            base = Path(self.argv[0]).name if self.argv else "target"
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in base)[:60]

    def validate(self) -> None:
        chosen = sum(x is not None and x != [] for x in (self.app, self.pid, self.name, self.argv or None))
        if chosen == 0:
            raise InputError("no target: give --app BUNDLE_ID, --pid N, --name NAME or -- PROGRAM ARGS")
        if chosen > 1:
            raise InputError("give only one target: --app, --pid, --name or -- PROGRAM")
        if self.pid is not None and self.pid <= 0:
            raise InputError(f"--pid {self.pid}: not a process id")


@dataclass
class CaptureOptions:
    tracer: str
    window: float = 60.0
    attach_delay: float = 0.0
    out: Path | None = None
    agent_config: dict[str, Any] = field(default_factory=dict)
    keep_running: bool = False
    thresholds: DeathThresholds = field(default_factory=DeathThresholds)

    def validate(self) -> None:
        if self.window <= 0:
            raise InputError(f"--window {self.window:g}: must be a positive number of seconds")
        if self.attach_delay < 0:
            raise InputError(f"--attach-delay {self.attach_delay:g}: must be zero or more seconds")


@dataclass
class CaptureResult:
    path: Path
    ended: str
    reason: str
    evidence: dict[str, Any]
    pid: int | None
    missing: list[str]
    interrupted: bool = False


class AgentTimeout(MemtraceError):
    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(f"the agent did not answer {what} within {seconds:g} s")
        self.what = what
        self.seconds = seconds


# ---- devices ------------------------------------------------------------------


def resolve_device(spec: str) -> frida.core.Device:
    """auto = the USB iOS device if one is attached, else this machine."""
    try:
        if spec == "local":
            return frida.get_local_device()
        if spec == "usb":
            return frida.get_usb_device(timeout=5)
        if spec == "auto":
            for d in frida.enumerate_devices():
                if d.type == "usb":
                    return d
            return frida.get_local_device()
        if spec.startswith("id:"):
            return frida.get_device(spec[3:], timeout=5)
        if spec.startswith("remote:"):
            return frida.get_device_manager().add_remote_device(spec[7:])
    except (frida.InvalidArgumentError, frida.TimedOutError, frida.ServerNotRunningError) as e:
        raise TargetError(f"--device {spec}: {e}") from None
    raise InputError(f"--device {spec}: expected auto, local, usb, id:UDID or remote:HOST[:PORT]")


def device_description(device: frida.core.Device) -> dict[str, Any]:
    info: dict[str, Any] = {"id": device.id, "name": device.name, "type": device.type}
    try:
        params = device.query_system_parameters()
        info["os"] = params.get("os", {})
        info["platform"] = params.get("platform")
        info["arch"] = params.get("arch")
        info["hostname"] = params.get("name") or socket.gethostname()
    except frida.NotSupportedError:
        pass
    return info


def default_out_dir(target: TargetSpec, tracer: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("captures") / f"{target.slug()}-{tracer}-{stamp}"


def prepare_out_dir(out: Path) -> Path:
    """Create the capture folder up front: an unwritable --out fails before anything is launched."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--out {out}: cannot create folder: {e.strerror}") from None
    path = out / FILE_NAME
    if path.exists():
        raise InputError(f"--out {out}: already holds a capture ({FILE_NAME}); choose a new folder")
    if not os.access(out, os.W_OK):
        raise InputError(f"--out {out}: folder is not writable")
    return path


# ---- the engine ---------------------------------------------------------------


class CaptureSession:
    """One capture of one target with one tracer."""

    def __init__(self, target: TargetSpec, options: CaptureOptions, ui: UI | None = None) -> None:
        target.validate()
        options.validate()
        self.target = target
        self.options = options
        self.ui = ui or SilentUI()
        self.ui_wants_families = getattr(self.ui, "wants_families", False)
        self.events: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
        self.writer: CaptureWriter | None = None
        self.device: frida.core.Device | None = None
        self.session: frida.core.Session | None = None
        self.script: frida.core.Script | None = None
        self.pid: int | None = None
        self.spawned = False
        self._suspended = False
        self.launch_how: str | None = None
        self.gone = False
        self.detach_reason: str | None = None
        self.exit_info: dict[str, Any] | None = None
        self.crash_info: dict[str, Any] | None = None
        self.timeout_info: dict[str, Any] | None = None
        self.missing: list[str] = []
        self.t_launch: float | None = None
        self.t_attach: float | None = None
        self.t_start: float | None = None
        self.t_gone: float | None = None
        self.counters: list[int] = [0] * 64
        self.rates: list[dict[str, float]] = []
        self.seen_addresses: set[int] = set()
        self.pending_addresses: list[int] = []
        self.host_symbols: HostSymbolizer | None = None
        self.symtab = SymbolTable()                 # the live view's families; modules for host symbols
        self.stack_frames: dict[Any, tuple[int, ...]] = {}
        self.stack_bytes: dict[Any, int] = {}
        self.batches = 0
        self.json_events = 0
        self.exit_watch: ChildExitWatcher | None = None
        self.agent_live = 0
        self.agent_stacks = 0
        self._last_snapshot = 0.0
        self._last_message = time.monotonic()
        self._last_progress = (0.0, 0, 0)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="memtrace-rpc")

    # -- public ---------------------------------------------------------------

    def run(self) -> CaptureResult:
        out = self.options.out or default_out_dir(self.target, self.options.tracer)
        path = prepare_out_dir(out)
        self.writer = CaptureWriter(path)
        interrupted = False
        previous = signal.getsignal(signal.SIGTERM)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            self._write_meta()
            try:
                try:
                    self._launch_and_attach()
                except MemtraceError:
                    if self.pid is None:
                        self._discard_capture()
                    raise
                self._instrument()
                self._capture_window()
            except KeyboardInterrupt:
                interrupted = True
            except _TargetGone:
                pass
            except AgentTimeout as e:
                self.timeout_info = {"what": e.what, "timeout_s": e.seconds}
                self.ui.warning(str(e))
            except (frida.ProcessNotFoundError, frida.ProcessNotRespondingError,
                    frida.TransportError, frida.InvalidOperationError) as e:
                if self.t_attach is None and not self.spawned:
                    raise TargetError(f"{self.target.describe()}: {e}") from None
                self.gone = True
                self.detach_reason = self.detach_reason or f"frida: {e}"
            try:
                self._finish()
            except KeyboardInterrupt:
                interrupted = True
            result = self._end(interrupted)
        finally:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, previous)
            self.writer.close()
            self._pool.shutdown(wait=False, cancel_futures=True)
        return result

    def _discard_capture(self) -> None:
        """Nothing was launched or attached: leave no capture behind, only the error."""
        assert self.writer is not None
        self.writer.close()
        with contextlib.suppress(OSError):
            self.writer.path.unlink()
            self.writer.path.parent.rmdir()

    # -- phases ---------------------------------------------------------------

    def _launch_and_attach(self) -> None:
        self.ui.phase("launching")
        self.device = resolve_device(self.target.device)
        if self.device.type == "local":
            self.host_symbols = HostSymbolizer(self.symtab.modules)
        self.device.on("output", self._on_output)
        self.device.on("lost", lambda: self.events.put(("device-lost", None, None)))
        launcher = launchers.choose(self.target.launch, self.target)
        launched = launcher.launch(self.device, self.target, stdio_pipe=True)
        self.pid = launched.pid
        self.spawned = launched.spawned
        if self.spawned and self.device.type == "local":
            self.exit_watch = ChildExitWatcher(self.pid)
        self.t_launch = launched.t_launch
        self.launch_how = launched.how
        self._suspended = launched.suspended
        delay = self.options.attach_delay
        if delay > 0:
            if self._suspended:
                self.device.resume(self.pid)
                self._suspended = False
            self.ui.phase("waiting")
            self._sleep_watching(delay)
        self._attach()

    def _sleep_watching(self, seconds: float) -> None:
        """Wait before attaching; a spawned target that exits meanwhile ends the capture."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
            if self.spawned and self.pid is not None and not _pid_alive(self.device, self.pid):
                self.gone = True
                self.t_gone = time.monotonic()
                self.detach_reason = "process-terminated"
                raise _TargetGone()

    def _attach(self) -> None:
        assert self.device is not None and self.pid is not None
        self.ui.phase("attaching")
        try:
            self.session = self.device.attach(self.pid)
        except frida.ProcessNotFoundError:
            if self.spawned:
                self.gone = True
                self.detach_reason = "process-terminated"
                raise _TargetGone() from None
            raise TargetError(f"pid {self.pid}: no such process") from None
        except frida.PermissionDeniedError as e:
            raise TargetError(f"cannot attach to pid {self.pid}: {e}") from None
        self.t_attach = time.monotonic()
        self.session.on("detached", self._on_detached)

    def _instrument(self) -> None:
        assert self.session is not None
        self.ui.phase("loading agent")
        tracer = self.options.tracer
        self.script = self.session.create_script(agent_source(tracer), name=f"memtrace-{tracer}")
        self.script.on("message", self._on_message)
        self._call("script load", self.script.load)
        api = self.script.exports_sync
        hello = self._call("hello", api.hello)
        config = self._agent_config()
        init = self._call("init", lambda: api.init(config, c_sources(tracer)))
        recon = init.get("recon", [])
        self.missing = [r["name"] for r in recon if r.get("status") == "MISSING"]
        assert self.device is not None
        self._write(RecordType.RECON, {"symbols": recon, "info": init.get("info", {}), "agent": hello,
                                       "device": device_description(self.device)})
        for name in self.missing:
            self.ui.warning(f"MISSING hook symbol: {name}")
        self._write(RecordType.CALIBRATION, {"phase": "before", **self._call("calibrate", api.calibrate)})
        self._call("start", api.start)
        self.t_start = time.monotonic()
        if self._suspended:
            assert self.device is not None and self.pid is not None
            self.device.resume(self.pid)
            self._suspended = False

    def _capture_window(self) -> None:
        self.ui.phase("capturing")
        self._last_message = time.monotonic()
        assert self.t_start is not None
        deadline = self.t_start + self.options.window
        while not self.gone:
            now = time.monotonic()
            if now >= deadline:
                break
            try:
                kind, a, b = self.events.get(timeout=min(0.1, deadline - now))
            except queue.Empty:
                kind = None
            if kind is not None:
                self._handle(kind, a, b)
                self._drain_queue(wait=0.0)
            self._symbolize_pending()
            self._tick()
            silent = time.monotonic() - self._last_message
            if silent > self.options.thresholds.rpc_timeout and not self.gone:
                # The agent flushes every 100 ms even when idle: silence this long while the
                # process lives means it was frozen (anti-debug stops, a debugger, SIGSTOP).
                self.timeout_info = {"what": "its periodic flush (agent went silent)", "timeout_s":
                                     self.options.thresholds.rpc_timeout, "silent_s": round(silent, 3)}
                self.ui.warning(f"the agent has been silent for {silent:.1f} s")
                return

    def _finish(self) -> None:
        """Detach cleanly: stop the hooks, flush, calibrate, then drain what arrived."""
        self.ui.phase("flushing")
        api = self.script.exports_sync if self.script is not None else None
        if api is not None and not self.gone and self.timeout_info is None:
            try:
                self._call("stop", api.stop, timeout=10)
                self._drain_queue()
                self._write(RecordType.CALIBRATION, {"phase": "after", **self._call("calibrate", api.calibrate, timeout=10)})
            except AgentTimeout as e:
                if not self.gone:
                    self.timeout_info = {"what": e.what, "timeout_s": e.seconds}
            except (frida.InvalidOperationError, frida.TransportError):
                pass
        self._drain_queue()
        self._symbolize_pending(final=True)
        if self.session is not None and not self.gone:
            with contextlib.suppress(AgentTimeout, frida.InvalidOperationError):
                self._call("detach", self.session.detach, timeout=5)
        if self.spawned and not self.options.keep_running and self.pid is not None and not self.gone:
            try:
                assert self.device is not None
                self.device.kill(self.pid)
            except (frida.ProcessNotFoundError, frida.InvalidOperationError):
                pass
        time.sleep(0.05)
        self._drain_queue()

    def _end(self, interrupted: bool) -> CaptureResult:
        now = time.monotonic()
        end_body = classify_end(
            window=self.options.window,
            attach_delay=self.options.attach_delay,
            t_start=self.t_start,
            t_attach=self.t_attach,
            t_gone=self.t_gone if self.gone else None,
            t_now=now,
            interrupted=interrupted,
            detach_reason=self.detach_reason,
            exit_info=self.exit_info,
            crash_info=self.crash_info,
            timeout_info=self.timeout_info,
            rates=self.rates,
            thresholds=self.options.thresholds,
            calls_total=sum(self.counters[0:16]) + self.json_events,
            # Only a death in the window: at its end memtrace kills what it launched itself.
            exit_status=self.exit_watch.wait(1.0) if self.exit_watch is not None and self.gone else None,
        )
        end_body["ended_at"] = _iso_now()
        end_body["counters"] = self.counters
        end_body["batches"] = self.batches
        end_body["pid"] = self.pid
        end_body["launch"] = {"how": self.launch_how, "launcher": self.target.launch}
        end_body["timing"] = {
            "launch_to_attach_s": None if self.t_launch is None or self.t_attach is None
            else round(self.t_attach - self.t_launch, 3),
            "captured_s": None if self.t_start is None
            else round((self.t_gone if self.gone and self.t_gone else now) - self.t_start, 3),
        }
        self._write(RecordType.END, end_body)
        assert self.writer is not None
        self.ui.phase("done")
        return CaptureResult(
            path=self.writer.path, ended=end_body["ended"], reason=end_body["reason"],
            evidence=end_body.get("evidence", {}), pid=self.pid, missing=self.missing,
            interrupted=interrupted,
        )

    # -- helpers --------------------------------------------------------------

    def _agent_config(self) -> dict[str, Any]:
        cfg = {
            "liveThreshold": 4096, "stackThreshold": 8192, "frames": 28, "sampleBytes": 0,
            "ringKb": 1024, "threadSlots": 1024, "rings": 64, "stackTable": 1 << 16,
            "liveTable": 1 << 20, "toolchain": "auto", "backend": "auto",
        }
        cfg.update(self.options.agent_config)
        return cfg

    def _call(self, what: str, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """An rpc with a deadline: an agent that never answers is evidence (anti-debug), not a hang."""
        seconds = timeout if timeout is not None else self.options.thresholds.rpc_timeout
        future = self._pool.submit(fn)
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            raise AgentTimeout(what, seconds) from None
        except frida.RPCException as e:
            raise MemtraceError(f"agent {what} failed: {str(e).splitlines()[0]}") from None

    def _write(self, rtype: RecordType, body: Any, data: bytes = b"") -> None:
        assert self.writer is not None
        self.writer.write(rtype, body, data)

    def _write_meta(self) -> None:
        self._write(RecordType.META, {
            "tool": "memtrace", "tool_version": __version__, "tracer": self.options.tracer,
            "target": {"device": self.target.device, "app": self.target.app, "pid": self.target.pid,
                       "name": self.target.name, "argv": self.target.argv, "label": self.target.slug()},
            "options": {"window": self.options.window, "attach_delay": self.options.attach_delay,
                        "agent": self._agent_config()},
            "host": {"hostname": socket.gethostname(), "python": sys.version.split()[0],
                     "frida": frida.__version__},
            "started_at": _iso_now(),
        })

    def _on_message(self, message: dict[str, Any], data: bytes | None) -> None:
        self._last_message = time.monotonic()
        self.events.put(("message", message, data))

    def _on_detached(self, reason: str, crash: Any) -> None:
        self.events.put(("detached", reason, crash))

    def _on_output(self, pid: int, fd: int, data: bytes) -> None:
        if pid == self.pid and data:
            self.ui.output(fd, data)

    def _drain_queue(self, wait: float = 0.05) -> None:
        while True:
            try:
                kind, a, b = self.events.get(timeout=wait)
            except queue.Empty:
                return
            self._handle(kind, a, b)

    def _handle(self, kind: str, a: Any, b: Any) -> None:
        if kind == "detached":
            if a == "application-requested":
                return      # our own detach at the end of the window
            self.gone = True
            self.t_gone = self.t_gone or time.monotonic()
            self.detach_reason = self.detach_reason or a
            if b is not None:
                self.crash_info = self.crash_info or {"summary": getattr(b, "summary", str(b)),
                                                      "report": getattr(b, "report", "")[:4000]}
            return
        if kind == "device-lost":
            self.gone = True
            self.t_gone = self.t_gone or time.monotonic()
            self.detach_reason = "device-lost"
            return
        message = a
        if message.get("type") == "error":
            self._write(RecordType.WARNING, {"agent_error": message.get("description"),
                                             "stack": message.get("stack")})
            self.ui.warning(f"agent error: {message.get('description')}")
            return
        payload = message.get("payload") or {}
        ptype = payload.get("type")
        if ptype == "events:batch":
            self._on_batch(payload, b or b"")
        elif ptype == "events:json":
            self._write(RecordType.EVENTS, payload)
            self.batches += 1
            # The JSON tracers' activity, for the end-of-window verdict (a census or the threads
            # already there at attach is a snapshot, not activity).
            self.json_events += sum(1 for ev in payload.get("events", []) if ev.get("activity", True))
            self._note_event_frames(payload.get("events", []))
        elif ptype == "modules:update":
            self._write(RecordType.MODULES, payload)
            self.symtab.add_modules(payload.get("modules", []))
        elif ptype == "agent:warning":
            self._write(RecordType.WARNING, payload)
            self.ui.warning(payload.get("message", ""))
        elif ptype == "agent:exit":
            self.exit_info = {"status": payload.get("status"), "how": payload.get("how"), "t": payload.get("t")}
            if payload.get("calibration"):
                self._write(RecordType.CALIBRATION, {"phase": "at-exit", **payload["calibration"]})
        elif ptype == "agent:crash":
            self.crash_info = {k: payload.get(k) for k in ("kind", "address", "module", "t")}
        elif ptype == "result":
            self._write(RecordType.RESULT, payload)

    def _on_batch(self, payload: dict[str, Any], data: bytes) -> None:
        self._write(RecordType.BATCH, payload, data)
        self.batches += 1
        self.counters = payload.get("counters", self.counters)
        self.agent_live = payload.get("live", 0)
        self.agent_stacks = payload.get("stacks", 0)
        if data:
            frames_of, bytes_of = self.stack_frames, self.stack_bytes
            for r in iter_agent_tuples(data):
                if r[0] == REC_ALLOC:
                    if self.ui_wants_families:
                        sid = r[3]
                        bytes_of[sid] = bytes_of.get(sid, 0) + (r[6] if r[2] & FLAG_SAMPLED else r[5])
                elif r[0] == REC_STACK:
                    frames_of[r[3]] = r[4]
                    for f in r[4]:
                        if f not in self.seen_addresses:
                            self.seen_addresses.add(f)
                            self.pending_addresses.append(f)

    def _note_event_frames(self, events: list[dict[str, Any]]) -> None:
        """JSON events carry their stacks as "frames": ["0x...", ...]; symbolize those too (and a
        thread's start "routine": a function's first byte, looked up one byte in because the
        symbolizer reads every address as a return address and steps back one)."""
        for ev in events:
            frames = tuple(int(f, 16) if isinstance(f, str) else int(f) for f in ev.get("frames") or ())
            routine = ev.get("routine")
            for a in frames + ((int(routine, 16) + 1,) if isinstance(routine, str) else ()):
                if a not in self.seen_addresses:
                    self.seen_addresses.add(a)
                    self.pending_addresses.append(a)
            size = ev.get("bytes", ev.get("alloc_size"))
            if frames and isinstance(size, int):
                self.stack_frames[frames] = frames
                self.stack_bytes[frames] = self.stack_bytes.get(frames, 0) + size

    def _families(self, top: int = 200) -> list[tuple[str, int]]:
        """Top stack families so far, from the biggest stacks (cheap enough for a 1 s tick)."""
        ranked = sorted(self.stack_bytes.items(), key=lambda kv: -kv[1])[:top]
        totals: dict[str, int] = {}
        for sid, nbytes in ranked:
            frames = self.stack_frames.get(sid)
            if not frames:
                continue
            name = classify_family(self.symtab.labels(frames))
            totals[name] = totals.get(name, 0) + nbytes
        return sorted(totals.items(), key=lambda kv: -kv[1])[:5]

    def _symbolize_pending(self, final: bool = False) -> None:
        """Each distinct return address is symbolized once, off the target's hot path.

        Local targets: on the host from the ELF files (works after the target died).
        Remote targets: by the agent, while it is alive."""
        if not self.pending_addresses:
            return
        if self.host_symbols is not None:
            rows = self.host_symbols.symbolize(self.pending_addresses)
            self.symtab.add_rows(rows)
            self._write(RecordType.SYMBOLS, {"rows": rows, "by": "host",
                                             "images": self.host_symbols.images(new_only=True)})
            self.pending_addresses.clear()
            return
        if self.script is None or self.gone or self.timeout_info is not None:
            return
        while self.pending_addresses:
            chunk = self.pending_addresses[:2000]
            try:
                rows = self._call("symbolize", lambda c=chunk: self.script.exports_sync.symbolize(  # type: ignore[union-attr]
                    [hex(x) for x in c]), timeout=30)
            except (AgentTimeout, frida.InvalidOperationError, frida.TransportError, MemtraceError):
                return
            self.symtab.add_rows(rows)
            self._write(RecordType.SYMBOLS, {"rows": rows, "by": "agent"})
            del self.pending_addresses[:len(chunk)]
            if not final:
                return

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._last_snapshot < 1.0:
            return
        calls = sum(self.counters[0:16])          # every call, releases included: the event rate
        nbytes = alloc_totals(self.counters)[1]
        t_prev, calls_prev, bytes_prev = self._last_progress
        dt = now - t_prev if t_prev else 0.0
        rate = (calls - calls_prev) / dt if dt > 0 else 0.0
        brate = (nbytes - bytes_prev) / dt if dt > 0 else 0.0
        assert self.t_start is not None
        elapsed = now - self.t_start
        sample = {"t": round(elapsed, 3), "calls": calls, "bytes": nbytes,
                  "calls_per_s": round(rate, 1), "bytes_per_s": round(brate, 1),
                  "events": self.batches}
        self.rates.append(sample)
        self._write(RecordType.SNAPSHOT, {**sample, "counters": self.counters, "live": self.agent_live,
                                          "stacks": self.agent_stacks})
        self._last_snapshot = now
        self._last_progress = (now, calls, nbytes)
        self.ui.progress(Progress(
            elapsed=elapsed, window=self.options.window, calls=calls, bytes=nbytes,
            calls_per_s=rate, bytes_per_s=brate, dropped=_dropped(self.counters),
            live=self.agent_live, stacks=self.agent_stacks, batches=self.batches,
            families=self._families() if self.ui_wants_families else [],
        ))


class _TargetGone(Exception):
    """The target ended before instrumentation finished."""


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _dropped(counters: list[int]) -> int:
    return counters[44] + counters[46]


def _pid_alive(device: frida.core.Device | None, pid: int) -> bool:
    if device is not None and device.type == "local":
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(") ", 1)[1][:1] != "Z"
        except (OSError, IndexError):
            return False
    if device is None:
        return False
    return any(p.pid == pid for p in device.enumerate_processes())


def _iso_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")
