"""One capture of one target with one tracer, whatever hosts the agent.

The loop owns the window, the attach delay, the deadlines, the death evidence, the capture
file and the live view; an :class:`AgentHost` (Frida's today: :mod:`memtrace.frida_host`)
owns the device, the process and the agent.  The loop never prints: it reports to a
:class:`memtrace.ui.UI`.  Tracer-specific statistics come from the tracer's registry entry.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from dataclasses import replace as replace_fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from memtrace import __version__
from memtrace.agentbuild import default_cache_dir, precompiled_cmodule
from memtrace.capture import FILE_NAME, CaptureWriteError, CaptureWriter, RecordType
from memtrace.children import CHILD_WAIT_S, Child, Family, ProcessEvents, children_evidence
from memtrace.deaths import DeathThresholds, classify_end
from memtrace.errors import AgentTimeout, InputError, MemtraceError, TargetGone, TargetLost
from memtrace.files import write_text_atomic
from memtrace.leakscan import leak_progress
from memtrace.live import CoreStats, LiveStats
from memtrace.stacks_seen import StacksSeen
from memtrace.symbols.cfi import TableCache, UnwindFeed
from memtrace.target import TargetSpec
from memtrace.tracers import Tracer
from memtrace.tracers.options import Option, finite_non_negative, positive
from memtrace.ui import UI, Progress, SilentUI

DEFAULT_WINDOW = 60.0      # seconds: the window of an app or a running process, unless --window says

CAPTURE_OPTIONS: tuple[Option, ...] = (
    Option("attach_delay", float, 0.0, "Wait this long after launch before attaching (0 = instrument before "
           "the first instruction).", metavar="SECONDS", check=finite_non_negative),
    Option("window", float, None, "Capture window; the capture also ends when the target exits (default: a "
           f"program given after -- runs to its end; --app, --name and --pid: {DEFAULT_WINDOW:g} s).",
           metavar="SECONDS", check=positive, show_default=False),
    Option("out", Path, None, "Capture folder (default: a new folder under ./captures/).", metavar="DIR",
           in_plans=False, show_default=False),
    Option("keep_running", bool, False, "Leave a program memtrace launched running after the window.",
           is_flag=True),
    Option("follow_children", bool, False, "Trace the processes the target forks, spawns or execs, each in a "
           "capture of its own in the same folder (without it they run untraced, and the capture says so).",
           is_flag=True),
    Option("rpc_timeout", float, DeathThresholds.rpc_timeout, "An agent that does not answer within this is "
           "reported as anti-debug.", metavar="SECONDS", check=positive),
    Option("storm_seconds", float, DeathThresholds.storm_seconds, "Death classification: a kill this soon after "
           "instrumentation can be a launch storm...", check=finite_non_negative),
    Option("storm_rate", float, DeathThresholds.storm_rate, "...if calls per second reached this.",
           check=finite_non_negative),
    Option("stream_rate", float, DeathThresholds.stream_rate, "A later kill under at least this rate that never "
           "settled is a perpetual stream.", check=finite_non_negative),
)


@dataclass
class CaptureOptions:
    tracer: str
    window: float | None = None         # None: a program runs to its end, anything else DEFAULT_WINDOW
    attach_delay: float = 0.0
    out: Path | None = None
    agent_config: dict[str, Any] = field(default_factory=dict)
    keep_running: bool = False
    follow_children: bool = False
    thresholds: DeathThresholds = field(default_factory=DeathThresholds)
    capture_name: str = FILE_NAME        # a followed child's capture: child-<pid>.mtc in the same folder

    def validate(self) -> None:
        if self.window is not None and not (0 < self.window < float("inf")):
            raise InputError(f"--window {self.window:g}: must be a positive, finite number of seconds")
        if not (0 <= self.attach_delay < float("inf")):
            raise InputError(f"--attach-delay {self.attach_delay:g}: must be zero or more seconds")


def capture_options(tracer: str, values: dict[str, Any], agent_config: dict[str, Any]) -> CaptureOptions:
    """CaptureOptions from parsed option values (command line or plan)."""
    t = DeathThresholds()
    return CaptureOptions(
        tracer=tracer, window=None if values.get("window") is None else float(values["window"]), attach_delay=float(values.get("attach_delay", 0.0)),
        out=values.get("out"), agent_config=agent_config, keep_running=bool(values.get("keep_running", False)),
        follow_children=bool(values.get("follow_children", False)),
        thresholds=DeathThresholds(rpc_timeout=float(values.get("rpc_timeout", t.rpc_timeout)),
                                   storm_seconds=float(values.get("storm_seconds", t.storm_seconds)),
                                   storm_rate=float(values.get("storm_rate", t.storm_rate)),
                                   stream_rate=float(values.get("stream_rate", t.stream_rate))))


@dataclass
class CaptureResult:
    path: Path
    ended: str
    reason: str
    evidence: dict[str, Any]
    pid: int | None
    missing: list[str]
    interrupted: bool = False
    signal: int | None = None       # SIGTERM or SIGHUP when one ended it (None: Ctrl-C or no interruption)


class AgentHost(Protocol):
    """What the loop needs from whatever runs the agent (see memtrace.frida_host.FridaHost)."""

    events: queue.Queue[tuple[str, Any, Any]]

    @property
    def pid(self) -> int | None: ...
    @property
    def spawned(self) -> bool: ...
    @property
    def is_local(self) -> bool: ...
    def open(self) -> dict[str, Any]: ...
    def launch(self) -> Any: ...
    def resume(self) -> None: ...
    def alive(self) -> bool: ...
    def attach(self) -> None: ...
    def load(self, agent: str) -> None: ...
    def rpc(self, what: str, method: str, *args: Any, timeout: float | None = None) -> Any: ...
    def c_sources(self, agent: str) -> list[str]: ...
    def process_sources(self, agent: str) -> list[str]: ...
    def detach(self) -> None: ...
    def kill(self) -> None: ...
    def exit_status(self, timeout: float) -> dict[str, Any] | None: ...
    def ack(self) -> None: ...
    def child_host(self, pid: int) -> AgentHost: ...
    def close(self) -> None: ...


@dataclass
class Clock:
    """Monotonic times of the capture's milestones."""

    launch: float | None = None
    attach: float | None = None
    start: float | None = None
    gone: float | None = None


@dataclass
class Ending:
    """What the loop learned about how the target and the agent ended: the death evidence."""

    gone: bool = False
    detach_reason: str | None = None
    exit_info: dict[str, Any] | None = None
    crash_info: dict[str, Any] | None = None
    timeout_info: dict[str, Any] | None = None
    exec_info: dict[str, Any] | None = None      # the target said it is about to exec
    spawn_status: dict[str, Any] | None = None   # the signal Frida saw kill it while spawning or attaching
    window_end: str | None = None                # the window ended with the target alive: "killed", "left running"

    @property
    def replaced(self) -> bool:
        return self.detach_reason == "process-replaced"

    def target_gone(self, reason: str, clock: Clock) -> None:
        self.gone = True
        clock.gone = clock.gone or time.monotonic()
        self.detach_reason = self.detach_reason or reason


def default_out_dir(target: TargetSpec, tracer: str) -> Path:
    # Microseconds and a counter keep two captures started in the same second apart.
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    base = Path("captures") / f"{target.slug()}-{tracer}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def prepare_out_dir(out: Path, name: str = FILE_NAME) -> Path:
    """Create the capture folder up front: an unwritable --out fails before anything is launched."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--out {out}: cannot create folder: {e.strerror}") from None
    path = out / name
    if path.exists():
        raise InputError(f"--out {out}: already holds a capture ({name}); choose a new folder")
    import os

    if not os.access(out, os.W_OK):
        raise InputError(f"--out {out}: folder is not writable")
    return path


class CaptureLoop(ProcessEvents):
    """Launch or attach through the host, load the tracer's agent, stream a window into a capture."""

    def __init__(self, host: AgentHost, tracer: Tracer, target: TargetSpec, options: CaptureOptions,
                 ui: UI | None = None, family: Family | None = None, child: Child | None = None,
                 release: str | None = None, parent_capture: str | None = None) -> None:
        target.validate()
        options.validate()
        self.family = family           # set for a followed process; the root makes its own in run()
        self.child = child             # this capture follows a process the target made
        self.release = release         # a fork child's entry: its new agent lets it run on
        self.parent_capture = parent_capture
        self.children: list[Child] = []    # processes this target made (reported by its agent)
        self.host = host
        self.tracer = tracer
        self.target = target
        self.options = options
        self.ui = ui or SilentUI()
        self.clock = Clock()
        self.ending = Ending()
        self.live: LiveStats = tracer.live()
        self.stacks = StacksSeen(want_families=getattr(self.ui, "wants_families", False))
        if isinstance(self.live, CoreStats):
            self.live.label = self.stacks.label      # the live view names its fastest-growing stacks
        self.unwind: UnwindFeed | None = None
        self.writer: CaptureWriter | None = None
        self.write_error: CaptureWriteError | None = None
        self.missing: list[str] = []
        self.process_info: dict[str, Any] = {}     # fork/exec handling in the target (init, start)
        self.rates: list[dict[str, float]] = []
        self.batches = 0
        self._last_tick = (0.0, 0, 0)
        self._last_message = time.monotonic()
        # What memtrace was doing to the target, for the END record of a target that dies:
        # spawn, injection, agent load, window, detach (issue 26).
        self.stage = "start"
        # A program memtrace starts runs to its end unless --window limits it; an app or a running
        # process gets the default window.
        # A followed child (window None) ends with its family's window, whatever that is.
        self.window: float = options.window if options.window is not None else (
            float("inf") if target.argv or child is not None else DEFAULT_WINDOW)

    # -- public ---------------------------------------------------------------

    def run(self) -> CaptureResult:
        out = self.options.out or default_out_dir(self.target, self.options.tracer)
        made = not out.exists()
        try:
            self.writer = CaptureWriter(prepare_out_dir(out, self.options.capture_name))
        except CaptureWriteError:
            if made:        # the disk is full already: leave nothing behind, only the error
                with contextlib.suppress(OSError):
                    out.rmdir()
            raise
        if self.family is None:
            self.family = Family(folder=out, label=self.target.slug(), deadline=float("inf"),
                                 follow=self.options.follow_children)
        interrupted = False
        on_main = threading.current_thread() is threading.main_thread()
        # SIGTERM, and SIGHUP (the terminal closed): end the capture as Ctrl-C does -- detach, kill
        # what memtrace launched, write END -- instead of dying with the target left behind.
        previous = {sig: signal.getsignal(sig) for sig in ENDING_SIGNALS} if on_main else {}
        if on_main:
            _ending_signal.clear()
        for sig in previous:
            signal.signal(sig, _raise_interrupt)
        try:
            self._write_meta()
            if self.write_error is not None:        # nothing launched yet: no capture, one error
                self._discard_capture()
                raise CaptureWriteError(f"{self.writer.path}: cannot start the capture: {self.writer.error}")
            try:
                try:
                    self._launch_and_attach()
                except MemtraceError as e:
                    self._note_frida_signal(e)
                    if (self.stage == "spawn" and self.ending.spawn_status is not None) or self._died_meanwhile():
                        # The target memtrace launched died while being spawned or injected:
                        # that is what the capture says (its END names the signal and the stage).
                        raise TargetGone() from None
                    # Nothing was captured: leave no stub folder behind (a report would call it
                    # truncated), and no suspended process memtrace started.
                    if self.host.spawned:
                        with contextlib.suppress(Exception):
                            self.host.kill()
                    self._discard_capture()
                    if isinstance(e, TargetLost):
                        # Not the window's "target lost" below: there is no capture to end now
                        # (writing its END to the discarded file was an EBADF error).
                        raise MemtraceError(f"{self.target.describe()}: {e}", e.exit_code) from None
                    raise
                self._instrument()
                self._window()
            except KeyboardInterrupt:
                interrupted = True
            except TargetGone as e:
                self._note_frida_signal(e)
                self.ending.target_gone("process-terminated", self.clock)
            except AgentTimeout as e:
                self.ending.timeout_info = {"what": e.what, "timeout_s": e.seconds}
                self.ui.warning(str(e))
            except TargetLost as e:
                if self.clock.attach is None and not self.host.spawned:
                    raise MemtraceError(f"{self.target.describe()}: {e}") from None
                self.ending.target_gone(f"lost: {e}", self.clock)
            try:
                self._finish()
                self._linger()
            except KeyboardInterrupt:
                interrupted = True
            if interrupted:
                self.family.stopped.set()
            elif self.child is not None and self.family.stopped.is_set():
                interrupted = True      # the run was interrupted: every followed capture ends with it
            if self.child is None:
                self._join_children()
            result = self._end(interrupted)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.writer.close()
            self.host.close()
        if self.write_error is not None:
            raise CaptureWriteError(f"{self.writer.failure()}; tracing stopped there and memtrace detached "
                                    f"from the target")
        return result

    def _note_frida_signal(self, e: Exception) -> None:
        """Frida's spawn or attach failed because the process was killed under it ("target
        terminated with signal 9"): the signal is noted, for when no pidfd could tell it (the
        process was gone before one was opened, or Frida never said its pid)."""
        found = _SPAWN_DEATH.search(str(e))
        if found is None or self.ending.spawn_status is not None:
            return
        number = int(found.group(1))
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        self.ending.spawn_status = {"signal": number, "signal_name": name, "source": f"frida ({self.stage})"}

    def _died_meanwhile(self) -> bool:
        """The target existed and is gone now: an attach that failed because the target was
        killed under it, not because it cannot be attached.  A process memtrace launched; or one
        it attaches to (--pid, --name) once injection began -- the pid was there to inject."""
        if self.host.pid is None:
            return False
        if not self.host.spawned and self.stage not in ("injection", "agent load"):
            return False
        end = time.monotonic() + 1.0        # a SIGKILL takes a moment to be final
        while self.host.alive():
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)
        return True

    def _discard_capture(self) -> None:
        """Nothing was attached: leave no capture behind, only the error."""
        assert self.writer is not None
        self.writer.close()
        with contextlib.suppress(OSError):
            self.writer.path.unlink()
            self.writer.path.parent.rmdir()

    # -- phases ---------------------------------------------------------------

    def _launch_and_attach(self) -> None:
        self.ui.phase("launching")
        self.device_info = self.host.open()
        if self.host.is_local:
            self.stacks.symbolize_on_host()
        else:
            from memtrace.symbols.device import local_tree

            self.stacks.device_tree = local_tree(self.device_info)
        if self.options.attach_delay > 0 and hasattr(self.host, "hold_constructors"):
            self.host.hold_constructors = False     # it is to run first: no hold before constructors
        if self.child is None and hasattr(self.host, "follow_children"):
            self.host.follow_children = self.options.follow_children
        self.stage = "spawn"
        launched = self.host.launch()
        held = getattr(self.host, "hold_children", None)
        if held is not None and held.children is not None and self.family is not None:
            self.family.watch_held(self, held.children)
        self.clock.launch = getattr(launched, "t_launch", None)
        if self.child is not None:
            # A followed process "launched" when the host learned of it: what it ran before the
            # attach went untraced (an exec'd image; a fork child waits for its agent).
            self.clock.launch = self.child.seen
        self.launch_how = getattr(launched, "how", None)
        if self.options.attach_delay > 0:
            self.host.resume()
            self.ui.phase("waiting")
            self.stage = "attach delay"
            self._sleep_watching(self.options.attach_delay)
        self.ui.phase("attaching")
        self.stage = "injection"
        self.host.attach()
        self.clock.attach = time.monotonic()

    def _sleep_watching(self, seconds: float) -> None:
        """Wait before attaching; a spawned target that exits meanwhile ends the capture."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
            if self.host.spawned and not self.host.alive():
                raise TargetGone()

    def _instrument(self) -> None:
        self.ui.phase("loading agent")
        self.stage = "agent load"
        agent = self.tracer.agent_name
        self.host.load(agent)
        hello = self.host.rpc("hello", "hello")
        self._platform = hello.get("platform") if isinstance(hello, dict) else None
        config, sources = self._agent_config(), self.host.c_sources(agent)
        asm = self._precompiled_cmodule(hello, config, sources)
        if asm is not None:
            config["cmoduleAsm"] = asm
        init = self.host.rpc("init", "init", config, sources, self.host.process_sources(agent))
        recon = init.get("recon", [])
        self.missing = [r["name"] for r in recon if r.get("status") == "MISSING"]
        self.process_info = dict(init.get("process") or {})
        if not self.process_info.get("guard") and (self.options.follow_children or self._platform != "darwin"):
            self.ui.warning(f"fork children and exec are not handled in this target: "
                            f"{self.process_info.get('why', 'an agent without it')}")
        # Local targets (followed children too): unwind tables for modules without frame pointers.
        if self.host.is_local and os.environ.get("MEMTRACE_UNWIND", "on") != "off":
            self.unwind = UnwindFeed(TableCache(default_cache_dir()))
            self._feed_unwind(during_window=False)
        hold = getattr(self.host, "hold_info", None)
        if hold is not None and not hold.get("held"):
            self.ui.warning(f"library constructors ran before the hooks: {hold.get('why')}")
        self._write(RecordType.RECON, {"symbols": recon, "info": init.get("info", {}), "agent": hello,
                                       "device": self.device_info, "process": self.process_info,
                                       "hold": hold,
                                       "unwind": self.unwind.info() if self.unwind else None})
        for name in self.missing:
            self.ui.warning(f"MISSING hook symbol: {name}")
        self._write(RecordType.CALIBRATION, {"phase": "before", **self.host.rpc("calibrate", "calibrate")})
        started = self.host.rpc("start", "start") or {}
        self.process_info.update(started.get("process") or {})
        self.clock.start = time.monotonic()
        assert self.family is not None
        if self.child is None:
            self.family.deadline = self.clock.start + self.window
        if self.release is not None and self.child is not None:
            # A fork child waits in its atfork handler until its own agent is in.
            self.host.rpc("release", "releaseFork", self.release, self.child.pid)
        self.host.resume()

    def _window(self) -> None:
        self.ui.phase("capturing")
        self.stage = "window"
        self._last_message = time.monotonic()
        assert self.clock.start is not None and self.family is not None
        deadline = self.family.deadline
        while not self.ending.gone and self.write_error is None:
            now = time.monotonic()
            if now >= deadline or self.family.stopped.is_set():
                break
            try:
                event = self.host.events.get(timeout=min(0.1, deadline - now))
            except queue.Empty:
                event = None
            if event is not None:
                self._handle(*event)
                self._drain(wait=0.0)
            self._symbolize()
            self._tick()
            silent = time.monotonic() - self._last_message
            if silent > self.options.thresholds.rpc_timeout and not self.ending.gone:
                # Agents say something every 100 ms even when idle: silence this long while the
                # process lives means it was frozen (anti-debug stops, a debugger, SIGSTOP).
                self.ending.timeout_info = {"what": "its periodic flush (agent went silent)",
                                            "timeout_s": self.options.thresholds.rpc_timeout,
                                            "silent_s": round(silent, 3)}
                self.ui.warning(f"the agent has been silent for {silent:.1f} s")
                return

    def _finish(self) -> None:
        """Detach cleanly: stop the hooks, flush, calibrate, then drain what arrived."""
        self.ui.phase("flushing")
        if not self.ending.gone:
            self.stage = "detach"
        loaded = self.clock.start is not None or self.clock.attach is not None
        if loaded and not self.ending.gone and self.ending.timeout_info is None:
            try:
                if self.tracer.window_end is not None:
                    self.tracer.window_end(self)
                self.host.rpc("stop", "stop", timeout=10)
                self._drain()
                after = self.host.rpc("calibrate", "calibrate", timeout=10)
                self._write(RecordType.CALIBRATION, {"phase": "after", **after})
            except AgentTimeout as e:
                if not self.ending.gone:
                    self.ending.timeout_info = {"what": e.what, "timeout_s": e.seconds}
            except TargetLost:
                pass
            except MemtraceError as e:
                self.ui.warning(str(e))
        self._drain()
        self._symbolize(final=True)
        if not self.ending.gone:
            self.host.detach()
            self.ending.window_end = "left running"
        if self.host.spawned and not self.options.keep_running and not self.ending.gone:
            self.host.kill()
            self.ending.window_end = "killed"
        time.sleep(0.05)
        self._drain()

    def _end(self, interrupted: bool) -> CaptureResult:
        self._crash_frames()
        now = time.monotonic()
        e, c = self.ending, self.clock
        end_body = classify_end(
            window=self.window, attach_delay=self.options.attach_delay,
            t_start=c.start, t_attach=c.attach, t_gone=c.gone if e.gone else None, t_now=now,
            interrupted=interrupted, detach_reason=e.detach_reason, exit_info=e.exit_info,
            crash_info=e.crash_info, timeout_info=e.timeout_info, rates=self.rates,
            thresholds=self.options.thresholds, calls_total=self.live.activity(),
            # Only a death in the window: at its end memtrace kills what it launched itself.
            exit_status=(self.host.exit_status(1.0) or e.spawn_status) if e.gone else None,
            exec_info=e.exec_info if e.replaced else None, stage=self.stage, window_end=e.window_end,
        )
        if interrupted and _ending_signal:
            name = signal.Signals(_ending_signal[0]).name
            why = " (the terminal closed)" if _ending_signal[0] == signal.SIGHUP else ""
            end_body["reason"] = f"ended early by {name}{why}; data up to then is kept"
            end_body.setdefault("evidence", {})["signal"] = name
        end_body["ended_at"] = _iso_now()
        end_body.update(self.live.snapshot())
        end_body["batches"] = self.batches
        end_body["process_guard"] = self.process_info
        if self.child is None and self.family is not None:
            self.children.extend(self.family.unreported())
        end_body.update(children_evidence(self.children))
        if self.child is not None:
            end_body["origin"] = {**self.child.to_json(), "parent_capture": self.parent_capture}
        end_body["pid"] = self.host.pid
        end_body["launch"] = {"how": getattr(self, "launch_how", None), "launcher": self.target.launch}
        end_body["timing"] = {
            "launch_to_attach_s": None if c.launch is None or c.attach is None else round(c.attach - c.launch, 3),
            "captured_s": None if c.start is None else round((c.gone if e.gone and c.gone else now) - c.start, 3),
        }
        self._write(RecordType.END, end_body)
        assert self.writer is not None
        self.ui.phase("done")
        return CaptureResult(path=self.writer.path, ended=end_body["ended"], reason=end_body["reason"],
                             evidence=end_body.get("evidence", {}), pid=self.host.pid, missing=self.missing,
                             interrupted=interrupted,
                             signal=_ending_signal[0] if interrupted and _ending_signal else None)

    # -- messages -------------------------------------------------------------

    def _drain(self, wait: float = 0.05) -> None:
        while True:
            try:
                event = self.host.events.get(timeout=wait)
            except queue.Empty:
                return
            self._handle(*event)

    def _handle(self, kind: str, a: Any, b: Any) -> None:
        if kind == "detached":
            if a == "application-requested":
                return      # our own detach at the end of the window
            if self.ending.exec_info is not None and a in ("process-terminated", "process-replaced"):
                # The agent said it is about to exec and did not say it failed: the process
                # image was replaced (Frida without child gating calls that a termination).
                a = "process-replaced"
            self.ending.target_gone(a, self.clock)
            if a == "process-replaced":
                self._replaced()
            if b is not None and self.ending.crash_info is None:
                self.ending.crash_info = {"summary": getattr(b, "summary", str(b)),
                                          "report": getattr(b, "report", "")[:4000]}
            return
        if kind == "device-lost":
            self.ending.target_gone("device-lost", self.clock)
            self.ending.detach_reason = "device-lost"
            return
        self._last_message = time.monotonic()
        message = a
        if message.get("type") == "error":
            self._write(RecordType.WARNING, {"agent_error": message.get("description"), "stack": message.get("stack")})
            self.ui.warning(f"agent error: {message.get('description')}")
            return
        payload = message.get("payload") or {}
        self._route(payload.get("type"), payload, b or b"")

    def _route(self, ptype: str | None, payload: dict[str, Any], data: bytes) -> None:
        if ptype == "events:batch":
            counters = payload.get("counters")
            if isinstance(counters, list):
                # Counters past 2^53 come as decimal strings (exact); the capture holds ints.
                payload["counters"] = [int(c) if isinstance(c, str) else c for c in counters]
            self._write(RecordType.BATCH, payload, data)
            self.batches += 1
            self.live.batch(payload, data)
            self.stacks.batch(data)
        elif ptype == "events:json":
            self._write(RecordType.EVENTS, payload)
            self.batches += 1
            events = payload.get("events", [])
            for ev in events:
                self.live.event(ev)
            self.stacks.events(events)
        elif ptype == "modules:update":
            self._write(RecordType.MODULES, payload)
            self.stacks.modules(payload.get("modules", []))
            self._feed_unwind(during_window=True)
            if payload.get("loaded"):
                self.host.ack()     # the loading thread waits for its module to be known here
        elif ptype == "agent:warning":
            self._write(RecordType.WARNING, payload)
            self.ui.warning(str(payload.get("message", "")))
        elif ptype == "agent:exit":
            self.ending.exit_info = {"status": payload.get("status"), "how": payload.get("how"), "t": payload.get("t")}
            if payload.get("calibration"):
                self._write(RecordType.CALIBRATION, {"phase": "at-exit", **payload["calibration"]})
        elif ptype == "agent:crash":
            self._crash(payload)
        elif ptype == "process:child":
            self._on_child(payload)
        elif ptype == "process:exec":
            self._on_exec(payload)
        elif ptype == "process:exec-failed":
            self._on_exec_failed(payload)
        elif ptype == "result":
            self._write(RecordType.RESULT, payload)
        elif ptype == "leaks:progress":
            self.ui.phase(leak_progress(payload))

    def _crash(self, payload: dict[str, Any]) -> None:
        """The agent's exception handler: signal, faulting address, the crashing thread's stack."""
        self.ending.crash_info = {k: payload.get(k) for k in ("kind", "signal", "address", "module", "memory",
                                                              "thread", "stack", "t")}
        self.stacks.events([{"frames": _as_return_addresses(payload.get("stack") or [])}])
        self.host.ack()     # the crashing thread waits for this before the process dies

    def _crash_frames(self) -> None:
        """The crash stack, symbolized now that every address has been (evidence and the reason)."""
        crash = self.ending.crash_info
        if not crash or not crash.get("stack"):
            return
        addresses = _as_return_addresses(crash["stack"])
        symtab = self.stacks.symtab
        # The faulting pc is the instruction itself, not a return address: it was symbolized one
        # byte on (every address is looked up one byte back), and is shown as itself.
        frames = [replace_fields(f, address=addresses[0] - 1, offset=None if f.offset is None else f.offset - 1)
                  for f in symtab.frames_of(addresses[0])]
        frames += symtab.stack(addresses[1:])
        crash["pc"] = hex(addresses[0] - 1)
        crash["frames"] = [f.to_json() for f in frames]
        crash["top"] = [f.name() for f in frames[:3]]

    # -- helpers --------------------------------------------------------------

    def _feed_unwind(self, during_window: bool) -> None:
        """Unwind tables for the target's modules without frame pointers (symbols/cfi.py); a
        local target only (the host reads the modules' files).  Failing leaves frame-pointer
        stacks, and says so; a target already gone is not asked."""
        e = self.ending
        if self.unwind is None or e.gone or e.exit_info is not None or e.timeout_info is not None:
            return
        try:
            self.unwind.feed(lambda method, *args: self.host.rpc("unwind tables", method, *args))
        except (AgentTimeout, TargetLost):
            if not during_window:
                raise
        except MemtraceError as err:
            self.unwind = None
            self._write(RecordType.WARNING, {"message": f"no unwind tables: {err}"})
            self.ui.warning(f"stacks follow frame pointers only: {err}")

    def _symbolize(self, final: bool = False) -> None:
        usable = self.clock.start is not None and not self.ending.gone and self.ending.timeout_info is None

        def by_agent(chunk: list[int]) -> list[list[Any]] | None:
            try:
                return self.host.rpc("symbolize", "symbolize", [hex(x) for x in chunk], timeout=30)
            except MemtraceError:
                return None

        for rows, by in self.stacks.symbolize(by_agent if usable else None, final=final):
            body: dict[str, Any] = {"rows": rows, "by": by}
            if by == "host":
                body["images"] = self.stacks.images()
            self._write(RecordType.SYMBOLS, body)

    def _tick(self) -> None:
        now = time.monotonic()
        t_prev, calls_prev, bytes_prev = self._last_tick
        if t_prev and now - t_prev < 1.0:
            return
        calls, nbytes = self.live.activity(), self.live.volume()
        dt = now - t_prev if t_prev else 0.0
        rate = (calls - calls_prev) / dt if dt > 0 else 0.0
        brate = (nbytes - bytes_prev) / dt if dt > 0 else 0.0
        assert self.clock.start is not None
        elapsed = now - self.clock.start
        sample = {"t": round(elapsed, 3), "calls": calls, "bytes": nbytes, "calls_per_s": round(rate, 1),
                  "bytes_per_s": round(brate, 1), "events": self.batches}
        self.rates.append(sample)
        self._write(RecordType.SNAPSHOT, {**sample, **self.live.snapshot()})
        self._last_tick = (now, calls, nbytes)
        self.ui.progress(Progress(elapsed=elapsed, window=self.window, activity_per_s=rate,
                                  bytes_per_s=brate, dropped=self.live.dropped(), rows=self.live.rows(),
                                  batches=self.batches, families=self.stacks.families()))

    def _precompiled_cmodule(self, hello: Any, config: dict[str, Any], sources: list[str]) -> str | None:
        """The core CModule as assembly compiled on this host once (agentbuild.precompiled_cmodule),
        for a local x86-64 Linux target whose agent compiles with gcc; None elsewhere."""
        if not (sources and self.host.is_local and isinstance(hello, dict) and hello.get("platform") == "linux"
                and hello.get("arch") == "x64" and config.get("toolchain") in ("auto", "external")):
            return None
        import frida

        # The source exactly as runtime/core.js's buildCore puts it together for this target.
        source = "#define MT_LINUX 1\n" + "\n".join(sources)
        builtins_file = default_cache_dir() / f"cmodule-builtins-{frida.__version__}-x64.json"
        try:
            builtins = json.loads(builtins_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            builtins = self.host.cmodule_builtins()
            with contextlib.suppress(OSError):
                builtins_file.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(builtins_file, json.dumps(builtins))
        return precompiled_cmodule(source, dict(builtins.get("defines") or {}), frida.__version__,
                                   lambda: dict(builtins.get("headers") or {}))

    def _agent_config(self) -> dict[str, Any]:
        config = {**self.tracer.agent_config(getattr(self, "_platform", None), self.options.agent_config),
                  "followChildren": self.options.follow_children, "childWaitMs": int(CHILD_WAIT_S * 1000)}
        if self.options.follow_children and config.get("toolchain") == "auto":
            # The external toolchain's compiler would be a process of the target's, held and
            # followed like any other (and its compiler too): TinyCC compiles in the target.
            config["toolchain"] = "internal"
        return config

    def _write(self, rtype: RecordType, body: Any, data: bytes = b"") -> None:
        assert self.writer is not None
        try:
            self.writer.write(rtype, body, data)
        except CaptureWriteError as e:
            # Disk full (or failing): the window ends, the agent is stopped and detached as at any
            # window end, and the writer closes the capture with an END record that says why.
            self.write_error = self.write_error or e

    def _write_meta(self) -> None:
        import frida

        self._write(RecordType.META, {
            "tool": "memtrace", "tool_version": __version__, "tracer": self.options.tracer,
            "target": {"device": self.target.device, "app": self.target.app, "pid": self.target.pid,
                       "name": self.target.name, "argv": self.target.argv,
                       # A followed child is reported with the target that made it.
                       "label": self.family.label if self.family is not None else self.target.slug()},
            **({"origin": {**self.child.to_json(), "parent_capture": self.parent_capture}} if self.child else {}),
            "options": {"window": None if self.window == float("inf") else self.window, "attach_delay": self.options.attach_delay,
                        "agent": self._agent_config()},
            "host": {"hostname": socket.gethostname(), "python": sys.version.split()[0], "frida": frida.__version__},
            "started_at": _iso_now(),
        })


ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_ending_signal: list[int] = []       # the signal that ended the capture, if one did
# frida-core's words for a process that died while it was being spawned.
_SPAWN_DEATH = re.compile(r"terminated with signal (\d+)")


def _as_return_addresses(stack: list[Any]) -> list[int]:
    """A crash stack (the faulting pc, then return addresses) as addresses every symbolizer reads
    alike: each is looked up one byte back (a return address points after its call), so the pc is
    noted one byte on, and its own instruction is what names it."""
    out = [int(a, 16) if isinstance(a, str) else int(a) for a in stack]
    if out:
        out[0] += 1
    return out


def _raise_interrupt(signum: int, frame: object) -> None:
    if not _ending_signal:
        _ending_signal.append(signum)
    if signum == signal.SIGHUP:
        # The terminal is gone: a write to it would fail (EIO) halfway through detaching.  What
        # memtrace still has to say goes nowhere; the capture and its END are what count.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.close(devnull)
    raise KeyboardInterrupt


def _iso_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def run_capture(tracer: Tracer | str, target: TargetSpec, options: CaptureOptions, ui: UI | None = None,
                host: AgentHost | None = None) -> CaptureResult:
    """One capture with the default host (Frida) unless another is given."""
    if isinstance(tracer, str):
        from memtrace import tracers

        found = tracers.get(tracer)
        if found is None:
            raise InputError(f"unknown tracer {tracer!r} (one of {', '.join(tracers.names())})")
        tracer = found
    ui = ui or SilentUI()
    if host is None:
        from memtrace.frida_host import FridaHost

        stdio = "pipe"
        if getattr(ui, "passthrough", False):      # the program's output is shown: its stdin is the user's
            stdio = "inherit"
        host = FridaHost(target, options.thresholds.rpc_timeout, output=ui.output, stdio=stdio)
    return CaptureLoop(host, tracer, target, options, ui).run()
