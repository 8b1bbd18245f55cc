"""The Frida agent host: device, launch, attach, script load, rpc with deadlines, message routing.

It knows nothing of tracers' data or of captures: every callback Frida makes (messages,
detach, device loss, the target's output) is put on one queue that the capture loop drains on
its own thread, so a slow disk never stalls Frida's thread and Ctrl-C lands in one place.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import shutil
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import frida

from memtrace import devices, launchers
from memtrace.agentbuild import build_agent, default_cache_dir
from memtrace.errors import AgentTimeout, MemtraceError, TargetError, TargetGone, TargetLost
from memtrace.exitwatch import ChildExitWatcher
from memtrace.hold import HeldImage, Hold
from memtrace.hold import library as hold_library
from memtrace.target import TargetSpec

Event = tuple[str, Any, Any]

REMOTE_ALIVE_INTERVAL = 1.0     # seconds between liveness queries of a remote device
ATTACH_TRIES = 3

# Frida exceptions that mean "the target or its connection is gone", during or after attach.
GONE_ERRORS = (frida.ProcessNotFoundError, frida.ProcessNotRespondingError, frida.TransportError,
               frida.InvalidOperationError)


class FridaHost:
    """One target on one Frida device, with one agent loaded into it."""

    def __init__(self, target: TargetSpec, rpc_timeout: float,
                 output: Callable[[int, bytes], None] | None = None, device: Any = None,
                 stdio: str = "pipe") -> None:
        self.target = target
        self.rpc_timeout = rpc_timeout
        # A local program's stdio: "inherit" (its stdin is memtrace's own, as when the user runs it:
        # a pipe, a file, the terminal; its stdout and stderr come through pipes of memtrace's to
        # the UI, which shows them inertly under the live panel and puts stdout on stderr for
        # --json) or "pipe" (all three through Frida; stdin a pipe nothing writes to).
        self.stdio = stdio
        # Hold a spawned local program before its first constructor (memtrace.hold); False for
        # attach delays (the user wants it running first).
        self.hold_constructors = True
        self.follow_children = False    # with the hold: later images wait for the host too
        self.hold_info: dict[str, Any] | None = None
        self._hold: Hold | HeldImage | None = None
        self.hold_children: Hold | None = None      # its children's folder lives until close()
        self.events: queue.Queue[Event] = queue.Queue()
        self._output = output
        self.device: Any = device       # given: a followed child's host shares its parent's device
        self.session: Any = None
        self.script: Any = None
        self.launched: launchers.Launched | None = None
        self.exit_watch: ChildExitWatcher | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="memtrace-rpc")

    # -- what the capture loop reads ---------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.launched.pid if self.launched is not None else None

    @property
    def spawned(self) -> bool:
        return self.launched is not None and self.launched.spawned

    @property
    def is_local(self) -> bool:
        return devices.is_local(self.device)

    # -- phases ----------------------------------------------------------------------------

    def open(self) -> dict[str, Any]:
        """Resolve ``--device``; returns its description for the capture."""
        if self.device is None:
            self.device = devices.resolve(self.target.device)
            self.device.on("output", self._on_output)
        self.device.on("lost", lambda: self.events.put(("device-lost", None, None)))
        return devices.describe(self.device)

    def launch(self) -> launchers.Launched:
        launcher = launchers.choose(self.target.launch, self.target)
        inherit = self.stdio != "pipe" and self.is_local and not self.target.app
        local_program = self.is_local and not self.target.app and isinstance(launcher, launchers.FridaLauncher)
        hold = self._new_hold() if local_program and self.hold_constructors else None
        with self._output_pipes(inherit):
            # Frida's local spawn forks from this process: the program gets the descriptors
            # memtrace holds at this moment.
            if hold is not None:
                self.launched = launcher.launch(self.device, self.target, stdio_pipe=not inherit, env=hold.env)
            else:
                self.launched = launcher.launch(self.device, self.target, stdio_pipe=not inherit)
        if self.is_local:
            # Spawned or attached to: a pidfd opened now tells how it ends (exitwatch).
            self.exit_watch = ChildExitWatcher(self.launched.pid)
        if hold is not None:
            self._hold_at_constructors(hold)
        return self.launched

    @contextlib.contextmanager
    def _output_pipes(self, on: bool) -> Any:
        """While a local program is spawned with inherited stdio: its stdout and stderr are pipes
        read here and handed to the UI, as Frida's output signal did (stdin stays the user's)."""
        if not on:
            yield
            return
        pipes = [os.pipe(), os.pipe()]
        try:
            with _fds_swapped([(pipes[0][1], 1), (pipes[1][1], 2)]):
                yield
        finally:
            for (r, w), fd in zip(pipes, (1, 2), strict=True):
                os.close(w)         # the program holds its own copies
                threading.Thread(target=_pump, args=(r, fd, self._output), daemon=True,
                                 name=f"memtrace-output-{fd}").start()

    def _new_hold(self) -> Hold | None:
        program = shutil.which(self.target.argv[0]) if self.target.argv else None
        if program is not None and os.stat(program).st_mode & (stat.S_ISUID | stat.S_ISGID):
            # The loader ignores LD_AUDIT in a set-user-ID or set-group-ID program.
            self.hold_info = {"held": False, "why": f"{program} is set-user-ID or set-group-ID"}
            return None
        lib, why = hold_library(default_cache_dir())
        if lib is None:
            self.hold_info = {"held": False, "why": why}
            return None
        return Hold(lib, children=self.follow_children)

    def _hold_at_constructors(self, hold: Hold) -> None:
        """Run the spawned program to the hold point (loaded and relocated, no constructor run
        yet) and keep it there until resume(): attaching there, the hooks are in before the
        first constructor.  Frida's own spawn would inject after all of them."""
        assert self.launched is not None
        try:
            self.device.resume(self.launched.pid)
        except GONE_ERRORS as e:
            hold.close()
            raise TargetLost(f"resume: {e}") from None
        if hold.children is not None:
            self.hold_children = hold
        if hold.reach(self.alive):
            self._hold = hold
            self.launched.suspended = False
            self.hold_info = {"held": True}
        else:
            # Not at the hold point (it exited, or ld.so ignored LD_AUDIT): it runs unheld.
            self.launched.suspended = False
            self.hold_info = {"held": False, "why": "the program never reached the hold point "
                                                    "(exited first, or its loader ignored LD_AUDIT)"}

    def resume(self) -> None:
        if self._hold is not None:
            self._hold.release()        # the hooks are in: constructors and main run under them
            self._hold = None
        if self.launched is not None and self.launched.suspended:
            try:
                if self.launched.resume is not None and self.session is None:
                    # Launched suspended by another tool (pymobiledevice3) and not attached yet:
                    # only that tool's resume releases it.
                    self.launched.resume()
                else:
                    # Attached: Frida, injecting into a suspended task that has not booted, runs it
                    # to dyld's breakpoint and holds its main thread there until Frida's own
                    # resume (frida-core darwin/frida-helper-backend.vala, the spawn instance);
                    # another tool's resume cannot release it.  DEVICE-UNVERIFIED for DVT.
                    self._resume_through_frida()
            except GONE_ERRORS as e:
                raise TargetLost(f"resume: {e}") from None
            self.launched.suspended = False

    def _resume_through_frida(self) -> None:
        assert self.launched is not None
        try:
            self.device.resume(self.launched.pid)
        except frida.InvalidArgumentError:
            # Frida holds nothing for this pid (the task had booted before the attach): it is still
            # suspended the way the launching tool left it.
            if self.launched.resume is None:
                raise
            self.launched.resume()

    def alive(self) -> bool:
        pid = self.pid
        if pid is None:
            return False
        if self.is_local:
            return _local_pid_alive(pid)
        # Remote: ask for that one pid (not the whole process list), at most once a second -- the
        # attach-delay wait polls every 100 ms.
        now = time.monotonic()
        cached = getattr(self, "_alive_checked", None)
        if cached is not None and cached[0] == pid and now - cached[1] < REMOTE_ALIVE_INTERVAL:
            return cached[2]
        alive = any(p.pid == pid for p in self.device.enumerate_processes(pids=[pid]))
        self._alive_checked = (pid, now, alive)
        return alive

    def attach(self) -> None:
        try:
            self.session = self._attach_retrying()
        except frida.ProcessNotFoundError as e:
            if self.spawned:
                raise TargetGone(_first_line(e)) from None      # its words may name the signal
            raise TargetError(f"pid {self.pid}: no such process") from None
        except frida.PermissionDeniedError as e:
            raise TargetError(f"cannot attach to pid {self.pid}: {_first_line(e)}") from None
        except (frida.NotSupportedError, frida.ExecutableNotSupportedError, frida.InvalidArgumentError,
                frida.ProtocolError) as e:
            # e.g. "loader crashed with signal 11" (a register dump follows): one line.
            raise TargetError(f"cannot attach to pid {self.pid}: {_first_line(e)}") from None
        except GONE_ERRORS as e:
            raise TargetLost(f"attach: {_first_line(e)}") from None
        self.session.on("detached", lambda reason, crash: self.events.put(("detached", reason, crash)))

    def load(self, agent: str) -> None:
        """Create and load the agent's script (a load that never returns is anti-debug evidence)."""
        try:
            self.script = self.session.create_script(build_agent(agent).source, name=f"memtrace-{agent}")
        except GONE_ERRORS as e:
            raise TargetLost(f"script creation: {e}") from None
        self.script.on("message", lambda message, data: self.events.put(("message", message, data)))
        self.call("script load", self.script.load)

    def cmodule_builtins(self) -> dict[str, Any]:
        """Frida's CModule defines and headers in this target (agentbuild.precompiled_cmodule):
        a one-line script of its own, unloaded again."""
        script = self.session.create_script("rpc.exports = { builtins() { return CModule.builtins; } };",
                                            name="memtrace-cmodule-builtins")
        self.call("script load", script.load)
        try:
            return dict(self.call("cmodule builtins", script.exports_sync.builtins))
        finally:
            with contextlib.suppress(*GONE_ERRORS):
                script.unload()

    def rpc(self, what: str, method: str, *args: Any, timeout: float | None = None) -> Any:
        """Call the agent's rpc export ``method``."""
        if self.script is None:
            raise MemtraceError(f"agent {what}: no agent is loaded")
        return self.call(what, lambda: getattr(self.script.exports_sync, method)(*args), timeout)

    def call(self, what: str, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run ``fn`` with a deadline: an agent that never answers raises AgentTimeout, not a hang."""
        seconds = timeout if timeout is not None else self.rpc_timeout
        future = self._pool.submit(fn)
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            raise AgentTimeout(what, seconds) from None
        except frida.RPCException as e:
            raise MemtraceError(f"agent {what} failed: {str(e).splitlines()[0]}") from None
        except GONE_ERRORS as e:
            raise TargetLost(f"{what}: {e}") from None

    def _attach_retrying(self) -> Any:
        """A process that has just exec'd may not take an agent yet: a few tries, 0.1 s apart."""
        for attempt in range(ATTACH_TRIES):
            try:
                return self.device.attach(self.pid)
            except (frida.NotSupportedError, frida.ProcessNotRespondingError, frida.TransportError):
                if attempt == ATTACH_TRIES - 1 or not self.alive():
                    raise
                time.sleep(0.1)
        raise AssertionError("unreachable")

    def ack(self) -> None:
        """The agent holds an exec (or a crashing thread) until the host has what it sent."""
        if self.script is not None:
            with contextlib.suppress(*GONE_ERRORS):
                self.script.post({"type": "memtrace:ack"})

    def child_host(self, pid: int, held: Path | None = None) -> FridaHost:
        """The host of a process this target made: same device, its own session and agent
        (``held``: its image waits at the hold point until this host resumes it)."""
        host = FridaHost(TargetSpec(device=self.target.device, pid=pid, launch="none"), self.rpc_timeout,
                         output=None, device=self.device)
        if held is not None:
            host._hold = HeldImage(held)
        return host

    def c_sources(self, agent: str) -> list[str]:
        return build_agent(agent).c_sources

    def process_sources(self, agent: str) -> list[str]:
        return build_agent(agent).process_sources

    def detach(self) -> None:
        if self.session is not None:
            with contextlib.suppress(AgentTimeout, TargetLost, *GONE_ERRORS):
                self.call("detach", self.session.detach, timeout=5)

    def kill(self) -> None:
        if self.pid is None:
            return
        with contextlib.suppress(frida.ProcessNotFoundError, frida.InvalidOperationError):
            self.device.kill(self.pid)

    def exit_status(self, timeout: float) -> dict[str, Any] | None:
        """The local child's exit status or signal, when the host could read it (best effort)."""
        return self.exit_watch.wait(timeout) if self.exit_watch is not None else None

    def close(self) -> None:
        if self._hold is not None:      # never leave a program waiting at the hold point
            self._hold.release()
            self._hold = None
        if self.hold_children is not None:
            self.hold_children.close_children()
            self.hold_children = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- callbacks (Frida's thread: enqueue only) --------------------------------------------

    def _on_output(self, pid: int, fd: int, data: bytes) -> None:
        if pid == self.pid and data and self._output is not None:
            self._output(fd, data)


@contextlib.contextmanager
def _fds_swapped(pairs: list[tuple[int, int]]) -> Any:
    """Each (new, fd): descriptor fd is a copy of new while this lasts (a program spawned
    meanwhile gets it), then fd is itself again."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    saved = [(os.dup(fd), fd) for _, fd in pairs]
    try:
        for new, fd in pairs:
            os.dup2(new, fd)
        yield
    finally:
        for old, fd in saved:
            os.dup2(old, fd)
            os.close(old)


def _pump(read_fd: int, fd: int, output: Callable[[int, bytes], None] | None) -> None:
    """The program's output on ``fd``, as it comes, to the UI (until every writer is gone)."""
    with contextlib.suppress(OSError):
        while True:
            data = os.read(read_fd, 65536)
            if not data:
                break
            if output is not None:
                with contextlib.suppress(Exception):     # a closed console must not stop the pump
                    output(fd, data)
    with contextlib.suppress(OSError):
        os.close(read_fd)


def _local_pid_alive(pid: int) -> bool:
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


def load_agent(device: Any, pid: int, agent: str) -> tuple[Any, Any]:
    """Attach to ``pid`` and load agent ``agent`` for a one-shot job (census, limit): (session, script).

    Tracers go through :class:`FridaHost` and the capture loop instead."""
    source = build_agent(agent).source
    try:
        session = device.attach(pid)
    except (frida.ProcessNotFoundError, frida.PermissionDeniedError, frida.ProcessNotRespondingError,
            frida.NotSupportedError, frida.TransportError) as e:
        raise TargetError(f"cannot attach to pid {pid}: {str(e).splitlines()[0] if str(e) else e}") from None
    try:
        script = session.create_script(source, name=f"memtrace-{agent}")
        script.load()
    except (*GONE_ERRORS, frida.InvalidArgumentError, frida.NotSupportedError) as e:
        raise TargetError(f"cannot load the {agent} agent into pid {pid}: {_first_line(e)}") from None
    return session, script


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
