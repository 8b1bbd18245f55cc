"""A test's own child processes, when memtrace (or Frida) runs in the test's process.

Frida's local device injects from a thread of the process that uses it: a test that drives
FridaHost or a Frida session in-process is the tracer (ptrace) of the target it spawned with
Popen, as well as its parent.  Then a wait of the test's -- Popen.poll() or wait() -- can take a
ptrace stop meant for Frida's thread; see exit_of.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any


def exit_of(p: subprocess.Popen[Any]) -> int | None:
    """The target's exit status, or None while it lives -- read WITHOUT consuming any other wait
    status.  Frida's local device injects from a thread of this very process (a storm's lib
    driver, an in-process test), which ptraces the target, a child of ours: Popen.poll() (waitpid,
    WNOHANG) would take that thread's ptrace stops (an event-stop or a remote call's end: WSTOPSIG
    5 or 11, which Popen reports as "killed by signal 5 / 11") and leave Frida's injector waiting
    for a stop that never comes (5 s, then it lets the target run on into the remote call's dummy
    return address 0x320: a real SIGSEGV) -- the round-5 storms' phantom "signal 5" and "signal 11" deaths (no core, no fault, no
    signal sent: the kernel's signal trace), each followed by a run of deaths inside Frida's
    injection.  waitid(WNOWAIT) only looks, and a tracer's wait reports its tracee's ptrace stops
    whatever the flags (CLD_TRAPPED), so only an exit (CLD_EXITED, _KILLED, _DUMPED) is reaped."""
    if p.returncode is not None:
        return p.returncode
    try:
        info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return p.poll()         # reaped by someone else (memtrace's exit watcher): poll says 0
    if info is None or info.si_code not in (os.CLD_EXITED, os.CLD_KILLED, os.CLD_DUMPED):
        return None             # alive (a ptrace stop of Frida's injector, left to it)
    return p.wait()


def kill_and_reap(p: subprocess.Popen[Any], timeout: float = 30) -> None:
    """SIGKILL and reap: Popen.wait() could return a ptrace stop still pending for Frida's thread
    (as "killed by signal 5 / 11") and leave the process a zombie; this waits for the exit itself."""
    if p.returncode is not None:
        return
    p.kill()
    deadline = time.monotonic() + timeout
    while exit_of(p) is None and time.monotonic() < deadline:
        time.sleep(0.01)


def wait_exit(p: subprocess.Popen[Any], timeout: float) -> int:
    """Popen.wait(timeout) that takes no ptrace stop of Frida's (see exit_of)."""
    deadline = time.monotonic() + timeout
    while (status := exit_of(p)) is None:
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(p.args, timeout)
        time.sleep(0.01)
    return status
