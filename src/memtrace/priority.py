"""Let Frida's injected threads win the CPU while it injects into a local target (Linux).

Frida's Linux injector gives its loader 5 s to sync with the agent; when the loader thread is
starved past that -- by the target's own threads keeping every CPU busy, or by the rest of the
machine -- the injector unmaps the loader under the thread still running in it: the target dies
with SIGSEGV (docs/domain/frida.md, "Injection into a starved process").
memtrace's own host, on the same CPUs, is starved as well.  So, whenever memtrace may set nice
values both ways (CAP_SYS_NICE -- without it a lowered thread could not be given its old value
back, and nothing is done):

- memtrace's own threads (the injection is made from this process) run at nice -20 until the
  agent's script is loaded, then get their old values back -- at the session's end instead when the
  target is busy (below: its threads would starve memtrace's host all along);
- a watcher gives every thread that appears in the target meanwhile (the injector's loader, the
  agent's threads: on Linux they keep the program's name, so newness is what tells them) nice -20;
- only when the target itself has more runnable threads than CPUs, its threads are niced to 19
  meanwhile (each one's old value remembered), and a guard process started first (``GUARD``) holds
  those values: if memtrace is killed (SIGKILL) before it gives them back, the guard does;
- once the agent's script is loaded, every thread of the program gets its old value back exactly;
  of the threads that appeared, the agent says which are Frida's (``Cloak.hasThread``): those keep
  -20 for the session (their JavaScript thread is otherwise slowed ~100-fold), any other (the
  program's own, made in that window) gets the value it was born with (its creator's old value when
  it was born at our 19).

Darwin / USB devices: not applicable (no /proc; the injector there is another); only the local
device's targets come here.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
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
    return thread_states(pid).get("R", 0)


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


def thread_states(pid: int) -> dict[str, int]:
    """How many of pid's threads are in each state (R running, S sleeping, T/t stopped, ...)."""
    states: dict[str, int] = {}
    for tid in _tids(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3].decode(errors="replace")
        states[state] = states.get(state, 0) + 1
    return states


MACHINE_LOAD = 2.0      # runnable tasks per CPU (1-minute load average) that starve whoever is not favoured


def starvation(pid: int) -> dict[str, object] | None:
    """Why memtrace's threads (the agent's, in pid; the host's) may not have run: the target's
    own runnable threads outnumber its CPUs, or some are runnable on a machine whose load is
    past MACHINE_LOAD a CPU; None when neither (the target's threads all stopped -- a debugger,
    SIGSTOP, anti-debug stops: frozen -- or all asleep: hung, not starved).  Local targets only
    (reads /proc)."""
    states = thread_states(pid)
    if not states or set(states) <= {"T", "t"}:
        return None
    cpus = cpus_of(pid)
    runnable = max(states.get("R", 0), runnable_threads(pid))
    load1 = os.getloadavg()[0]
    machine = os.cpu_count() or 1
    # A starved thread waits for a CPU in state R; a target whose threads all sleep (a deadlock, a
    # hang) is not starved however loaded the machine is.
    if runnable <= cpus and not (runnable and load1 > MACHINE_LOAD * machine):
        return None
    return {"target_runnable_threads": runnable, "target_threads": sum(states.values()), "target_cpus": cpus,
            "load_1min": round(load1, 1), "machine_cpus": machine}


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



# The guard: reads "TID OLD EXPECTED" lines before memtrace changes a thread; on "done" it exits,
# on end of input without it (memtrace died) it gives every thread still at EXPECTED its OLD value.
# A process of its own (its own session: a Ctrl-C or SIGHUP to memtrace's group does not reach it);
# the pipe's write end is memtrace's alone (close-on-exec), so its end means memtrace is gone.
GUARD = r"""
import os, sys
pid = int(sys.argv[1]); plan = []
for line in sys.stdin:
    if line == "done\n":
        sys.exit(0)
    plan.append(tuple(int(x) for x in line.split()))
for tid, old, expected in plan:
    try:
        if os.path.isdir(f"/proc/{pid}/task/{tid}") and os.getpriority(os.PRIO_PROCESS, tid) == expected:
            os.setpriority(os.PRIO_PROCESS, tid, old)
    except OSError:
        pass
"""


class Guard:
    """The guard process for one boost (see GUARD)."""

    def __init__(self, pid: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", GUARD, str(pid)], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                     start_new_session=True)

    def note(self, tid: int, old: int, expected: int) -> bool:
        """Told before the change is made; False when the guard cannot be told (then no change)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(f"{tid} {old} {expected}\n")
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def done(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("done\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


class InjectionBoost:
    """The window from before Frida's attach until the agent's script is loaded (see the module's
    doc).  restore() is idempotent and must run on every path (callers: try/finally)."""

    def __init__(self, pid: int, lower: bool) -> None:
        self.pid = pid
        self.lower = lower                      # the program's threads niced to LOWERED meanwhile
        self.original: dict[int, int] = {}      # the program's threads lowered: tid -> nice before
        self.known: set[int] = set()            # the program's threads when the window opened
        self.raised: dict[int, int] = {}        # threads that appeared in the window: tid -> nice at birth
        self.ignored: set[int] = set()          # real-time / idle threads: left alone
        self.host: dict[int, int] = {}          # memtrace's own threads: tid -> nice before
        self.guard: Guard | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.restored = False
        self.default_nice = 0
        self.program_nices: set[int] = set()    # the values the program's threads had when the window opened

    def start(self) -> None:
        main_nice = _nice(self.pid)
        self.default_nice = main_nice if main_nice is not None else 0
        self._raise_host()      # first: the guard and the watcher are born raised
        with self._lock:
            if self.lower:
                try:
                    self.guard = Guard(self.pid)
                except OSError:
                    self.lower = False      # no guard, no lowering: never risk leaving 19 behind
            self._note_existing()
        self._watcher = threading.Thread(target=self._watch, name="memtrace-boost", daemon=True)
        self._watcher.start()

    def _raise_host(self) -> None:
        for tid in _tids(os.getpid()):
            nice = _nice(tid)
            if nice is not None and nice > RAISED and _set_nice(tid, RAISED):
                self.host[tid] = nice

    def _note_existing(self) -> None:
        # Twice: a thread created while the first pass ran is the program's too.
        for _ in range(2):
            for tid in _tids(self.pid):
                if tid in self.known or tid in self.ignored:
                    continue
                nice = _nice(tid)
                if nice is None:
                    self.ignored.add(tid)
                    continue
                self.known.add(tid)
                self.program_nices.add(nice)
                if not self.lower or nice >= LOWERED:
                    continue
                assert self.guard is not None
                if self.guard.note(tid, nice, LOWERED) and _set_nice(tid, LOWERED):
                    self.original[tid] = nice

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            with self._lock:
                if self.restored:
                    return
                for tid in _tids(self.pid):
                    if tid in self.known or tid in self.raised or tid in self.ignored:
                        continue
                    nice = _nice(tid)
                    if nice is None:
                        self.ignored.add(tid)
                        continue
                    if self.guard is not None and not self.guard.note(tid, self._value_at_birth(nice), RAISED):
                        continue
                    if _set_nice(tid, RAISED):
                        self.raised[tid] = nice

    def _value_at_birth(self, nice: int) -> int:
        """A thread seen at our 19 was made by a lowered thread (the injector's bootstrap runs in
        a hijacked program thread), one seen at our -20 -- a value none of the program's threads had
        -- by a thread we raised (a thread the program made in the window, itself making one): its
        own value is the program's usual one."""
        if nice == LOWERED and self.lower:
            return self.default_nice
        if nice == RAISED and RAISED not in self.program_nices:
            return self.default_nice
        return nice

    def restore(self, frida_threads: set[int] | None = None) -> dict[str, int]:
        """Every program thread's nice value back as it was; memtrace's own threads too.  Of the
        threads that appeared in the window, those in ``frida_threads`` (Frida's, as the agent
        says) stay raised and the others get their value at birth back; with ``frida_threads``
        None (the agent could not say) only those born at our 19 do (the loader is gone by now).
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
            # Born in the window since the watcher's last look (a thread a raised one made, say, at
            # its inherited -20): unseen by the watcher, its value at birth back too.
            for tid in _tids(self.pid):
                if tid in self.known or tid in self.raised or tid in self.ignored:
                    continue
                now = _nice(tid)
                birth = self._value_at_birth(now) if now is not None else None
                if birth is not None and birth != now:
                    back += _set_nice(tid, birth)
            kept = 0
            for tid, born in self.raised.items():
                if not os.path.isdir(f"/proc/{self.pid}/task/{tid}"):
                    continue
                if frida_threads is not None:
                    frida = tid in frida_threads
                else:
                    frida = not (born == LOWERED and self.lower)
                if frida:
                    kept += 1
                else:
                    back += _set_nice(tid, self._value_at_birth(born))
            if not self.lower:
                self._restore_host()
            if self.guard is not None:
                self.guard.done()
            return {"lowered": len(self.original), "restored": back, "raised": kept,
                    "host_raised": len(self.host)}

    def _restore_host(self) -> None:
        host_default = self.host.pop(os.getpid(), None)
        if host_default is not None:
            _set_nice(os.getpid(), host_default)
        for tid in _tids(os.getpid()):
            if tid in self.host:
                _set_nice(tid, self.host.pop(tid))
            elif host_default is not None and _nice(tid) == RAISED:
                _set_nice(tid, host_default)    # born meanwhile from a raised thread
        self.host.clear()

    def end(self) -> None:
        """The session is over: memtrace's own threads get their old values back.  Kept raised
        until now only when the target is busy (``lower``): its threads would otherwise starve
        memtrace's host (reading the agent's data, the unhook's rpc) for the whole session."""
        self.restore()
        with self._lock:
            self._restore_host()


def boost_injection(pid: int, held: bool = False) -> InjectionBoost | None:
    """An InjectionBoost started for a local pid (its threads lowered too when it is busy), or
    None when memtrace may not give nice values back.  ``held``: the program waits at the hold
    point (memtrace.hold), where no thread of its can be born: with no more threads than CPUs it
    cannot be busy, and the 20 ms of busy()'s looks are not spent before the attach (issue 21:
    fixed cost)."""
    if not can_renice():
        return None
    idle = held and len(_tids(pid)) <= cpus_of(pid)
    boost = InjectionBoost(pid, lower=not idle and busy(pid))
    try:
        boost.start()
    except BaseException:
        with contextlib.suppress(Exception):
            boost.restore()
        raise
    return boost
