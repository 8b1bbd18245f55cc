"""The Frida backend: a :class:`~memtrace.record_source.RecordSource` over a Frida device.

Device, launch (with the hold before constructors), attach, the agent's script, its RPC with
deadlines -- and what is Frida's alone: the C sources the agent compiles (and the core
precompiled on this host), unwind tables for modules without frame pointers, agent-side
symbolization, the leak-scan RPC.  It knows nothing of tracers' data or of captures: every
callback Frida makes (messages, detach, device loss, the target's output) is put on one queue
that the capture loop drains on its own thread (``next_event``), so a slow disk never stalls
Frida's thread and Ctrl-C lands in one place.  Blocking Frida calls (script load, RPC, detach)
run on a ``frida_tools.application.Reactor``'s worker, each with a deadline (docs/architecture.md,
"Backends (record sources)").
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import platform
import queue
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import frida

from memtrace import devices, launchers, priority
from memtrace.agentbuild import (
    build_agent,
    default_cache_dir,
    gcc_driver,
    precompiled_cmodule,
    precompiled_module,
)
from memtrace.errors import AgentTimeout, MemtraceError, TargetError, TargetGone, TargetLost
from memtrace.errors import first_line as _first_line
from memtrace.exitwatch import ChildExitWatcher, local_pid_alive, open_pidfd
from memtrace.files import write_bytes_atomic, write_text_atomic
from memtrace.hold import HeldImage, Hold
from memtrace.hold import library as hold_library
from memtrace.record_source import (
    AgentError,
    ConfigFor,
    DeviceLost,
    Ended,
    Instrumented,
    Notice,
    Records,
    RecordSource,
    SourceEvent,
)
from memtrace.target import TargetSpec

Event = tuple[str, Any, Any]

REMOTE_ALIVE_INTERVAL = 1.0     # seconds between liveness queries of a remote device
OUTPUT_DRAIN_S = 5.0            # at most this long for an ended program's last output
ATTACH_TRIES = 3

# Frida exceptions that mean "the target or its connection is gone", during or after attach.
GONE_ERRORS = (frida.ProcessNotFoundError, frida.ProcessNotRespondingError, frida.TransportError,
               frida.InvalidOperationError)


class FridaHost:
    """One target on one Frida device, with one agent loaded into it (a RecordSource)."""

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
        self._hold_lib: Path | None = None      # the hold library, as /proc/PID/maps names it (resolved)
        self._pumps: list[threading.Thread] = []      # the spawned program's stdout/stderr readers
        self.hold_children: Hold | None = None      # its children's folder lives until close()
        # Frida's callbacks, in Frida's words (doctor reads them raw); next_event types them.
        self.events: queue.Queue[Event] = queue.Queue()
        self._output = output
        self.device: Any = device       # given: a followed child's host shares its parent's device
        self.session: Any = None
        self.script: Any = None
        self.launched: launchers.Launched | None = None
        self.exit_watch: ChildExitWatcher | None = None
        self._pidfd: int | None = None      # the local program memtrace spawned, for kill()
        self.unwind: UnwindFeed | None = None
        # The worker that runs every blocking Frida call, one at a time: frida-tools' Reactor, run
        # on a daemon thread of its own (so its worker is one too) from the first call until
        # close() (its run() returns when the closed event is set).
        self._closed = threading.Event()
        # The handlers given to Frida's objects (connect()), taken off at close(): Frida's native
        # side holds them strongly, out of sight of Python's collector, so a handler that refers
        # to this host keeps it -- its Reactor's eventfd, its queues, its session -- alive for
        # good in a long-lived process (a library user, the storm's lib driver, the hosts of
        # --follow-children); the device is one shared object for the whole process.
        self._handlers: list[tuple[Any, str, Callable[..., None]]] = []
        # Made at the first call (the script's load, after the injection): frida_tools.application
        # brings argparse, colorama and ctypes, ~22 ms on a quiet machine, imported while Frida
        # injects (capture_loop._preload) instead of before the target is spawned (issue 21, item 6).
        self._reactor: Reactor | None = None
        self._reactor_lock = threading.Lock()
        # The start's steps (CLOCK_MONOTONIC by name; the capture's END timing.phases).
        self.phases: dict[str, float] = {}
        # Frida's threads favoured over a busy target's while it injects (memtrace.priority).
        self._boost: priority.InjectionBoost | None = None
        self.boosted: dict[str, int] = {}
        # What prepare() made while Frida injected: the agents built, their compiled bytecode,
        # the precompiled core by its source, the texts' files by their text.
        self._preparing: threading.Thread | None = None
        self._agents: dict[str, Any] = {}
        self._bytecode: dict[Path, bytes] = {}
        self._asm: dict[str, str | None] = {}
        self._module: dict[str, dict[str, Any] | None] = {}
        self._text_refs: dict[str, dict[str, Any] | None] = {}

    # -- what the capture loop reads ---------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.launched.pid if self.launched is not None else None

    @property
    def spawned(self) -> bool:
        return self.launched is not None and self.launched.spawned

    @property
    def program_held(self) -> bool:
        """The program waits at the hold point: loaded and relocated, not one constructor run, so
        no thread of its own exists.  (Frida's spawn alone stops it after the libraries'
        constructors, which may have started threads; a --pid target runs.)"""
        return self._hold is not None

    @property
    def is_local(self) -> bool:
        return devices.is_local(self.device)

    @property
    def versions(self) -> dict[str, str]:
        return {"frida": frida.__version__}

    def held_images(self) -> Path | None:
        """--follow-children with the hold: the folder where every later image waits."""
        return self.hold_children.children if self.hold_children is not None else None

    # -- phases ----------------------------------------------------------------------------

    def open(self) -> dict[str, Any]:
        """Resolve ``--device``; returns its description for the capture."""
        if self.device is None:
            self.device = devices.resolve(self.target.device)
            self._connect(self.device, "output", self._on_output)
        self._connect(self.device, "lost", self._on_device_lost)
        return devices.describe(self.device)

    def launch(self, *, hold_constructors: bool | None = None, follow_children: bool | None = None
               ) -> launchers.Launched:
        if hold_constructors is not None:
            self.hold_constructors = hold_constructors
        if follow_children is not None:
            self.follow_children = follow_children
        launcher = launchers.choose(self.target.launch, self.target)
        inherit = self.stdio != "pipe" and self.is_local and not self.target.app
        local_program = self.is_local and not self.target.app and isinstance(launcher, launchers.FridaLauncher)
        hold = self._new_hold() if local_program and self.hold_constructors else None
        try:
            with self._output_pipes(inherit):
                # Frida's local spawn forks from this process: the program gets the descriptors
                # memtrace holds at this moment.
                if hold is not None:
                    self.launched = launcher.launch(self.device, self.target, stdio_pipe=not inherit,
                                                    env=hold.env)
                else:
                    self.launched = launcher.launch(self.device, self.target, stdio_pipe=not inherit)
        except BaseException:
            if hold is not None:        # nothing was spawned to hold: leave no folder in /tmp
                hold.close_children()
            raise
        self.phases["spawned"] = time.monotonic()
        if self.is_local:
            # Spawned or attached to: a pidfd opened now tells how it ends (exitwatch).
            self.exit_watch = ChildExitWatcher(self.launched.pid)
            if self.launched.spawned:       # what kill() may end (a program memtrace started)
                self._pidfd = open_pidfd(self.launched.pid)
        if hold is not None:
            self._hold_at_constructors(hold)
            self.phases["held"] = time.monotonic()
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
                pump = threading.Thread(target=_pump, args=(r, fd, self._output), daemon=True,
                                        name=f"memtrace-output-{fd}")
                pump.start()
                self._pumps.append(pump)

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
        self._hold_lib = hold.lib.resolve()     # (the images it holds later too: child_source)
        if hold.children is not None:
            self.hold_children = hold
        if hold.reach(self.alive, pid=self.launched.pid):
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
            return local_pid_alive(pid)
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
        # A local target whose threads keep every CPU busy: Frida's threads get the CPU until the
        # agent's script is loaded (memtrace.priority; load() or a failure here gives the
        # program's threads their priority back).  Not for a device's targets (Darwin, USB).
        if self.is_local and self.pid is not None and self._boost is None:
            self._boost = priority.boost_injection(self.pid, held=self._hold is not None)
            self.phases["boosted"] = time.monotonic()
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
        finally:
            if self.session is None:
                self._unboost()
        self._connect(self.session, "detached", lambda reason, crash: self.events.put(("detached", reason, crash)))

    def prepare(self, agent: str) -> None:
        """Do the host's part of the agent's load and init on a thread of its own, while Frida
        injects (the main thread waits on Frida there, without the GIL): the agent's bundle, its
        compiled bytecode and, for a local x86-64 Linux target, the precompiled core and the
        texts' files init reads -- 30-45 ms at load ~10 that were spent after the attach (issue
        21: fixed cost).  load() and instrument() use what it made; what it could not make they
        make themselves, as before (and say what is wrong)."""
        if self._preparing is None:
            self._preparing = threading.Thread(target=self._prepare, args=(agent,), daemon=True,
                                               name="memtrace-prepare")
            self._preparing.start()

    def _prepare(self, agent: str) -> None:
        with contextlib.suppress(Exception):    # (made again where it is used, which says why it fails)
            built = self._agent(agent)
            if not self.is_local:
                return
            with contextlib.suppress(OSError):
                cached = agent_bytecode_path(agent, built.source)
                self._bytecode[cached] = cached.read_bytes()
            if sys.platform != "linux" or platform.machine() != "x86_64" or not built.c_sources:
                return
            builtins = self._cmodule_builtins_file()
            if builtins is None:
                return          # (made through the agent, after hello)
            asm = self._core_asm(built.c_sources, builtins)
            self._core_module(built.c_sources, builtins)
            folder = default_cache_dir() / "texts"
            for text in ("\n".join(built.c_sources), "\n".join(built.process_sources), asm):
                if text:
                    self._text_refs[text] = text_file(text, folder)

    def _prepared(self) -> None:
        if self._preparing is not None:
            self._preparing.join()

    def _agent(self, agent: str) -> Any:
        built = self._agents.get(agent)
        if built is None:
            built = self._agents[agent] = build_agent(agent)
        return built

    def load(self, agent: str) -> None:
        """Create and load the agent's script (a load that never returns is anti-debug evidence)."""
        self._prepared()
        try:
            source = self._agent(agent).source
            self.phases["agent built"] = time.monotonic()
            self.script = self._script_from_bytecode(agent, source) if self.is_local else None
            if self.script is None:
                self.script = self.session.create_script(source, name=f"memtrace-{agent}")
        except GONE_ERRORS as e:
            raise TargetLost(f"script creation: {e}") from None
        self.phases["script created"] = time.monotonic()
        self._connect(self.script, "message", lambda message, data: self.events.put(("message", message, data)))
        try:
            self.call("script load", self.script.load)
            self._unboost(self._frida_threads())
        finally:
            self._unboost()
        self.phases["script loaded"] = time.monotonic()

    def _frida_threads(self) -> set[int] | None:
        """Which of the threads born while injecting are Frida's (the agent asks Frida's cloak)."""
        if self._boost is None or self._boost.restored:
            return None
        try:
            return set(self.rpc("frida threads", "frida_threads_among", sorted(self._boost.raised), timeout=10))
        except (AgentTimeout, MemtraceError, *GONE_ERRORS):
            return None

    def _unboost(self, frida_threads: set[int] | None = None) -> None:
        """The program's threads' priorities back as they were (idempotent); Frida's stay raised."""
        if self._boost is not None:
            self.boosted = self._boost.restore(frida_threads) or self.boosted

    def _script_from_bytecode(self, agent: str, source: str) -> Any:
        """The agent's script made from its compiled bytecode, kept in the cache folder by Frida's
        version and the bundle's hash (compiled in the target the first time): the agent's 230 KB
        of JavaScript are not parsed again every run -- 31-53 ms against 110-350 ms from source,
        at load ~150 (issue 21: fixed cost).  None when that fails: the caller creates it from
        the source, which says what is wrong if anything is.  Local targets only (a device's
        Frida may be another version: DEVICE-UNVERIFIED, not tried)."""
        cached = agent_bytecode_path(agent, source)
        name = f"memtrace-{agent}"
        try:
            code = self._bytecode.pop(cached, None)
            return self.session.create_script_from_bytes(code if code is not None else cached.read_bytes(), name=name)
        except OSError:
            pass                    # not compiled yet
        except (frida.InvalidArgumentError, frida.NotSupportedError):
            pass                    # damaged, or another Frida's: compiled again
        try:
            code = self.session.compile_script(source, name=name)
        except (frida.InvalidArgumentError, frida.NotSupportedError):
            return None             # not JavaScript this Frida compiles: create_script says why
        with contextlib.suppress(OSError):
            write_bytes_atomic(cached, code)
            for old in sorted(cached.parent.glob(f"{agent}-*.qjs"), key=lambda p: p.stat().st_mtime)[:-4]:
                if old != cached:
                    old.unlink()
        try:
            return self.session.create_script_from_bytes(code, name=name)
        except (frida.InvalidArgumentError, frida.NotSupportedError):
            return None

    def instrument(self, agent: str, config_for: ConfigFor) -> Instrumented:
        """Load the agent and initialize it: ``hello`` (the platform), then ``init`` with the
        configuration for that platform, the C sources (the core precompiled here when it can
        be) and, for a local target, unwind tables for its modules without frame pointers."""
        self.load(agent)
        hello = self.rpc("hello", "hello")
        self.phases["hello"] = time.monotonic()
        platform = hello.get("platform") if isinstance(hello, dict) else None
        config, sources = config_for(platform), self.c_sources(agent)
        # The unwind walk's frame cache (cmodule/unwind.c) off: every stack walked in full (tests compare).
        config["frameCache"] = os.environ.get("MEMTRACE_FRAME_CACHE", "on") != "off"
        # The agent writes the environment its compiler gets only at the hold point (process.js withCompilerEnv).
        config["programHeld"] = self.program_held
        # Tests and storms only: patches made under the Darwin stop-the-world (Mach thread suspension,
        # cmodule/world.c MT_DARWIN) over the Darwin stand-in library at this path (demo/darwin/mtmach.c).
        mach = os.environ.get("MEMTRACE_WORLD_MACH")
        if mach and self.is_local:
            config["worldMach"] = mach
        if self.program_held and self._hold_lib is not None:
            # Its main thread waits in this library: world.c does not search that stack for
            # Frida's code while it is there (ld.so's frames may hold anything).
            config["holdLibrary"] = str(self._hold_lib)
        asm, module = self._precompiled_cmodule(hello, config, sources)
        if module is not None:
            config["cmoduleModule"] = module
        if asm is not None:
            config["cmoduleAsm"] = asm
            # The stand-in is found only through the target's PATH (GLib's spawn searches
            # getenv("PATH"): gumcmodule.c gum_call_tool), which only setenv can change, and glibc's
            # setenv races the program's own getenv/setenv: so only while no thread of its runs.
            shim = gcc_cache_shim(default_cache_dir(), frida.__version__) if self.program_held else None
            if shim is not None:
                config["cmoduleGccDir"] = str(shim)
        self.phases["cmodule ready"] = time.monotonic()
        init = self._init(config, sources, self.process_sources(agent))
        self.phases["init"] = time.monotonic()
        notices: list[Notice] = []
        # Local targets (followed children too): unwind tables for modules without frame pointers.
        if self.is_local and os.environ.get("MEMTRACE_UNWIND", "on") != "off":
            # symbolic (the unwind tables' reader): imported here, while the target waits for
            # its hooks anyway -- the capture loop preloads it during the attach -- not before
            # the target is spawned (issue 21: fixed cost).
            from memtrace.symbols.cfi import TableCache, UnwindFeed

            self.unwind = UnwindFeed(TableCache(default_cache_dir()))
            notices += self._feed_unwind(during_window=False)
            self.phases["unwind fed"] = time.monotonic()
        return Instrumented(hello=hello, init=init, platform=platform, notices=notices,
                            unwind=self.unwind.info() if self.unwind else None)

    def _init(self, config: dict[str, Any], sources: list[str], process_sources: list[str]) -> Any:
        """The agent's ``init``.  A local target (spawned or attached: it sees this host's files)
        reads the large texts -- the C sources, the precompiled core, ~700 KB -- from files of the
        cache folder instead of the rpc carrying them (30-80 ms of JSON each way at load 14-40;
        issue 21: fixed cost); an agent that cannot read one (another user's program, another
        mount namespace) asks for them inline."""
        init: Any = None
        how = "inline"
        by_file = _texts_by_file(config, sources, process_sources, self._text_refs) if self.is_local else None
        if by_file is not None:
            init = self.rpc("init", "init", *by_file)
            how = "by file"
            if isinstance(init, dict) and init.get("needTexts"):
                init, how = None, "inline (a file unreadable in the target)"
        if init is None:
            init = self.rpc("init", "init", config, sources, process_sources)
        if isinstance(init, dict) and isinstance(init.get("info"), dict):
            init["info"]["texts"] = how         # the RECON record says how the sources came
        return init

    def _feed_unwind(self, during_window: bool) -> list[Notice]:
        """Unwind tables for the target's modules without frame pointers (symbols/cfi.py); the
        host reads the modules' files.  Failing leaves frame-pointer stacks, and says so."""
        if self.unwind is None:
            return []
        try:
            self.unwind.feed(lambda method, *args: self.rpc("unwind tables", method, *args))
        except (AgentTimeout, TargetLost):
            if not during_window:
                raise
        except MemtraceError as err:
            self.unwind = None
            return [Notice({"message": f"no unwind tables: {err}"}, f"stacks follow frame pointers only: {err}")]
        return []

    def _precompiled_cmodule(self, hello: Any, config: dict[str, Any], sources: list[str]
                             ) -> tuple[str | None, dict[str, Any] | None]:
        """The core CModule compiled on this host once, for a local x86-64 Linux target whose agent
        compiles with gcc: as assembly (agentbuild.precompiled_cmodule) and as the module itself
        (agentbuild.precompiled_module, named by a file of the cache folder: see _core_module);
        (None, None) elsewhere."""
        if not (sources and self.is_local and isinstance(hello, dict) and hello.get("platform") == "linux"
                and hello.get("arch") == "x64" and config.get("toolchain") in ("auto", "external")):
            return None, None
        builtins = self._cmodule_builtins_file()
        if builtins is None:
            builtins = self.cmodule_builtins()
            with contextlib.suppress(OSError):
                builtins_file = _builtins_file()
                builtins_file.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(builtins_file, json.dumps(builtins))
        return self._core_asm(sources, builtins), self._core_module(sources, builtins)

    def _cmodule_builtins_file(self) -> dict[str, Any] | None:
        """Frida's CModule builtins (defines, headers) as kept in the cache folder; None: not yet."""
        try:
            builtins = json.loads(_builtins_file().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return builtins if isinstance(builtins, dict) else None

    def _core_asm(self, sources: list[str], builtins: dict[str, Any]) -> str | None:
        source = _core_source(sources)
        if source not in self._asm:
            self._asm[source] = precompiled_cmodule(source, dict(builtins.get("defines") or {}), frida.__version__,
                                                    lambda: dict(builtins.get("headers") or {}))
        return self._asm[source]

    def _core_module(self, sources: list[str], builtins: dict[str, Any]) -> dict[str, Any] | None:
        """The core's module file, with its length and SHA-256: the agent loads it only when it
        reads exactly those bytes (a process in another mount namespace may see another file, or
        none, at that path: it then takes the assembly)."""
        source = _core_source(sources)
        if source not in self._module:
            ref = None
            path = precompiled_module(source, dict(builtins.get("defines") or {}), frida.__version__,
                                      lambda: dict(builtins.get("headers") or {}))
            if path is not None:
                with contextlib.suppress(OSError):
                    data = path.read_bytes()
                    ref = {"file": str(path), "length": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            self._module[source] = ref
        return self._module[source]

    def calibrate(self, timeout: float | None = None) -> dict[str, Any]:
        return dict(self.rpc("calibrate", "calibrate", timeout=timeout) or {})

    start_calibrates = True

    def start(self, calibrate: bool = False) -> dict[str, Any]:
        """The hooks in; with ``calibrate`` the "before" calibration first, in the same rpc (one
        round trip fewer before the target runs; issue 21: fixed cost)."""
        return dict(self.rpc("start", "start", {"calibrate": calibrate}) or {})

    def release_fork(self, entry: str, pid: int) -> None:
        """A fork child waits in its atfork handler until its own agent is in."""
        self.rpc("release", "releaseFork", entry, pid)

    def stop(self, timeout: float) -> dict[str, Any] | None:
        """The hooks out; the agent's account of how (runtime/world.js worldReport: every stop, the
        waits for threads inside our code), or None."""
        result = self.rpc("stop", "stop", timeout=timeout)
        world = result.get("world") if isinstance(result, dict) else None
        return world if isinstance(world, dict) else None

    def scan_leaks(self, config: dict[str, Any], timeout: float) -> None:
        """malloc --leaks: the agent scans the target's memory (cmodule/leaks.c) and sends the
        result as a ``result`` message (progress as ``leaks:progress``)."""
        # Run even when the wait ends before the reactor got to it (a 1 ms budget on a loaded host:
        # CI, once): a late scan is said, and its result kept if it comes before the hooks are out.
        self.rpc("leak scan", "leaks", config, timeout=timeout, run_late=True)

    def symbolize(self, addresses: list[int]) -> list[list[Any]] | None:
        """Rows from the agent's own symbolizer (DebugSymbol in the target); None if it fails."""
        try:
            return list(self.rpc("symbolize", "symbolize", [hex(x) for x in addresses], timeout=30))
        except MemtraceError:
            return None

    def modules_seen(self, loaded: bool, feed_unwind: bool) -> list[Notice]:
        """The agent announced modules: unwind tables for the new ones; a module just loaded
        (``loaded``) has its loading thread waiting until the host has it."""
        notices = self._feed_unwind(during_window=True) if feed_unwind else []
        if loaded:
            self.ack()
        return notices

    def next_event(self, timeout: float) -> SourceEvent | None:
        try:
            kind, a, b = self.events.get(timeout=timeout) if timeout > 0 else self.events.get_nowait()
        except queue.Empty:
            return None
        if kind == "detached":
            return Ended(a, b)
        if kind == "device-lost":
            return DeviceLost()
        if a.get("type") == "error":
            return AgentError(a.get("description"), a.get("stack"))
        return Records(a.get("payload") or {}, b or b"")

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

    def rpc(self, what: str, method: str, *args: Any, timeout: float | None = None, run_late: bool = False) -> Any:
        """Call the agent's rpc export ``method``."""
        if self.script is None:
            raise MemtraceError(f"agent {what}: no agent is loaded")
        return self.call(what, lambda: getattr(self.script.exports_sync, method)(*args), timeout, run_late)

    def call(self, what: str, fn: Callable[[], Any], timeout: float | None = None, run_late: bool = False) -> Any:
        """Run ``fn`` with a deadline: an agent that never answers raises AgentTimeout, not a hang.
        A call still queued on the reactor at the deadline is never made, unless ``run_late``."""
        seconds = timeout if timeout is not None else self.rpc_timeout
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def work() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:  # noqa: BLE001 -- handed to the waiting thread
                    future.set_exception(e)

        with self._reactor_lock:
            if self._closed.is_set():
                raise MemtraceError(f"agent {what}: the host is closed")
            if self._reactor is None:
                try:
                    from frida_tools.application import Reactor
                except ImportError as e:
                    raise MemtraceError(f"frida-tools cannot be imported ({e}): every Frida call runs on its "
                                        "Reactor; see memtrace doctor") from None
                self._reactor = Reactor(lambda reactor: self._closed.wait())
                threading.Thread(target=self._reactor.run, daemon=True, name="memtrace-frida-reactor").start()
            reactor = self._reactor
        reactor.schedule(work)
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            if not run_late:
                future.cancel()     # still queued behind a stuck call: never run it
            raise AgentTimeout(what, seconds) from None
        except frida.RPCException as e:
            raise MemtraceError(f"agent {what} failed: {str(e).splitlines()[0]}") from None
        except GONE_ERRORS as e:
            raise TargetLost(f"{what}: {e}") from None

    def _attach_retrying(self) -> Any:
        """A process that has just exec'd may not take an agent yet: a few tries, 0.1 s apart."""
        for attempt in range(ATTACH_TRIES):
            try:
                return self._attach_once()
            except (frida.NotSupportedError, frida.ProcessNotRespondingError, frida.TransportError):
                if attempt == ATTACH_TRIES - 1 or not self.alive():
                    raise
                time.sleep(0.1)
        raise AssertionError("unreachable")

    def _attach_once(self) -> Any:
        """One ``device.attach`` with a deadline (the rpc timeout): Frida's own attach has none, and
        an injection that never completes -- seen in the purgeable storm: the loader thread Frida
        starts in the target sitting for minutes at one pc inside the C library's malloc, called
        from pthread_getattr_np in Frida's bootstrapper -- left memtrace waiting for ever.  Past the
        deadline the attach is cancelled (frida.Cancellable) and said, never waited for."""
        cancellable = frida.Cancellable()
        timer = threading.Timer(self.rpc_timeout, cancellable.cancel)
        timer.daemon = True
        timer.start()
        try:
            with cancellable:
                return self.device.attach(self.pid)
        except frida.OperationCancelledError:
            raise TargetError(f"cannot attach to pid {self.pid}: Frida's injection did not complete within "
                              f"{self.rpc_timeout:g} s (cancelled)") from None
        finally:
            timer.cancel()

    def ack(self) -> None:
        """The agent holds an exec (or a crashing thread) until the host has what it sent."""
        if self.script is not None:
            with contextlib.suppress(*GONE_ERRORS):
                self.script.post({"type": "memtrace:ack"})

    def child_source(self, pid: int, held: Path | None = None) -> FridaHost:
        """The host of a process this target made: same device, its own session and agent
        (``held``: its image waits at the hold point until this host resumes it)."""
        host = FridaHost(TargetSpec(device=self.target.device, pid=pid, launch="none"), self.rpc_timeout,
                         output=None, device=self.device)
        if held is not None:
            host._hold = HeldImage(held)
            host._hold_lib = self._hold_lib         # the same library holds the images it starts
        return host

    def c_sources(self, agent: str) -> list[str]:
        return list(self._agent(agent).c_sources)

    def process_sources(self, agent: str) -> list[str]:
        return list(self._agent(agent).process_sources)

    def detach(self) -> None:
        self._unboost()
        if self.session is not None:
            with contextlib.suppress(AgentTimeout, TargetLost, *GONE_ERRORS):
                self.call("detach", self.session.detach, timeout=5)

    def kill(self) -> None:
        if self.pid is None:
            return
        if self.is_local and self._closed.is_set():
            return      # its pidfd is closed: by pid, a closed host could only reach a stranger
        if self._pidfd is not None:
            # Through the pidfd opened at launch: it names that process for good, where its pid --
            # once the process is gone and reaped (Frida reaps what it spawns) -- may be another
            # program's by the time memtrace gets here (32,768 pids on a default Linux).
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            return
        with contextlib.suppress(frida.ProcessNotFoundError, frida.InvalidOperationError):
            self.device.kill(self.pid)

    def exit_status(self, timeout: float) -> dict[str, Any] | None:
        """The local child's exit status or signal, when the host could read it (best effort)."""
        return self.exit_watch.wait(timeout) if self.exit_watch is not None else None

    def close(self) -> None:
        self._unboost()
        if self.exit_watch is not None:     # a target left running is no longer ours to watch
            self.exit_watch.stop()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        for obj, signal_name, handler in self._handlers:
            with contextlib.suppress(Exception):     # an object Frida has already let go of
                obj.off(signal_name, handler)
        self._handlers.clear()
        if self._boost is not None:
            self._boost.end()       # memtrace's own threads back to their nice value
        if self._hold is not None:      # never leave a program waiting at the hold point
            self._hold.release()
            self._hold = None
        self._drain_output()
        if self.hold_children is not None:
            self.hold_children.close_children()
            self.hold_children = None
        # The reactor stops once the call it runs, if any, returns.  A call still blocked there (an
        # agent that never answered; a detach past its deadline) is not cancelled (cancel_io): a
        # detach that completes late still takes the hooks out of a target left running.
        with self._reactor_lock:
            self._closed.set()

    def _drain_output(self) -> None:
        """A program that has ended: what it wrote last is passed on before memtrace exits (the
        pumps are daemon threads; a loaded machine could leave its last lines unread).  Bounded:
        a child it left running may hold the pipes open."""
        if not self._pumps or (self.pid is not None and self.alive()):
            return
        end = time.monotonic() + OUTPUT_DRAIN_S
        for pump in self._pumps:
            pump.join(max(0.0, end - time.monotonic()))
        self._pumps = [p for p in self._pumps if p.is_alive()]

    # -- callbacks (Frida's thread: enqueue only) --------------------------------------------

    def _connect(self, obj: Any, signal_name: str, handler: Callable[..., None]) -> None:
        obj.on(signal_name, handler)
        self._handlers.append((obj, signal_name, handler))

    def _on_device_lost(self) -> None:
        self.events.put(("device-lost", None, None))

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


def _core_source(sources: list[str]) -> str:
    """The core's source exactly as runtime/core.js's buildCore puts it together for a local x86-64
    Linux target (what the host's assembly and module are built from)."""
    return "#define MT_LINUX 1\n" + "\n".join(sources)


def agent_bytecode_path(agent: str, source: str) -> Path:
    """Where the compiled bytecode of an agent's bundle is kept (FridaHost._script_from_bytecode)."""
    key = hashlib.sha256(f"{frida.__version__}\0{source}".encode()).hexdigest()[:24]
    return default_cache_dir() / f"{agent}-{key}.qjs"


def load_agent(device: Any, pid: int, agent: str) -> tuple[Any, Any]:
    """Attach to ``pid`` and load agent ``agent`` for a one-shot job (census, limit): (session, script).

    Tracers go through :class:`FridaHost` and the capture loop instead.

    Without Frida's exit monitor: these agents have nothing to save when the process exits, and
    the monitor hangs a process that calls exit() while the agent is being torn down after our
    detach (docs/domain/sessions.md, "A target that exits as we detach").

    A local target gets the tracers' guard against a starved injection (memtrace.priority): Frida's
    injector gives its loader 5 s to sync up, then unmaps it under the loader thread -- on a loaded
    machine an attach failed ("unexpectedly timed out trying to sync up with agent", a CI run of
    the device checks) and can kill the target.  As in a tracer's session, Frida's own threads
    (the agent says which: ``fridaThreadsAmong``) keep their raised priority until they are gone:
    given back their value at birth, the agent's teardown at the detach competed with 64 spinning
    threads and the target once died of SIGSEGV right after it (a CI run of the one-shot test)."""
    source = build_agent(agent).source
    boost = None
    loaded = None
    if getattr(device, "type", None) == "local":
        with contextlib.suppress(OSError):      # (the pid gone: the attach says so)
            boost = priority.boost_injection(pid)
    try:
        try:
            try:
                session = device.attach(pid, exit_monitor=False)
            except (TypeError, AttributeError):       # frida < 17.10 has no such option
                session = device.attach(pid)
        except (frida.ProcessNotFoundError, frida.PermissionDeniedError, frida.ProcessNotRespondingError,
                frida.NotSupportedError, frida.TransportError) as e:
            raise TargetError(f"cannot attach to pid {pid}: {str(e).splitlines()[0] if str(e) else e}") from None
        try:
            script = session.create_script(source, name=f"memtrace-{agent}")
            script.load()
            loaded = script
        except (*GONE_ERRORS, frida.InvalidArgumentError, frida.NotSupportedError) as e:
            raise TargetError(f"cannot load the {agent} agent into pid {pid}: {_first_line(e)}") from None
    finally:
        if boost is not None:
            # Frida's threads stay raised; every other thread born while it injected gets its value
            # at birth back (an agent that cannot say: all of them -- restore(None) would leave a
            # thread the program made meanwhile at -20 for good).  Then memtrace's own, whatever
            # the question did (an interrupt included).
            frida_threads: set[int] = set()
            try:
                frida_threads = _frida_threads_among(loaded, sorted(boost.raised))
            finally:
                boost.restore(frida_threads)
                boost.end()
    return session, script


FRIDA_THREADS_TIMEOUT = 10.0     # s: a stopped or frozen target never answers


def _frida_threads_among(script: Any, tids: list[int]) -> set[int]:
    """Which of ``tids`` are Frida's own threads, as a one-shot agent says; none when it cannot, or
    not within FRIDA_THREADS_TIMEOUT (Frida's blocking call has no deadline of its own: it is made
    on a daemon thread, left behind if the target never answers)."""
    if script is None or not tids:
        return set()
    answer: list[set[int]] = []

    def ask() -> None:
        with contextlib.suppress(frida.core.RPCException, *GONE_ERRORS, frida.InvalidOperationError,
                                 TypeError, ValueError):
            answer.append({int(t) for t in script.exports_sync.frida_threads_among(tids)})

    asker = threading.Thread(target=ask, name="memtrace-frida-threads", daemon=True)
    asker.start()
    asker.join(FRIDA_THREADS_TIMEOUT)
    return answer[0] if answer else set()


TEXTS_KEPT = 16      # the texts folder's newest files kept (a few versions' sources and cores)


def text_file(text: str, folder: Path) -> dict[str, Any] | None:
    """``text`` as a file of ``folder`` named by its hash (written once), as the agent's init reads
    it: ``{"file", "length"}`` (its length in UTF-16 units, JavaScript's); None if it cannot be
    written."""

    data = text.encode("utf-8")
    path = folder / f"{hashlib.sha256(data).hexdigest()[:32]}.txt"
    if not path.is_file():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(path, data)
        except OSError:
            return None
        with contextlib.suppress(OSError):
            for old in sorted(folder.glob("*.txt"), key=lambda p: p.stat().st_mtime)[:-TEXTS_KEPT]:
                if old != path:
                    old.unlink()
    return {"file": str(path), "length": len(text.encode("utf-16-le")) // 2}


def _builtins_file() -> Path:
    return default_cache_dir() / f"cmodule-builtins-{frida.__version__}-x64.json"


def _texts_by_file(config: dict[str, Any], sources: list[str], process_sources: list[str],
                   made: dict[str, dict[str, Any] | None] | None = None
                   ) -> tuple[dict[str, Any], list[Any], list[Any]] | None:
    """The init rpc's arguments with each list of sources (joined: the agent joins them so) and
    the precompiled core as files of the cache folder; None if one cannot be written.  ``made``:
    text_file's answers already had (FridaHost.prepare), by text."""
    folder = default_cache_dir() / "texts"

    def file_of(text: str) -> dict[str, Any] | None:
        ref = made.get(text) if made else None
        return ref if ref is not None else text_file(text, folder)

    out: list[list[Any]] = []
    for texts in (sources, process_sources):
        ref = file_of("\n".join(texts)) if texts else None
        if texts and ref is None:
            return None
        out.append([ref] if ref is not None else [])
    config = dict(config)
    if isinstance(config.get("cmoduleAsm"), str):
        ref = file_of(config["cmoduleAsm"])
        if ref is None:
            return None
        config["cmoduleAsm"] = ref
    return config, out[0], out[1]


# Frida's external CModule toolchain runs "gcc <flags> module.c -o module.so" in a new folder, with
# the module's headers beside it, from inside the target: ~0.1-0.25 s of every run's start, even
# for the assembly the host precompiled (agentbuild.precompiled_cmodule).  The module the host
# builds itself (agentbuild.precompiled_module, loaded from its bytes) needs none of it; when the
# agent cannot take that one, this stand-in for gcc, first on the target's PATH while the core compiles
# (runtime/process.js withCompilerEnv; only in a program at the hold point, FridaHost.program_held:
# a running one compiles with its own PATH's gcc), keeps each module.so by a hash of gcc's
# arguments and the source, and hands a copy back the next time; anything else, or a miss, runs
# the real gcc.  Its folder is named after Frida's version (the headers it writes) and the real gcc
# (path, size, mtime), is the user's alone (0700), and an entry is only ever written whole (a rename).
_GCC_SHIM = """#!/bin/sh
# memtrace: Frida's CModule builds kept by source (memtrace/frida_host.py gcc_cache_shim).
real={real}
dir={dir}
out= prev= src=
for a in "$@"; do
  [ "$prev" = -o ] && out=$a
  case $a in *.c) src=$a ;; esac
  prev=$a
done
case $out in *.so) ;; *) exec "$real" "$@" ;; esac
[ -n "$src" ] && [ -r "$src" ] || exec "$real" "$@"
key=$({{ printf '%s\\n' "$@"; cat "$src"; }} 2>/dev/null | sha256sum 2>/dev/null | cut -c1-40)
case $key in ????????????????????????????????????????) ;; *) exec "$real" "$@" ;; esac
if [ -f "$dir/$key.so" ] && cp "$dir/$key.so" "$out" 2>/dev/null; then
  exit 0
fi
"$real" "$@" || exit $?
tmp="$dir/.$key.$$"
cp "$out" "$tmp" 2>/dev/null && mv -f "$tmp" "$dir/$key.so" 2>/dev/null
rm -f "$tmp" 2>/dev/null
exit 0
"""
GCC_SHIM_VERSION = 1


def gcc_cache_shim(cache_dir: Path, frida_version: str) -> Path | None:
    """The folder holding the gcc stand-in (and the modules it keeps), made on first use; None
    when there is no gcc here or the folder cannot be made (the target then runs gcc itself)."""
    driver = gcc_driver()
    if driver is None:
        return None
    real, st = driver
    import shlex

    ident = repr((GCC_SHIM_VERSION, frida_version, real, st.st_size, st.st_mtime_ns)).encode()
    folder = cache_dir / f"cmodule-gcc-{hashlib.sha256(ident).hexdigest()[:16]}"
    shim = folder / "gcc"
    if shim.is_file():
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        tmp = folder / f".gcc.{os.getpid()}"
        tmp.write_text(_GCC_SHIM.format(real=shlex.quote(real), dir=shlex.quote(str(folder))), encoding="utf-8")
        os.chmod(tmp, 0o700)
        os.replace(tmp, shim)
    except OSError:
        return None
    return folder


if TYPE_CHECKING:
    from frida_tools.application import Reactor

    from memtrace.symbols.cfi import UnwindFeed

    _IS_A_SOURCE: type[RecordSource] = FridaHost     # mypy checks FridaHost against the protocol
