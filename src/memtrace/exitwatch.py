"""The exit status, or the signal, of a program memtrace spawned on this machine.

Frida reaps the programs it spawns itself (GLib's child watch), and its agent learns of an
exit before the status exists, so neither says how a local target died.  A thread blocked in
``waitid(WEXITED | WNOWAIT)`` on the child sees the exit and reads the status without reaping
it: Frida's own ``waitpid`` still finds the zombie.  Best effort by nature: when Frida's reaper
gets there first, the status is simply not known (as before).  Linux and macOS hosts only;
a process on a USB device is never our child.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any


class ChildExitWatcher:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.result: dict[str, Any] | None = None
        self.t: float | None = None
        self._done = threading.Event()
        if not hasattr(os, "waitid") or not _is_our_child(pid):
            self._done.set()
            return
        threading.Thread(target=self._wait, name=f"memtrace-exitwatch-{pid}", daemon=True).start()

    def _wait(self) -> None:
        try:
            r = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        except (ChildProcessError, OSError):
            r = None     # reaped by Frida first, or not ours after all
        if r is not None:
            self.t = time.monotonic()
            if r.si_code == os.CLD_EXITED:
                self.result = {"exit_status": r.si_status}
            elif r.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
                self.result = {"signal": r.si_status, "signal_name": _signal_name(r.si_status),
                               "core_dumped": r.si_code == os.CLD_DUMPED}
        self._done.set()

    def wait(self, timeout: float) -> dict[str, Any] | None:
        """The status once the child is gone (waiting at most ``timeout`` for it to be read)."""
        self._done.wait(timeout)
        return self.result


def _is_our_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            # pid (comm) state ppid ...: comm may hold spaces and parentheses.
            return int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
