"""Let Frida's injected threads win the CPU while it injects into a busy local target (Linux).

Frida's Linux injector gives its loader 5 s to sync with the agent; in a process whose threads keep
every CPU busy the loader gets well under 1 % of a CPU, misses that, and the injector unmaps the
loader under the thread still running in it: the target dies with SIGSEGV (docs/domain/frida.md,
issue 27).  memtrace itself, on the same CPUs, is starved as well.  So, only when the target has
more runnable threads than CPUs it may run on and memtrace may set nice values both ways
(CAP_SYS_NICE -- without it a lowered thread could not be given its old value back):

- the target's threads are niced to 19 (each one's old value remembered);
- a watcher gives every thread that appears meanwhile (the injector's loader, the agent's threads:
  Frida cloaks them and on Linux they keep the program's name, so newness is what tells them)
  nice -20;
- once the agent's script is loaded, every thread of the program gets its old value back exactly,
  and Frida's threads keep -20 for the session (their JavaScript thread is otherwise slowed ~100-fold).

A thread the program itself creates during that window (a second or so) cannot be told from
Frida's: it is given the value its creator had before (the program's main thread's, its usual
nice) when that thread was still at our 19 -- never left deprioritised -- but one made after the
watcher raised it keeps -20.  Darwin / USB devices: not applicable (no /proc; the injector there is
another); only the local device's targets come here.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

LOWERED = 19            # the program's threads while Frida injects
RAISED = -20            # Frida's threads, from the moment they are seen
CAP_SYS_NICE = 23
WATCH_INTERVAL = 0.002  # s between looks at /proc/PID/task (the watcher is not starved any more)


def _tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def runnable_threads(pid: int) -> int:
    """How many of pid's threads are running or runnable (state R) now."""
    count = 0
    for tid in _tids(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split(b" ", 1)
        if fields and fields[0] == b"R":
            count += 1
    return count


def can_renice() -> bool:
    """True when this process may lower and raise nice values (CAP_SYS_NICE in its effective set)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    except (OSError, ValueError):
        pass
    return False


def cpus_of(pid: int) -> int:
    try:
        return len(os.sched_getaffinity(pid))
    except OSError:
        return os.cpu_count() or 1


def busy(pid: int, samples: int = 3) -> bool:
    """More runnable threads than CPUs, in any of a few looks 10 ms apart."""
    cpus = cpus_of(pid)
    for i in range(samples):
        if runnable_threads(pid) > cpus:
            return True
        if i < samples - 1:
            time.sleep(0.01)
    return False


def _nice(tid: int) -> int | None:
    """tid's nice value, None when it is gone or not a time-shared thread (real-time, idle: the
    nice value does not rule those, so they are left alone)."""
    try:
        if os.sched_getscheduler(tid) not in (os.SCHED_OTHER, os.SCHED_BATCH):
            return None
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        return None


def _set_nice(tid: int, value: int) -> bool:
    try:
        os.setpriority(os.PRIO_PROCESS, tid, value)
        return True
    except OSError:     # gone (ESRCH) or not ours to change: nothing else to do for it
        return False


class InjectionBoost:
    """The window from before Frida's attach until the agent's script is loaded (see the module's
    doc).  restore() is idempotent and must run on every path (callers: try/finally)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.original: dict[int, int] = {}      # the program's threads: tid -> nice before
        self.raised: set[int] = set()           # threads that appeared in the window
        self.born_nice: dict[int, int] = {}     # new threads seen at LOWERED: given back this
        self.ignored: set[int] = set()          # real-time / idle threads: left alone
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.restored = False

    def start(self) -> None:
        main_nice = _nice(self.pid)
        self.default_nice = main_nice if main_nice is not None else 0
        with self._lock:
            self._lower_existing()
        self._watcher = threading.Thread(target=self._watch, name="memtrace-boost", daemon=True)
        self._watcher.start()

    def _lower_existing(self) -> None:
        # Twice: a thread created while the first pass ran is lowered too (it is the program's).
        for _ in range(2):
            for tid in _tids(self.pid):
                if tid in self.original or tid in self.ignored:
                    continue
                nice = _nice(tid)
                if nice is None:
                    self.ignored.add(tid)
                elif nice >= LOWERED or _set_nice(tid, LOWERED):
                    self.original[tid] = nice

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            with self._lock:
                if self.restored:
                    return
                for tid in _tids(self.pid):
                    if tid in self.original or tid in self.raised or tid in self.ignored:
                        continue
                    nice = _nice(tid)
                    if nice is None:
                        self.ignored.add(tid)
                        continue
                    if nice == LOWERED and self.default_nice != LOWERED:
                        # Made by a lowered thread: the injector's loader (its bootstrap runs in
                        # a hijacked program thread) or a thread of the program's own.
                        self.born_nice[tid] = self.default_nice
                    if _set_nice(tid, RAISED):
                        self.raised.add(tid)

    def restore(self) -> dict[str, int]:
        """Every program thread's nice value back as it was; Frida's threads stay raised.
        Returns counts (for the capture's phases / tests)."""
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=5)
        with self._lock:
            if self.restored:
                return {}
            self.restored = True
            back = 0
            for tid, nice in self.original.items():
                back += _set_nice(tid, nice)
            # A thread born at our 19 in the window: Frida's loader (gone by now) or the
            # program's own -- never leave the program's deprioritised, nor raised above what
            # its creator had.
            for tid, nice in self.born_nice.items():
                if tid in self.raised:
                    back += _set_nice(tid, nice)
                    self.raised.discard(tid)
            return {"lowered": len(self.original), "restored": back, "raised": len(self.raised)}


def boost_injection(pid: int) -> InjectionBoost | None:
    """An InjectionBoost started for a busy local pid, or None (not busy, or memtrace may not
    give the threads their old nice back)."""
    if not can_renice() or not busy(pid):
        return None
    boost = InjectionBoost(pid)
    try:
        boost.start()
    except BaseException:
        with contextlib.suppress(Exception):
            boost.restore()
        raise
    return boost
