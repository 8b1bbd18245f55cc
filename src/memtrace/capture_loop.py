"""One capture of one target with one tracer, whatever backend produces the records.

The loop owns the window, the attach delay, the deadlines, the death evidence, the capture
file and the live view; a :class:`~memtrace.record_source.RecordSource` (Frida's:
:mod:`memtrace.frida_host`; a stock iPhone's Instruments: :mod:`memtrace.dvt.host`; a capture
played back: :mod:`memtrace.replay`) owns the device, the process and whatever records.  The
processes the target makes go to a :class:`~memtrace.children.ChildFollower`.  The loop never
prints: it reports to a :class:`memtrace.ui.UI`.  Tracer-specific statistics come from the
tracer's registry entry.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from dataclasses import replace as replace_fields
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

from memtrace import __version__, priority
from memtrace.capture import (
    FILE_NAME,
    CaptureWriteError,
    CaptureWriter,
    DeferredBytes,
    Record,
    RecordType,
    StackTails,
    admit_body,
)
from memtrace.children import CHILD_WAIT_S, Child, ChildFollower, ChildUI, Family
from memtrace.deaths import DeathThresholds, classify_end
from memtrace.errors import (
    AgentTimeout,
    InputError,
    MemtraceError,
    TargetGone,
    TargetLost,
    first_line,
    is_frida_error,
)
from memtrace.exact import exact_batch_ints
from memtrace.exitwatch import local_pid_alive
from memtrace.fold import SummaryFold
from memtrace.live import CoreStats, LiveStats
from memtrace.record_source import AgentError, DeviceLost, Ended, Notice, RecordSource, SourceEvent
from memtrace.stacks_seen import StacksSeen
from memtrace.target import TargetSpec
from memtrace.tracers import Tracer
from memtrace.tracers.options import Option, finite_non_negative, positive
from memtrace.ui import UI, Progress, SilentUI

# A local target without a live panel: its stacks are named first after it has run this long, then
# this often (_names_while_running).
NAMES_QUIET_S = 5.0
DEFAULT_WINDOW = 60.0      # seconds: the window of an app or a running process, unless --window says
# A process Frida calls terminated that still runs this long after is one whose channel was cut.
CHANNEL_LOST_GRACE_S = 2.0

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
    # The tracer's summary, folded while the capture was written (run_capture's ``summarize``);
    # None: not asked for, or the fold failed (read the capture back).
    summary: Any = None
    # What of the capture its own reader skipped (damaged records), when the fold saw any.
    damage: str | None = None


# The seam's older name (tracers' ``host`` hook returns one).
AgentHost = RecordSource


@dataclass
class Clock:
    """Monotonic times of the capture's milestones."""

    launch: float | None = None
    attach: float | None = None
    start: float | None = None
    gone: float | None = None
    # The start's steps (issue 21, item 6: the fixed cost), CLOCK_MONOTONIC seconds by name, in
    # order: the capture loop's, then its source's (FridaHost.phases), into END's timing.phases.
    phases: dict[str, float] = field(default_factory=dict)
    # Seconds spent symbolizing (issue 21, item 6: <= 1 s at the end): all of the run's, the final round's.
    symbolize_s: float = 0.0
    final_symbolize_s: float = 0.0


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


class CaptureLoop:
    """Launch or attach through the record source, instrument, stream a window into a capture."""

    def __init__(self, source: RecordSource, tracer: Tracer, target: TargetSpec, options: CaptureOptions,
                 ui: UI | None = None, family: Family | None = None, child: Child | None = None,
                 release: str | None = None, parent_capture: str | None = None,
                 summarize: Callable[[Iterable[Record]], Any] | None = None) -> None:
        target.validate()
        options.validate()
        self.family = family           # set for a followed process; the root makes its own in run()
        self.child = child             # this capture follows a process the target made
        self.release = release         # a fork child's entry: its new agent lets it run on
        self.parent_capture = parent_capture
        self.follower: ChildFollower | None = None   # the processes the target makes (run() sets it)
        self.source = source
        self.tracer = tracer
        self.target = target
        self.options = options
        self.ui = ui or SilentUI()
        self.clock = Clock()
        self.ending = Ending()
        self.live: LiveStats = tracer.live()
        self.stacks = StacksSeen(want_families=getattr(self.ui, "wants_families", False))
        self._host_symbols = False     # a local target: the host symbolizes (_launch_and_attach)
        self._fields_left_out: dict[str, int] = {}     # agent batch fields left out: how often (_route)
        # A drain's bytes the agent sent ahead of its batch in pieces (events:part, runtime/flush.js),
        # and how many pieces were joined to their batch.
        self._parts: list[bytes] = []
        self._pieces_joined = 0
        self._tails = StackTails()      # the wire's STACK_TAIL records made whole (_whole_stacks)
        self._named_at = 0.0            # the last round of names while the target ran (_names_while_running)
        if isinstance(self.live, CoreStats):
            self.live.label = self.stacks.label      # the live view names its fastest-growing stacks
        self._platform: str | None = None
        self._exec_seen: float | None = None
        self.writer: CaptureWriter | None = None
        self._summarize = summarize
        self.fold: SummaryFold | None = None
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
        self._pid_seen_at_start = False
        # A program memtrace starts runs to its end unless --window limits it; an app or a running
        # process gets the default window.
        # A followed child (window None) ends with its family's window, whatever that is.
        self.window: float = options.window if options.window is not None else (
            float("inf") if target.argv or child is not None else DEFAULT_WINDOW)

    # -- public ---------------------------------------------------------------

    def run(self) -> CaptureResult:
        self.clock.phases["loop"] = time.monotonic()
        out = self.options.out or default_out_dir(self.target, self.options.tracer)
        made = not out.exists()
        try:
            path = prepare_out_dir(out, self.options.capture_name)
            self.fold = SummaryFold(self._summarize, path) if self._summarize is not None else None
            self.writer = CaptureWriter(path, observer=self.fold.feed if self.fold is not None else None)
        except CaptureWriteError:
            if made:        # the disk is full already: leave nothing behind, only the error
                with contextlib.suppress(OSError):
                    out.rmdir()
            raise
        if self.family is None:
            self.family = Family(folder=out, label=self.target.slug(), deadline=float("inf"),
                                 follow=self.options.follow_children)
        self.follower = ChildFollower(self.family, self.options.follow_children, self._write, self.ui.warning,
                                      self._capture_child, lambda: self.source.pid)
        interrupted = False
        on_main = threading.current_thread() is threading.main_thread()
        # SIGTERM, and SIGHUP (the terminal closed): end the capture as Ctrl-C does -- detach, kill
        # what memtrace launched, write END -- instead of dying with the target left behind.
        previous = {sig: signal.getsignal(sig) for sig in ENDING_SIGNALS} if on_main else {}
        if on_main:
            _ending_signal.clear()
        for sig in previous:
            signal.signal(sig, _raise_interrupt)
        # A --pid process seen alive (here: /proc) before its capture began: one the launch then
        # finds gone was killed meanwhile -- its capture stays, death named (not "no such process").
        self._pid_seen_at_start = self.target.pid is not None and local_pid_alive(self.target.pid)
        try:
            self._write_meta()
            if self.write_error is not None:        # nothing launched yet: no capture, one error
                self._discard_capture()
                raise CaptureWriteError(f"{self.writer.path}: cannot start the capture: {self.writer.error}")
            try:
                try:
                    with _frida_errors_as_lost(self):
                        self._launch_and_attach()
                except MemtraceError as e:
                    self._note_frida_signal(e)
                    if (self.stage == "spawn" and self.ending.spawn_status is not None) or self._died_meanwhile():
                        # The target memtrace launched died while being spawned or injected:
                        # that is what the capture says (its END names the signal and the stage).
                        raise TargetGone() from None
                    # Nothing was captured: leave no stub folder behind (a report would call it
                    # truncated), and no suspended process memtrace started.
                    if self.source.spawned:
                        # Detached first, as in _abandon: an injected agent is unloaded before the
                        # process dies under it.
                        with contextlib.suppress(Exception):
                            self.source.detach()
                        with contextlib.suppress(Exception):
                            self.source.kill()
                    self._discard_capture()
                    if isinstance(e, TargetLost):
                        # Not the window's "target lost" below: there is no capture to end now
                        # (writing its END to the discarded file was an EBADF error).
                        raise MemtraceError(f"{self.target.describe()}: {e}", e.exit_code) from None
                    raise
                if self.child is not None:
                    self.child.attached = True      # its file stays: the parent's END may name it
                with _frida_errors_as_lost(self):
                    try:
                        self._instrument()
                    except (AgentTimeout, TargetLost, CaptureWriteError):
                        raise       # said below (or above) as before
                    except MemtraceError:
                        self._abandon()
                        raise
                self._window()
            except KeyboardInterrupt:
                interrupted = True
            except TargetGone as e:
                self._note_frida_signal(e)
                self.ending.target_gone("process-terminated", self.clock)
            except AgentTimeout as e:
                if self._died_meanwhile():
                    # Killed while the agent was being started: its rpc never answered because
                    # the process is gone -- a death at this stage, not a hung script.
                    self.ending.target_gone("process-terminated", self.clock)
                else:
                    self.ending.timeout_info = self._timeout_evidence({"what": e.what, "timeout_s": e.seconds})
                    self.ui.warning(str(e))
            except TargetLost as e:
                if self.clock.attach is None and not self.source.spawned:
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
                self.follower.join(self.ui.phase)
            result = self._end(interrupted)
        except BaseException as failure:
            # memtrace itself failed (a bug; an error nothing above handles): the hooks come out
            # before it goes, so the target runs on untraced and memtrace's interpreter does not
            # end with a session still live under Frida's threads (CI saw such an exit die of
            # SIGSEGV after the traceback, once in ten runs).  A second detach is a no-op.
            with contextlib.suppress(Exception):
                self.source.detach()
            self._end_failed(failure)
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.writer.close()
            if self.fold is not None:
                self.fold.close()
            self.source.close()
        if self.write_error is not None:
            raise CaptureWriteError(f"{self.writer.failure()}; tracing stopped there and memtrace detached "
                                    f"from the target")
        if self.fold is not None:
            result.summary = self.fold.result()
            result.damage = self.fold.damage()
        return result

    def _end_failed(self, failure: BaseException) -> None:
        """A capture that memtrace's own failure cut short ends with an END that says so, not as a
        file a report can only call truncated.  Errors memtrace raises on purpose (a launch that
        failed, a disk that filled) end their captures their own way, or leave none."""
        if isinstance(failure, (MemtraceError, CaptureWriteError)) or not isinstance(failure, Exception):
            return
        if self.writer is None or self.writer.end_written:
            return
        what = f"{type(failure).__name__}: {failure}"
        evidence: dict[str, Any] = {"error": what, "stage": self.stage}
        body: dict[str, Any] = {"ended": "memtrace-failed",
                "reason": f"memtrace failed during {self.stage or 'the capture'} ({what}) and detached from "
                          f"the target; data up to then is kept",
                "evidence": evidence, "ended_at": _iso_now(),
                "pid": self.source.pid}
        with contextlib.suppress(Exception):        # the failure may be the capture's own
            body.update(self.live.snapshot())
            body["batches"] = self.batches
            evidence["calls"] = self.live.activity()
        if self._host_symbols:
            # The names of the stacks written, which a local target's get at the end (the files are
            # on this machine; the failure may be the symbolizer's own: then the stacks stay unnamed).
            with contextlib.suppress(Exception):
                self._symbolize(final=True)
        with contextlib.suppress(Exception):
            self._write(RecordType.END, body)

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

    def _timeout_evidence(self, info: dict[str, Any]) -> dict[str, Any]:
        """A silent agent in a local target whose threads (or the machine) keep every CPU busy was
        starved, not frozen: said with the counts (memtrace.priority.starvation)."""
        pid = self.source.pid
        if self.source.is_local and pid is not None:
            starved = priority.starvation(pid)
            if starved is not None:
                info["starved"] = starved
        return info

    def _died_meanwhile(self) -> bool:
        """The target existed and is gone now: an attach that failed because the target was
        killed under it, not because it cannot be attached.  That counts for a process memtrace
        launched; for one it attaches to (--pid, --name) once injection began -- the pid was there
        to inject; and for a local --pid process seen alive at the start that the launch found gone."""
        counts = (self.source.spawned or self.stage in ("injection", "agent load")
                  or (self.stage == "spawn" and self._pid_seen_at_start and self.source.is_local))
        # The launcher's pid; a launch that found the --pid process gone took none: it is --pid's.
        pid = self.source.pid if self.source.pid is not None else self.target.pid
        if not counts or pid is None:
            return False
        end = time.monotonic() + 1.0        # a SIGKILL takes a moment to be final
        while local_pid_alive(pid) if self.source.is_local else self.source.alive():
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)
        return True

    def _abandon(self) -> None:
        """The agent could not be put in or started (its C did not build, its init or start
        failed): the run ends with the error.  A program memtrace spawned is killed -- it was held
        before its first constructor, and released untraced it would run on in the background, an
        orphan of a failed command (a storm found 7 such after 7 failed builds) -- and, as it never
        ran under the hooks, no capture of it is left.  A --pid process, its own, is detached from:
        left attached by a long-lived host (a library user, a storm's driver), the session's mark
        refused every later session on that process (200 storm cycles in a row).  Detached first
        either way, so the agent unloads before a spawned process dies under it.  (A --pid shell
        has been seen to die with SIGSEGV at 0x320 in Frida's uninjection after such a detach, with
        or without a spawned program before it: docs/hook-storm.md, "Round 9" -- not this order's
        doing, and not fixed by it.)"""
        with contextlib.suppress(Exception):
            self.source.detach()
        if self.source.spawned:
            with contextlib.suppress(Exception):
                self.source.kill()
        if self.source.spawned and self.clock.start is None:
            self._discard_capture()

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
        self.device_info = self.source.open()
        self.clock.phases["device"] = time.monotonic()
        if self.source.is_local:
            # The host symbolizes (symbolic, pyelftools): imported while Frida injects (below),
            # made at the first symbolization (_symbolize), not before the target runs.
            self._host_symbols = True
        else:
            from memtrace.symbols.device import local_tree

            self.stacks.device_tree = local_tree(self.device_info)
        self.stage = "spawn"
        # With an attach delay the target is to run first: no hold before its constructors.
        launched = self.source.launch(hold_constructors=self.options.attach_delay <= 0,
                                      follow_children=self.child is None and self.options.follow_children)
        self.clock.phases["launched"] = time.monotonic()
        held = self.source.held_images()
        if held is not None and self.follower is not None:
            self.follower.watch_held(held)
        self.clock.launch = getattr(launched, "t_launch", None)
        if self.child is not None:
            # A followed process "launched" when the host learned of it: what it ran before the
            # attach went untraced (an exec'd image; a fork child waits for its agent).
            self.clock.launch = self.child.seen
        self.launch_how = getattr(launched, "how", None)
        if self.options.attach_delay > 0:
            self.source.resume()
            self.ui.phase("waiting")
            self.stage = "attach delay"
            self._sleep_watching(self.options.attach_delay)
        self.ui.phase("attaching")
        self.stage = "injection"
        prepare = getattr(self.source, "prepare", None)
        if prepare is not None:     # the agent's files, read while Frida injects (FridaHost.prepare)
            prepare(self.tracer.agent_name)
        self._preload()
        self.source.attach()
        self.clock.attach = self.clock.phases["attached"] = time.monotonic()

    def _preload(self) -> None:
        """Import what the capture uses later on a thread of its own while Frida injects the agent
        (the main thread waits on Frida there, without the GIL): the unwind tables' reader and the
        host symbolizer (a local target), the tracer's analyzer (the summary at the end) and the
        console's rendering (the live panel's summary).  Before the target is spawned nothing is
        imported that it does not need (issue 21, item 6)."""
        names = ["frida_tools.application", "memtrace.analyze.symbols", self.tracer.analyzer]
        if self.source.is_local:
            names[:0] = ["memtrace.symbols.cfi", "memtrace.symbols.service"]
        if getattr(self.ui, "wants_families", False):
            names.append("memtrace.reporters.console")
        threading.Thread(target=_import_quietly, args=(names,), daemon=True, name="memtrace-import").start()

    def _sleep_watching(self, seconds: float) -> None:
        """Wait before attaching; a spawned target that exits meanwhile ends the capture."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
            if self.source.spawned and not self.source.alive():
                raise TargetGone()

    def _instrument(self) -> None:
        self.ui.phase("loading agent")
        self.stage = "agent load"
        instrumented = self.source.instrument(self.tracer.agent_name, self._config_for)
        hello, init = instrumented.hello, instrumented.init
        self._platform = instrumented.platform
        recon = init.get("recon", [])
        self.missing = [r["name"] for r in recon if r.get("status") == "MISSING"]
        self.process_info = dict(init.get("process") or {})
        if not self.process_info.get("guard") and (self.options.follow_children or self._platform != "darwin"):
            self.ui.warning(f"fork children and exec are not handled in this target: "
                            f"{self.process_info.get('why', 'an agent without it')}")
        for notice in instrumented.notices:
            self._notice(notice)
        hold = self.source.hold_info
        if hold is not None and not hold.get("held"):
            self.ui.warning(f"library constructors ran before the hooks: {hold.get('why')}")
        self._write(RecordType.RECON, {"symbols": recon, "info": init.get("info", {}), "agent": hello,
                                       "device": self.device_info, "process": self.process_info,
                                       "hold": hold,
                                       "unwind": instrumented.unwind})
        for name in self.missing:
            self.ui.warning(f"MISSING hook symbol: {name}")
        # The "before" calibration, taken before any hook: with the start where the source can
        # (one round trip fewer before the target runs; issue 21: fixed cost).
        if getattr(self.source, "start_calibrates", False):
            started = self.source.start(calibrate=True)
            before = dict(started.get("calibration") or {})
        else:
            before = self.source.calibrate()
            started = self.source.start()
        self.clock.start = self.clock.phases["started"] = time.monotonic()
        self._write(RecordType.CALIBRATION, {"phase": "before", **before})
        self.process_info.update(started.get("process") or {})
        assert self.family is not None
        if self.child is None:
            self.family.deadline = self.clock.start + self.window
        if self.release is not None and self.child is not None:
            # A fork child waits in its atfork handler until its own agent is in.
            self.source.release_fork(self.release, self.child.pid)
        self._start_quiet()
        self.source.resume()
        self.clock.phases["resumed"] = time.monotonic()

    def _window(self) -> None:
        self.ui.phase("capturing")
        self.stage = "window"
        self._last_message = time.monotonic()
        assert self.clock.start is not None and self.family is not None
        deadline = self.family.deadline
        while not self.ending.gone and self.write_error is None:
            self._raise_if_signalled()
            now = time.monotonic()
            if now >= deadline or self.family.stopped.is_set():
                break
            event = self.source.next_event(min(0.1, deadline - now))
            if event is not None:
                self._handle(event)
                self.drain(wait=0.0, until=deadline)
            if self._names_while_running():
                self._end_quiet()
                self._symbolize()
            self._tick()
            silent = time.monotonic() - self._last_message
            if silent > self.options.thresholds.rpc_timeout and not self.ending.gone:
                if self._channel_cut():
                    # Frida has not said it lost the agent (a loaded host may not have seen the
                    # descriptors go yet), but a living target that holds no socket at all cannot
                    # hold Frida's channel: it closed it under Frida, as _outlives_its_channel finds.
                    self.ui.warning(f"the agent has been silent for {silent:.1f} s and the target holds no socket")
                    self.ending.target_gone("channel-lost", self.clock)
                    return
                # Agents say something every 100 ms even when idle: silence this long while the
                # process lives means it was frozen (anti-debug stops, a debugger, SIGSTOP).
                self.ending.timeout_info = self._timeout_evidence({
                    "what": "its periodic flush (agent went silent)",
                    "timeout_s": self.options.thresholds.rpc_timeout, "silent_s": round(silent, 3)})
                self.ui.warning(f"the agent has been silent for {silent:.1f} s")
                return

    def _finish(self) -> None:
        """Detach cleanly: stop the hooks, flush, calibrate, then drain what arrived."""
        self.ui.phase("flushing")
        if self.fold is not None:
            self.fold.start()       # the window is over: the summary folds what is written from here on
        if not self.ending.gone:
            self.stage = "detach"
        loaded = self.clock.start is not None or self.clock.attach is not None
        if loaded and not self.ending.gone and self.ending.timeout_info is None:
            try:
                if self.tracer.window_end is not None:
                    self.tracer.window_end(self)
                # Hooks out under stopped worlds (agents/runtime/world.js) can take seconds on a
                # loaded machine; a host that leaves mid-stop unloads the agent early.
                hooks_out = self.source.stop(timeout=max(10.0, self.options.thresholds.rpc_timeout))
                self.drain()
                after = self.source.calibrate(timeout=10)
                # How the hooks came out (every stop of the world, the waits for threads inside our
                # code), kept with the capture: the evidence a rare failure needs (docs/architecture.md).
                self._write(RecordType.CALIBRATION, {"phase": "after", **after,
                                                     **({"world": hooks_out} if hooks_out is not None else {})})
            except AgentTimeout as e:
                if not self.ending.gone:
                    self.ending.timeout_info = self._timeout_evidence({"what": e.what, "timeout_s": e.seconds})
            except TargetLost:
                pass
            except MemtraceError as e:
                self.ui.warning(str(e))
        self.drain()
        # The hooks are out (or the target is gone): what a quiet start held is written now.
        self._end_quiet()
        self._symbolize(final=True)
        if not self.ending.gone:
            self.source.detach()
            self.ending.window_end = "left running"
        if self.source.spawned and not self.options.keep_running and not self.ending.gone:
            self.source.kill()
            self.ending.window_end = "killed"
        if self.ending.detach_reason == "channel-lost":
            # Alive, unreachable, and Frida's threads spinning on the descriptors it lost: a program
            # memtrace launched is not left so.
            if self.source.spawned and not self.options.keep_running:
                self.source.kill()
            self.ending.window_end = "killed" if self.source.spawned and not self.options.keep_running else "left running"
        if self.ending.detach_reason not in ("process-terminated", "process-replaced"):
            # What the detach or the kill shook loose.  A target Frida saw end said its last before
            # Frida's "detached" (delivered in order, drained above): no wait (issue 21, item 6).
            time.sleep(0.05)
            self.drain()

    def _end(self, interrupted: bool) -> CaptureResult:
        self._end_quiet()           # (a _finish cut short): the END counts what the held batches said
        self._crash_frames()
        assert self.follower is not None
        self.follower.settle(self.ending.exec_info if self.ending.replaced else None)
        now = time.monotonic()
        e, c = self.ending, self.clock
        exit_status = (self.source.exit_status(1.0) or e.spawn_status) if e.gone else None
        code = (exit_status or {}).get("exit_status")
        if (e.detach_reason == "process-terminated" and e.exit_info is None and e.crash_info is None
                and code is not None and c.start is not None):
            # It exited with a status, yet the agent never said goodbye (its exit hook sends one): the
            # channel was gone before the exit -- cut by the target, and the rest of the run unseen.
            # (Not before the agent started: a target gone during the attach delay or the
            # injection never had a channel to lose.)
            e.detach_reason = "channel-lost"
            e.window_end = f"exited later (exit status {code})"
        end_body = classify_end(
            window=self.window, attach_delay=self.options.attach_delay,
            t_start=c.start, t_attach=c.attach, t_gone=c.gone if e.gone else None, t_now=now,
            interrupted=interrupted, detach_reason=e.detach_reason, exit_info=e.exit_info,
            crash_info=e.crash_info, timeout_info=e.timeout_info, rates=self.rates,
            thresholds=self.options.thresholds, calls_total=self.live.activity(),
            # Only a death in the window: at its end memtrace kills what it launched itself.
            exit_status=exit_status,
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
        if self._pieces_joined:
            end_body["batch_pieces"] = self._pieces_joined
        if self._parts:
            # A drain whose batch never came (the agent went mid-send): its bytes cut at any offset,
            # not records the reader could take; said, not kept.
            end_body["batch_pieces_lost"] = {"pieces": len(self._parts), "bytes": sum(map(len, self._parts))}
        if self._tails.broken:
            end_body["stack_tails_broken"] = self._tails.broken
        if self._fields_left_out:
            # Agent batch fields the reader would have refused (_route): how many batches each.
            end_body["batch_fields_left_out"] = dict(self._fields_left_out)
        end_body["process_guard"] = self.process_info
        assert self.follower is not None
        end_body.update(self.follower.evidence(root=self.child is None))
        if self.child is not None:
            end_body["origin"] = {**self.child.to_json(), "parent_capture": self.parent_capture}
        end_body["pid"] = self.source.pid
        end_body["launch"] = {"how": getattr(self, "launch_how", None), "launcher": self.target.launch}
        end_body["timing"] = {
            "launch_to_attach_s": None if c.launch is None or c.attach is None else round(c.attach - c.launch, 3),
            "captured_s": None if c.start is None else round((c.gone if e.gone and c.gone else now) - c.start, 3),
            "phases": _start_phases(c.phases, getattr(self.source, "phases", None)),
            "symbolize_s": round(c.symbolize_s, 3),
            "final_symbolize_s": round(c.final_symbolize_s, 3),
        }
        self._write(RecordType.END, end_body)
        assert self.writer is not None
        self.ui.phase("done")
        return CaptureResult(path=self.writer.path, ended=end_body["ended"], reason=end_body["reason"],
                             evidence=end_body.get("evidence", {}), pid=self.source.pid, missing=self.missing,
                             interrupted=interrupted,
                             signal=_ending_signal[0] if interrupted and _ending_signal else None)

    # -- messages -------------------------------------------------------------

    def drain(self, wait: float = 0.05, until: float | None = None) -> None:
        """Handle what the source sent until it has been quiet for ``wait`` seconds, or (``until``,
        a time.monotonic() deadline) until then at the latest.  The window's drains are bounded by
        its deadline: an agent whose messages come faster than they are handled (the purgeable
        storm's four threads streaming without pause) never leaves the queue empty, and a drain
        that waited for it kept the window open for ever -- the stop never sent, the agent's sends
        piling up in Frida's transport (its thread in sendmsg), the target's threads queued on the
        script's lock behind them: the storm's hang (docs/hook-storm.md)."""
        while until is None or time.monotonic() < until:
            event = self.source.next_event(wait)
            if event is None:
                return
            self._handle(event)

    def _handle(self, event: SourceEvent) -> None:
        if isinstance(event, Ended):
            reason = event.reason
            if reason == "application-requested":
                return      # our own detach at the end of the window
            if self.ending.exec_info is not None and reason in ("process-terminated", "process-replaced"):
                # The agent said it is about to exec and did not say it failed: the process
                # image was replaced (Frida without child gating calls that a termination).
                reason = "process-replaced"
            if reason == "process-terminated" and self._outlives_its_channel():
                reason = "channel-lost"
            self.ending.target_gone(reason, self.clock)
            if reason == "process-replaced":
                self._replaced()
            crash = event.crash
            if crash is not None and self.ending.crash_info is None:
                self.ending.crash_info = {"summary": getattr(crash, "summary", str(crash)),
                                          "report": getattr(crash, "report", "")[:4000]}
            return
        if isinstance(event, DeviceLost):
            self.ending.target_gone("device-lost", self.clock)
            self.ending.detach_reason = "device-lost"
            return
        self._last_message = time.monotonic()
        if isinstance(event, AgentError):
            self._write(RecordType.WARNING, {"agent_error": event.description, "stack": event.stack})
            self.ui.warning(f"agent error: {event.description}")
            return
        self._route(event.payload.get("type"), event.payload, event.data)

    def _whole_stacks(self, data: bytes) -> bytes:
        """A batch with its STACK_TAIL records made STACK records (StackTails: each after the batch
        before it, in the order they came).  Interrupted (a deferred one is made at the end, where a
        Ctrl-C can land), it leaves the StackTails as it found them, so that it can be made again."""
        t = self._tails
        before = (t.last_id, t.last_frames, t.expanded, t.broken)
        try:
            return self._whole_stacks_once(data)
        except BaseException:
            t.last_id, t.last_frames, t.expanded, t.broken = before
            raise

    def _whole_stacks_once(self, data: bytes) -> bytes:
        broken_before = self._tails.broken
        data = self._tails.expand(data)
        if broken_before == 0 and self._tails.broken:      # said once
            self.ui.warning("a stack definition came without the one before it: its outer frames are "
                            "missing (counted in the END record's stack_tails_broken)")
        return data

    def _channel_cut(self) -> bool:
        """A local target alive without a single socket descriptor: Frida's channel to the agent
        (a socket in the target) is gone.  Any socket left, or /proc unreadable: not known, False."""
        pid = self.source.pid
        if not self.source.is_local or pid is None or not self.source.alive():
            return False
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            return not any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in fds)
        except OSError:
            return False

    def _outlives_its_channel(self) -> bool:
        """Frida said the process terminated, yet a local one still runs a moment later: its channel
        to the agent was cut under Frida (the target closed Frida's descriptors with the close system
        call itself, which the agent's descriptor guard cannot see)."""
        if not self.source.is_local:
            return False
        deadline = time.monotonic() + CHANNEL_LOST_GRACE_S
        while self.source.alive():
            if time.monotonic() > deadline:
                return True
            time.sleep(0.05)
        return False

    def _route(self, ptype: str | None, payload: dict[str, Any], data: bytes) -> None:
        if ptype == "events:part":
            self._parts.append(data or b"")
            return
        if ptype == "events:batch":
            if self._parts:
                data = b"".join([*self._parts, data or b""])
                self._pieces_joined += len(self._parts)
                self._parts.clear()
            wire: bytes | DeferredBytes = data
            if data:
                # Held unwritten (the quiet start), its definitions are made whole when it is written.
                wire = DeferredBytes(partial(self._whole_stacks, data), len(data)) if self.writer and \
                    self.writer.holding else self._whole_stacks(data)
            exact_batch_ints(payload)
            for said in admit_body(RecordType.BATCH, payload):
                # Written as it came, the capture's reader would skip the batch and its stacks.
                # Said once per field (a WARNING and on screen), counted for the END.
                where = said.split(":", 1)[0]
                self._fields_left_out[where] = self._fields_left_out.get(where, 0) + 1
                if self._fields_left_out[where] == 1:
                    self._write(RecordType.WARNING, {"message": f"an agent batch's field left out: {said}",
                                                     "batch_field": said})
                    self.ui.warning(f"an agent batch's field left out: {said}")
            self._write(RecordType.BATCH, payload, wire)
            self.batches += 1
            self.live.batch(payload)
            self.stacks.batch(wire)
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
            e = self.ending
            # New modules' unwind tables (a target already gone is not asked); a module just
            # loaded has its loading thread waiting until it is known here.
            for notice in self.source.modules_seen(
                    bool(payload.get("loaded")),
                    feed_unwind=not (e.gone or e.exit_info is not None or e.timeout_info is not None)):
                self._notice(notice)
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
            assert self.follower is not None
            self.follower.on_child(payload)
        elif ptype == "process:exec":
            self._on_exec(payload)
        elif ptype == "process:exec-failed":
            self._on_exec_failed(payload)
        elif ptype == "result":
            self._write(RecordType.RESULT, payload)
        elif ptype == "leaks:progress":
            from memtrace.leakscan import leak_progress  # (a leak scan's: not at every start)

            self.ui.phase(leak_progress(payload))

    def _crash(self, payload: dict[str, Any]) -> None:
        """The agent's exception handler: signal, faulting address, the crashing thread's stack."""
        self.ending.crash_info = {k: payload.get(k) for k in ("kind", "signal", "address", "module", "memory",
                                                              "thread", "stack", "t")}
        self.stacks.events([{"frames": _as_return_addresses(payload.get("stack") or [])}])
        self.source.ack()     # the crashing thread waits for this before the process dies

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

    # -- the target's own exec ------------------------------------------------------

    def _on_exec(self, payload: dict[str, Any]) -> None:
        self._exec_seen = time.monotonic()
        self.ending.exec_info = {"path": payload.get("path"), "argv": payload.get("argv"), "t": payload.get("t")}
        self._write(RecordType.WARNING, {"message": f"the target is about to exec {payload.get('path')}",
                                         "process": "exec", "path": payload.get("path"),
                                         "argv": payload.get("argv")})
        # Everything the agent flushed before the exec is written: let the exec go on.
        self.source.ack()

    def _on_exec_failed(self, payload: dict[str, Any]) -> None:
        info = self.ending.exec_info or {}
        message = f"exec of {info.get('path')} failed (errno {payload.get('errno')}); the target goes on"
        self.ending.exec_info = None
        self._write(RecordType.WARNING, {"message": message, "process": "exec-failed", **payload})
        self.ui.warning(message)

    def _replaced(self) -> None:
        """The session ended with the exec: the follower follows the new image, or says why not."""
        assert self.follower is not None and self.source.pid is not None
        info = self.ending.exec_info if self.ending.exec_info is not None else {}
        since = self._exec_seen if self._exec_seen is not None else time.monotonic() - 2.0
        self.follower.on_replaced(info, since)

    def _linger(self) -> None:
        """The target exec'd and is not followed: pass its output through until it exits or the
        window ends (then it is stopped like any program memtrace launched)."""
        info = self.ending.exec_info
        if not self.ending.replaced or info is None or info.get("followed"):
            return
        assert self.family is not None
        self.ui.phase("passing output through")
        interrupted = True
        try:
            while time.monotonic() < self.family.deadline and not self.family.stopped.is_set() and self.source.alive():
                self._raise_if_signalled()
                time.sleep(0.05)
                self.drain(wait=0.0, until=self.family.deadline)
            interrupted = False
        finally:
            # Interrupted too (Ctrl-C, SIGTERM): what memtrace launched does not outlive it.
            if self.source.alive():
                if not interrupted:
                    info["outlived_window"] = True
                if self.source.spawned and not self.options.keep_running:
                    self.source.kill()

    def _capture_child(self, child: Child, entry: str | None, held: Path | None) -> CaptureResult:
        """The capture of a process this target made (``--follow-children``), same tracer and folder,
        through the source's own kind of backend; run on the follower's thread."""
        assert self.family is not None and self.writer is not None and child.capture is not None
        left = self.family.deadline - time.monotonic()
        options = replace_fields(self.options, out=self.family.folder, capture_name=child.capture,
                                 attach_delay=0.0, keep_running=True,
                                 window=None if left == float("inf") else max(0.1, round(left, 3)))
        target = TargetSpec(device=self.target.device, pid=child.pid, launch="none")
        loop = CaptureLoop(self.source.child_source(child.pid, held), self.tracer, target, options,
                           ChildUI(self.ui, child.pid), family=self.family, child=child, release=entry,
                           parent_capture=self.writer.path.name)
        return loop.run()

    # -- helpers --------------------------------------------------------------

    def _raise_if_signalled(self) -> None:
        """SIGTERM or SIGHUP came (its handler noted it in _ending_signal) but its KeyboardInterrupt
        never reached the loop.  Seen once in CI: memtrace, sent SIGTERM 2 s into a 60 s window, ran
        the whole window and said "completed" (rc 0), and no rerun has shown it again; whatever took
        the exception (Python passes on none raised in a finalizer the collector runs), the noted
        signal still ends the window here, within its 100 ms turn."""
        if _ending_signal and self.child is None and threading.current_thread() is threading.main_thread():
            raise KeyboardInterrupt

    def _start_quiet(self) -> None:
        """As the target starts: a local target without a live panel starts quietly.  The writer
        holds the records as they come (CaptureWriter.hold: no encoding, no compression) and the
        summary's fold waits (SummaryFold: it decodes every record written), until the target has
        run NAMES_QUIET_S (_names_while_running) or its window is over (_finish) -- the same quiet as
        the naming's: host work beside a short target, on the machine they share, slowed the target
        itself (cc1plus's own CPU time, paired against the host doing all of it as the drains came:
        0.91 in 15 repeats, 14 of them faster; CPython's 0.97).  The work is the same, done once the
        target has exited: a short run's command takes ~0.25 s longer.  Otherwise -- a remote
        target, or a panel to keep up to date -- the fold starts now."""
        assert self.writer is not None
        if self._host_symbols and not getattr(self.ui, "wants_families", False):
            self._writing(self.writer.hold)
        elif self.fold is not None:
            self.fold.start()

    def _end_quiet(self) -> None:
        """The held records written, the summary folding from here on (_start_quiet)."""
        assert self.writer is not None
        if self.writer.holding:
            self._writing(self.writer.release)
        if self.fold is not None:
            self.fold.start()

    def _names_while_running(self) -> bool:
        """Whether to symbolize now, while the target runs.  A local target's stacks are named on
        this machine, by this process, and naming them costs the host a CPU for a while (cc1plus:
        0.23 s spread over its 0.7 s): work beside the target on a machine it shares, which slowed
        the target itself -- the C++ bench program's CPU time was ~6 % lower with the host idle
        while it ran (caches and the memory bus are shared, whatever the scheduler does).  So
        without a live panel to show the names, a local target's stacks are named first once it
        has run NAMES_QUIET_S, then that often: a short program's all at the end (0.14 s for
        cc1plus's with the symbol caches warm), a long one's as it goes -- so that a host killed,
        a full disk (the writer holds only a few rounds then) or a library unloaded and replaced
        late in a long run costs seconds of names, not all of them.  A device's are named at the
        end anyway (StacksSeen.symbolize)."""
        if not self._host_symbols or getattr(self.ui, "wants_families", False):
            return True
        now = time.monotonic()
        if self.clock.start is None or now - max(self.clock.start, self._named_at) < NAMES_QUIET_S:
            return False
        self._named_at = now
        return True

    def _symbolize(self, final: bool = False) -> None:
        t0 = time.monotonic()
        try:
            self._symbolize_rounds(final)
        finally:
            took = time.monotonic() - t0
            self.clock.symbolize_s += took
            if final:
                self.clock.final_symbolize_s = took

    def _symbolize_rounds(self, final: bool) -> None:
        if self._host_symbols and self.stacks.host is None:
            self.stacks.symbolize_on_host()
        usable = self.clock.start is not None and not self.ending.gone and self.ending.timeout_info is None
        for rows, by in self.stacks.symbolize(self.source.symbolize if usable else None, final=final):
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
        # The tracer's rows (their stack labels: the families' rules read, the frames named) only
        # for a UI that shows a live panel (wants_families): --quiet, --json and tests' UIs skip
        # them (~5 % of the host's CPU in a cc1plus capture; issue 21: fixed cost).
        panel = getattr(self.ui, "wants_families", False)
        self.ui.progress(Progress(elapsed=elapsed, window=self.window, activity_per_s=rate,
                                  bytes_per_s=brate, dropped=self.live.dropped(),
                                  rows=self.live.rows() if panel else [],
                                  batches=self.batches, families=self.stacks.families()))

    def _config_for(self, platform: str | None) -> dict[str, Any]:
        self._platform = platform
        return self.agent_config()

    def agent_config(self) -> dict[str, Any]:
        """The agent's configuration for this capture (the target's platform once it is known)."""
        config = {**self.tracer.agent_config(self._platform, self.options.agent_config),
                  "followChildren": self.options.follow_children, "childWaitMs": int(CHILD_WAIT_S * 1000)}
        # With --follow-children the agent never starts the external toolchain's compiler (it would
        # be a process of the target's, held and followed like any other, and its compiler too):
        # it loads the core the host built (runtime/core.js), or compiles it with TinyCC.
        return config

    def _write(self, rtype: RecordType, body: Any, data: bytes | DeferredBytes = b"") -> None:
        assert self.writer is not None
        self._writing(partial(self.writer.write, rtype, body, data))

    def _writing(self, call: Callable[[], None]) -> None:
        try:
            call()
        except CaptureWriteError as e:
            # Disk full (or failing): the window ends, the agent is stopped and detached as at any
            # window end, and the writer closes the capture with an END record that says why.
            self.write_error = self.write_error or e

    def _notice(self, notice: Notice) -> None:
        self._write(RecordType.WARNING, notice.record)
        self.ui.warning(notice.screen)

    def _write_meta(self) -> None:
        self._write(RecordType.META, {
            "tool": "memtrace", "tool_version": __version__, "tracer": self.options.tracer,
            "target": {"device": self.target.device, "app": self.target.app, "pid": self.target.pid,
                       "name": self.target.name, "argv": self.target.argv,
                       # A followed child is reported with the target that made it.
                       "label": self.family.label if self.family is not None else self.target.slug()},
            **({"origin": {**self.child.to_json(), "parent_capture": self.parent_capture}} if self.child else {}),
            "options": {"window": None if self.window == float("inf") else self.window, "attach_delay": self.options.attach_delay,
                        "agent": self.agent_config()},
            "host": {"hostname": socket.gethostname(), "python": sys.version.split()[0],
                     **self.source.versions},
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


def _import_quietly(names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(Exception):       # the import is tried again where it is used
            importlib.import_module(name)


@contextlib.contextmanager
def _frida_errors_as_lost(loop: Any) -> Iterator[None]:
    """A Frida error no call site mapped (the process killed under Frida's injector: "failed to
    open file /proc/N/auxv: No such process") becomes TargetLost at the loop's stage, so the
    capture already begun is ended with the death named, or discarded -- never left without END."""
    try:
        yield
    except Exception as e:
        if not is_frida_error(e):
            raise
        raise TargetLost(f"{loop.stage}: {first_line(e)}") from None


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


def _start_phases(loop: dict[str, float], source: dict[str, float] | None) -> dict[str, float]:
    """The start's steps in the order they happened, CLOCK_MONOTONIC seconds (one clock for every
    process of the machine: bench/start_bench.py subtracts its own)."""
    merged = {**loop, **{f"source.{k}": v for k, v in (source or {}).items()}}
    return {k: round(v, 4) for k, v in sorted(merged.items(), key=lambda kv: kv[1])}


def _iso_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def run_capture(tracer: Tracer | str, target: TargetSpec, options: CaptureOptions, ui: UI | None = None,
                host: AgentHost | None = None, summarize: Callable[[Iterable[Record]], Any] | None = None
                ) -> CaptureResult:
    """One capture with the default host (Frida) unless another is given; with ``summarize`` (a
    tracer's), the result's summary is folded from the records as they are written."""
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
    return CaptureLoop(host, tracer, target, options, ui, summarize=summarize).run()
