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

A capture loop is given a :class:`ChildFollower`: what its target makes goes to it, and it starts
each followed capture through the function the loop handed it (``capture``) -- it never sees the
loop itself, and this module imports nothing of it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from memtrace.capture import CaptureWriteError, RecordType
from memtrace.errors import MemtraceError

CHILD_WAIT_S = 10.0          # a fork child waits this long at most for its agent (--follow-children)
HELD_CLAIM_S = 1.0           # a spawn or exec the agent reports: its held image is looked for this long
HELD_WAIT_S = 30.0           # ... or this long, when the process is one the hold will post
EXEC_SETTLE_S = 2.0          # a vfork/posix_spawn child is attached to once it has exec'd (local)
JOIN_GRACE_S = 60.0          # a followed capture's teardown after the window, at most
MAX_CHILD_LINES = 3          # child processes named on screen (every one is in the capture)
# Children listed in the END record (each has its WARNING record anyway): the END is written into
# disk space set aside at the start (capture.END_RESERVE), so its size must stay bounded.
END_CHILDREN = 64


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
    attached: bool = False       # its capture is attached: its file stays (set by its capture loop)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None and k not in ("seen", "attached")}


class Outcome(Protocol):
    """How a followed capture ended (a capture_loop.CaptureResult)."""

    @property
    def ended(self) -> str: ...
    @property
    def reason(self) -> str: ...


# (the child, its fork entry to release it from or None, its held image or None) -> its capture, run
CaptureChild = Callable[[Child, "str | None", "Path | None"], Outcome]
Warn = Callable[[str], None]


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
    # --follow-children with the hold (memtrace.hold): every image a process of the run execs
    # waits before its constructors as held_dir/<pid>; watch_held follows each one from there.
    held_dir: Path | None = None
    claims: dict[int, tuple[float, Child]] = field(default_factory=dict)   # pid -> (when, its latest image)
    image_pids: set[int] = field(default_factory=set)
    matched: set[int] = field(default_factory=set)       # id() of claims an agent's report was matched to

    def claim_name(self, origin: str, pid: int) -> str:
        base = f"{'exec' if origin == 'exec' else 'child'}-{pid}"
        with self.lock:
            name, n = f"{base}.mtc", 1
            while name in self.names or (self.folder / name).exists():
                n += 1
                name = f"{base}-{n}.mtc"
            self.names.add(name)
            return name

    def follow_process(self, capture: CaptureChild, warn: Warn, parent_pid: int | None, child: Child,
                       entry: str | None, held: Path | None = None) -> str:
        """A capture of ``child`` (``capture``: with the parent's tracer), on a thread of its own.
        Returns the file name claimed for it: the thread may already have given it up (a failed
        attach clears ``child.capture``) by the time the caller reads ``child``."""
        with self.lock:
            self.image_pids.add(child.pid)      # its next held image is an exec
        name = child.capture = self.claim_name(child.origin, child.pid)
        t = threading.Thread(target=self._run, args=(capture, warn, parent_pid, child, entry, held), daemon=True,
                             name=f"memtrace-child-{child.pid}")
        with self.lock:
            self.threads.append(t)
        t.start()
        return name

    # -- images held before their constructors ------------------------------------------------

    def watch_held(self, capture: CaptureChild, warn: Warn, root_pid: int | None, folder: Path) -> None:
        """Follow every image that posts itself in ``folder`` (the hold library's child mode):
        attached while it waits, released once its hooks are in -- a child living 1 ms is traced
        from before its first constructor, a grandchild too."""
        self.held_dir = folder
        if root_pid is not None:
            self.image_pids.add(root_pid)      # the target's own exec is an exec
        t = threading.Thread(target=self._watch, args=(capture, warn, root_pid, folder), daemon=True,
                             name="memtrace-held")
        t.start()

    def _watch(self, capture: CaptureChild, warn: Warn, root_pid: int | None, folder: Path) -> None:
        seen: set[str] = set()
        while not self.stopped.is_set():
            try:
                names = set(os.listdir(folder))
            except OSError:
                return                  # the run is over (the folder went with the root's host)
            for name in sorted(names - seen):
                if name.isdigit():
                    self._follow_held(capture, warn, root_pid, int(name), folder / name)
            seen = names                # a released image's name may come back: its next exec
            time.sleep(0.003)

    def _follow_held(self, capture: CaptureChild, warn: Warn, root_pid: int | None, pid: int, file: Path) -> None:
        with self.lock:
            origin = "exec" if pid in self.image_pids else "spawn"
            self.image_pids.add(pid)
        child = Child(pid=pid, ppid=_ppid(pid), origin=origin, path=_exe(pid))
        with self.lock:
            self.claims[pid] = (time.monotonic(), child)
        self.follow_process(capture, warn, root_pid, child, None, held=file)

    def wait_claim(self, pid: int, since: float, timeout: float = HELD_CLAIM_S, unmatched: bool = False) -> Child | None:
        """The held image of ``pid`` followed since ``since`` -- or, with ``unmatched`` (a new
        process's first image), one no report has matched yet: under load the agent's report can
        come seconds after the claim -- waiting for
        the watcher: ``timeout``, or up to ``HELD_WAIT_S`` while the process is one the hold will
        post (a dynamic image started with the hold in its environment), so it is never followed
        twice."""
        start = time.monotonic()
        while True:
            with self.lock:
                claim = self.claims.get(pid)
                if claim is not None and (claim[0] >= since or (unmatched and id(claim[1]) not in self.matched)):
                    self.matched.add(id(claim[1]))
                    return claim[1]
            waited = time.monotonic() - start
            if waited >= HELD_WAIT_S or (waited >= timeout and not _held_by_the_hold(pid)):
                return None
            time.sleep(0.005)

    def unreported(self) -> list[Child]:
        """Images followed from the hold that no agent reported (a vfork child's exec after the
        first, say): listed by the root capture, with their own ppid."""
        with self.lock:
            return [c for _, c in self.claims.values() if id(c) not in self.matched]

    def _run(self, capture: CaptureChild, warn: Warn, parent_pid: int | None, child: Child, entry: str | None,
             held: Path | None = None) -> None:
        try:
            if child.origin == "spawn" and held is None:
                _settle_exec(child.pid, parent_pid)
            result = capture(child, entry, held)
            # reason before ended: settle() on another thread reads ended as "done", then reason.
            child.reason = result.reason
            child.ended = result.ended
            if child.capture is not None and (self.folder / child.capture).exists():
                warn(f"child pid {child.pid}: traced in {child.capture} ({result.ended})")
        except CaptureWriteError as e:
            # The child's capture holds what was written before the disk filled; its END says why.
            child.reason = str(e)
            child.ended = "write-failed"
            warn(f"child pid {child.pid}: {e}")
        except MemtraceError as e:
            self._not_followed(warn, child, str(e))
        except Exception as e:  # noqa: BLE001 -- a child's failure must never end the parent's capture
            self._not_followed(warn, child, f"{type(e).__name__}: {e}")

    def _not_followed(self, warn: Warn, child: Child, why: str) -> None:
        child.reason = f"could not follow: {why}"
        child.ended = "not-followed"
        # A capture that never attached is discarded (capture_loop): the END names no file.
        if child.capture is not None and not (self.folder / child.capture).exists():
            child.capture = None
        warn(f"child pid {child.pid}: could not follow: {why}")

    def join(self) -> None:
        """Wait for every followed capture: each ends by the deadline, plus its own teardown (rpcs
        with deadlines of their own); past JOIN_GRACE_S after the deadline they are left behind."""
        give_up = self.deadline + JOIN_GRACE_S
        while True:
            with self.lock:
                alive = [t for t in self.threads if t.is_alive()]
            if not alive or time.monotonic() >= give_up:
                return
            # (No window: a program's run lasts until its followed processes have ended too.)
            alive[0].join(timeout=max(0.1, min(1.0, give_up - time.monotonic())))


def children_evidence(children: list[Child]) -> dict[str, Any]:
    """The END record's account of the processes the target made: the first END_CHILDREN, and how
    many more there were."""
    out: dict[str, Any] = {"children": [c.to_json() for c in children[:END_CHILDREN]]}
    if len(children) > END_CHILDREN:
        out["children_not_listed"] = len(children) - END_CHILDREN
    return out


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


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(") ", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _held_by_the_hold(pid: int) -> bool:
    """Whether ``pid``'s image will wait in the hold (memtrace.hold): it runs a dynamic executable
    (the hold is an LD_AUDIT library, which only the dynamic loader runs) and was started with the
    hold in its environment (the kernel's copy of it: what the image was started with, whatever it
    did to its own since)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if not any(v.startswith(b"LD_AUDIT=") for v in f.read().split(b"\0")):
                return False
        with open(f"/proc/{pid}/exe", "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return False        # not a 64-bit little-endian ELF: no hold here (hold/ is x86-64 and arm64)
            phoff = int.from_bytes(head[0x20:0x28], "little")
            phentsize = int.from_bytes(head[0x36:0x38], "little")
            phnum = int.from_bytes(head[0x38:0x3A], "little")
            f.seek(phoff)
            table = f.read(phentsize * min(phnum, 256))
    except (OSError, IndexError):
        return False
    PT_INTERP = 3
    return any(int.from_bytes(table[i:i + 4], "little") == PT_INTERP
               for i in range(0, len(table) - 3, max(phentsize, 1)))


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


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


class ChildFollower:
    """One capture's collaborator for the processes its target makes: it records each one
    (WARNING record, a line on screen, the END's list) and, with --follow-children, starts its
    capture through ``capture`` (the loop's: same tracer, same folder, the family's window)."""

    def __init__(self, family: Family, follow: bool, write: Callable[[RecordType, Any], None], warn: Warn,
                 capture: CaptureChild, target_pid: Callable[[], int | None]) -> None:
        self.family = family
        self.follow = follow
        self.write = write
        self.warn = warn
        self.capture = capture
        self.target_pid = target_pid
        self.children: list[Child] = []    # processes this target made (reported by its agent)
        self.replacement: Child | None = None   # the image the target exec'd, when followed

    def watch_held(self, folder: Path) -> None:
        """The hold keeps every image the run's processes exec at its constructors: follow them."""
        self.family.watch_held(self.capture, self.warn, self.target_pid(), folder)

    def on_child(self, payload: dict[str, Any]) -> None:
        """The agent reported a process its target made (``process:child``)."""
        child = Child(pid=int(payload["pid"]), ppid=payload.get("ppid"), origin=str(payload.get("origin")),
                      path=payload.get("path"))
        self.children.append(child)
        what = f"child pid {child.pid} ({child.origin}" + (f" + exec of {child.path})" if child.path else ")")
        held = None
        if self.follow and child.origin != "fork" and self.family.held_dir is not None:
            # Its image waited before its constructors and is followed from there already.
            held = self.family.wait_claim(child.pid, since=child.seen - 2.0, unmatched=True)
        if held is not None:
            held.path = child.path or held.path     # as the target named it
            self.children[-1] = child = held        # one record: the followed image's
            message = f"the target made {what}: following it from before its first constructor"
        elif self.follow:
            self.family.follow_process(self.capture, self.warn, self.target_pid(), child,
                                       payload.get("entry") if child.origin == "fork" else None)
            # No file named yet: it exists only once the child is attached (then the END lists it).
            message = f"the target made {what}: following it"
        else:
            message = f"the target made {what}: not followed, it runs untraced (--follow-children traces it)"
        self.write(RecordType.WARNING, {"message": message, "process": "child", "child": child.to_json(),
                                        "lost": payload.get("lost", 0)})
        n = len(self.children)
        if n <= MAX_CHILD_LINES:
            self.warn(message)
        elif n == MAX_CHILD_LINES + 1:
            self.warn("more children follow; every one has a WARNING record in the capture")

    def on_replaced(self, info: dict[str, Any], since: float) -> None:
        """The target's session ended with its exec (``info``: the exec's path and argv; the
        followed capture is noted in it): follow the new image, or say it is not followed."""
        pid = self.target_pid()
        assert pid is not None
        path = info.get("path")
        held = None
        if self.follow and self.family.held_dir is not None:
            held = self.family.wait_claim(pid, since=since)
        if held is not None:
            self.replacement = held
            info["followed"] = held.capture
            message = f"the target replaced itself (exec of {path}): following it"
        elif self.follow:
            child = Child(pid=pid, ppid=None, origin="exec", path=path)
            self.replacement = child
            info["followed"] = self.family.follow_process(self.capture, self.warn, pid, child, None)
            message = f"the target replaced itself (exec of {path}): following it"
        else:
            message = (f"the target replaced itself (exec of {path}): not followed (--follow-children traces it); "
                       f"its output still passes through")
        self.write(RecordType.WARNING, {"message": message, "process": "process-replaced", "exec": info})
        self.warn(message)

    def join(self, phase: Callable[[str], None]) -> None:
        """The run's root capture waits for every followed one."""
        if self.family.threads:
            phase("waiting for followed children")
        self.family.join()

    def settle(self, exec_info: dict[str, Any] | None) -> None:
        """Before the END: wait until the capture of each process this target made has ended (of
        the image it exec'd: attached) -- the root's join has waited for all of them; a followed
        child's END is written while its own children may still run -- so the END says how each
        ended, names a capture file only once it exists, and never one a failed follow discarded.
        Bounded as the join is: the window's end plus JOIN_GRACE_S."""
        give_up = self.family.deadline + JOIN_GRACE_S
        followed = [c for c in [*self.children, self.replacement] if c is not None and c.capture is not None]
        # A child ended, so the END says how (`show` reads a child's children from it): the root waits
        # for all of them anyway.  Past the bound (or on a stop) attached is enough: from then on its
        # file stays (only a capture that never attached is discarded).
        # The image this one exec'd is this process going on: attached is enough for it, at once.
        while any(c.ended is None and not (c is self.replacement and c.attached) for c in followed) \
                and time.monotonic() < give_up \
                and not self.family.stopped.is_set():
            time.sleep(0.01)
        for c in followed:
            if c.capture is not None and not (self.family.folder / c.capture).is_file():
                c.capture = None            # still attaching at the window's end, or discarded
        if exec_info is not None and exec_info.get("followed") and (
                self.replacement is None or self.replacement.capture is None):
            del exec_info["followed"]
            if self.replacement is not None:
                exec_info["not_followed"] = self.replacement.reason or "its capture did not start"

    def evidence(self, root: bool) -> dict[str, Any]:
        """The END's account; the root's lists the held images no agent reported too."""
        if root:
            self.children.extend(self.family.unreported())
        return children_evidence(self.children)
