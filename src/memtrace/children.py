"""The processes a target makes: fork children, vfork/posix_spawn execs, and its own exec.

The agent reports each one (``process:child``, ``process:exec``; agents/runtime/process.js).
Without ``--follow-children`` the capture says so: a WARNING record, the END evidence and a line
on screen.  With it, each process gets a capture of its own with the same tracer, in the same
folder (``child-<pid>.mtc``, ``exec-<pid>.mtc``), whose META names the parent's target label and
the parent capture, so ``memtrace report`` groups them with the target.  A fork child waits in
its atfork handler (at most ``CHILD_WAIT_S``) until its own agent has started, so it is traced
from its first line; an exec'd image is attached to just after the exec (its first moments go
untraced: ``timing.launch_to_attach_s`` in its END says how long).

Every followed capture ends with the parent's window; the parent's capture ends only after its
followed children's have (``Family.join``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtrace.errors import MemtraceError

if TYPE_CHECKING:
    from memtrace.capture_loop import CaptureLoop

CHILD_WAIT_S = 10.0          # a fork child waits this long at most for its agent (--follow-children)
EXEC_SETTLE_S = 2.0          # a vfork/posix_spawn child is attached to once it has exec'd (local)


@dataclass
class Child:
    pid: int
    ppid: int | None
    origin: str                  # fork | spawn (vfork or posix_spawn, then exec) | exec (the target itself)
    path: str | None = None
    capture: str | None = None   # the followed capture's file name
    ended: str | None = None
    reason: str | None = None
    seen: float = field(default_factory=time.monotonic)     # when the host learned of it

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None and k != "seen"}


@dataclass
class Family:
    """What every capture of one run shares: the folder, the window's end, who is followed."""

    folder: Path
    label: str
    deadline: float                          # monotonic end of the window, for every capture
    follow: bool
    lock: threading.Lock = field(default_factory=threading.Lock)
    names: set[str] = field(default_factory=set)
    threads: list[threading.Thread] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)   # Ctrl-C: every capture ends now

    def claim_name(self, origin: str, pid: int) -> str:
        base = f"{'exec' if origin == 'exec' else 'child'}-{pid}"
        with self.lock:
            name, n = f"{base}.mtc", 1
            while name in self.names or (self.folder / name).exists():
                n += 1
                name = f"{base}-{n}.mtc"
            self.names.add(name)
            return name

    def follow_process(self, parent: CaptureLoop, child: Child, entry: str | None) -> None:
        """A capture of ``child`` with the parent's tracer, on a thread of its own."""
        child.capture = self.claim_name(child.origin, child.pid)
        t = threading.Thread(target=self._run, args=(parent, child, entry), daemon=True,
                             name=f"memtrace-child-{child.pid}")
        with self.lock:
            self.threads.append(t)
        t.start()

    def _run(self, parent: CaptureLoop, child: Child, entry: str | None) -> None:
        try:
            if child.origin == "spawn":
                _settle_exec(child.pid, parent.host.pid)
            loop = parent.child_loop(child, entry)
            result = loop.run()
            child.ended, child.reason = result.ended, result.reason
        except MemtraceError as e:
            child.ended, child.reason = "not-followed", f"could not follow: {e}"
            parent.ui.warning(f"child pid {child.pid}: could not follow: {e}")
        except Exception as e:  # noqa: BLE001 -- a child's failure must never end the parent's capture
            child.ended, child.reason = "not-followed", f"could not follow: {type(e).__name__}: {e}"
            parent.ui.warning(f"child pid {child.pid}: could not follow: {e}")

    def join(self) -> None:
        """Wait for every followed capture (each ends by the deadline, plus its own teardown)."""
        while True:
            with self.lock:
                alive = [t for t in self.threads if t.is_alive()]
            if not alive:
                return
            for t in alive:
                t.join(timeout=max(0.1, self.deadline - time.monotonic() + 30.0))


class ChildUI:
    """A followed capture's view: its warnings go to the run's screen, named by pid; its phases
    and progress stay quiet; its output is already the parent's (one pipe)."""

    wants_families = False

    def __init__(self, parent: Any, pid: int) -> None:
        self.parent = parent
        self.pid = pid
        self.phases: list[str] = []
        self.warnings: list[str] = []

    def phase(self, name: str) -> None:
        self.phases.append(name)

    def progress(self, p: Any) -> None:
        pass

    def warning(self, message: str) -> None:
        self.warnings.append(message)
        self.parent.warning(f"child pid {self.pid}: {message}")

    def output(self, fd: int, data: bytes) -> None:
        pass


def _settle_exec(pid: int, parent_pid: int | None) -> None:
    """A vfork/posix_spawn child is posted just before its exec: attach once the new image is in
    (on this machine /proc says so; elsewhere a short pause)."""
    if not Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
        return
    try:
        parent_exe = os.readlink(f"/proc/{parent_pid}/exe") if parent_pid else None
    except OSError:
        parent_exe = None
    end = time.monotonic() + EXEC_SETTLE_S
    while time.monotonic() < end:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/exe") != parent_exe:
                return
        time.sleep(0.01)
