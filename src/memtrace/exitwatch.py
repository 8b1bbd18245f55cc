"""The exit status, or the signal, of a process on this machine: spawned by memtrace or attached to.

Frida reaps the programs it spawns itself (GLib's child watch, which throws the status away),
and its agent learns of an exit before the status exists, so neither says how a local target
died; racing Frida's reaper with ``waitid(WNOWAIT)`` read the status only sometimes.

A pidfd does not race: opened while the process lives, it refers to that process for good.
It becomes readable when the process exits, and then

- Linux 6.15+ keeps the exit status for it once the process is reaped, by anyone
  (``ioctl(PIDFD_GET_INFO)`` with ``PIDFD_INFO_EXIT``): reliable, child or not;
- until someone reaps it, the zombie's status is in ``/proc/<pid>/stat`` (field 52), and for
  our own child ``waitid(P_PIDFD, WNOWAIT)`` reads it without reaping.

So the watcher opens the pidfd at launch (or attach) and, after the exit, asks all three until
one answers.  Without pidfds (older Linux, macOS hosts) only the old race remains: best effort,
and the evidence then says the status is unknown.  A process on a USB device is never watched
here (its death is told by the agent and Frida's detach reason).
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import threading
import time
from typing import Any

# linux/pidfd.h (6.15): struct pidfd_info, PIDFD_INFO_SIZE_VER0 = 64 bytes; exit_code at 60.
PIDFD_INFO_SIZE = 64
PIDFD_GET_INFO = (3 << 30) | (PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11     # _IOWR(0xFF, 11, ...)
PIDFD_INFO_EXIT = 1 << 3
_EXIT_CODE_OFFSET = 60
STATUS_WAIT_S = 2.0          # after the exit, how long the status may take to become readable


class ChildExitWatcher:
    """Watches ``pid`` from now on; :meth:`wait` gives how it ended (or None when unknowable)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.result: dict[str, Any] | None = None
        self.t: float | None = None
        self.how: str | None = None          # which source answered (evidence for the capture)
        self._done = threading.Event()
        self._stop = threading.Event()     # stop(): the session ended with the process alive
        self._ours = _is_our_child(pid)
        self._pidfd: int | None = None
        if hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(pid)
            except OSError:
                self._pidfd = None
        if self._pidfd is None and not (self._ours and hasattr(os, "waitid")):
            self._done.set()
            return
        threading.Thread(target=self._watch, name=f"memtrace-exitwatch-{pid}", daemon=True).start()

    def _watch(self) -> None:
        try:
            if self._pidfd is not None:
                self._watch_pidfd(self._pidfd)
            else:
                self._watch_waitid()
        finally:
            if self._pidfd is not None:
                os.close(self._pidfd)
            self._done.set()

    def _watch_pidfd(self, fd: int) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll(200):
            if self._stop.is_set():
                return
        self.t = time.monotonic()
        deadline = self.t + STATUS_WAIT_S
        while time.monotonic() < deadline:
            for how, read in (("pidfd", _pidfd_exit_code), ("waitid", self._waitid_pidfd),
                              ("proc", lambda _fd: _zombie_exit_code(self.pid))):
                code = read(fd)
                if code is not None:
                    self.result, self.how = decode_status(code), how
                    return
            time.sleep(0.01)

    def _waitid_pidfd(self, fd: int) -> int | None:
        if not self._ours or not hasattr(os, "P_PIDFD"):
            return None
        try:
            r = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except (ChildProcessError, OSError):
            return None
        return None if r is None else _siginfo_status(r)

    def _watch_waitid(self) -> None:
        while True:
            try:
                r = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            except (ChildProcessError, OSError):
                r = None     # reaped by Frida first
            if r is None or r.si_code in (os.CLD_EXITED, os.CLD_KILLED, os.CLD_DUMPED):
                break
            # A ptrace stop (CLD_TRAPPED): Frida's injector runs in this process and is the
            # child's tracer, and a tracer's wait reports its tracee's stops whatever the flags.
            # WNOWAIT leaves it to Frida; look again a little later, not in a busy loop.
            if self._stop.wait(0.05):
                return
        self.t = time.monotonic()
        code = None if r is None else _siginfo_status(r)
        if code is not None:
            self.result, self.how = decode_status(code), "waitid"

    def stop(self) -> None:
        """Stop watching (a process left running at the session's end): the thread ends within
        0.2 s, so a long-lived host that runs many sessions keeps no thread per session.  A
        process that already exited is still read to the end.  Without pidfds the blocking
        waitid cannot be told to stop: that thread lives until the process ends."""
        self._stop.set()

    def wait(self, timeout: float) -> dict[str, Any] | None:
        """The status once the process is gone (waiting at most ``timeout`` for it to be read)."""
        self._done.wait(timeout)
        return self.result


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (a process on this machine, alive now), or None where the system has
    none (older Linux, macOS hosts): signals sent through it reach that process or none, never a
    later one given the same pid."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def local_pid_alive(pid: int) -> bool:
    """Whether pid is a live process on this machine (a zombie is not)."""
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


def reaped_status_readable() -> bool:
    """Whether this kernel keeps a reaped process's status for its pidfds (Linux 6.15+)."""
    if not hasattr(os, "pidfd_open") or not hasattr(os, "fork"):
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(5)
    fd = os.pidfd_open(pid)
    try:
        os.waitpid(pid, 0)
        return _pidfd_exit_code(fd) == 5 << 8
    finally:
        os.close(fd)


def decode_status(code: int) -> dict[str, Any]:
    """A wait status (waitpid's int) as the capture records it."""
    if os.WIFSIGNALED(code):
        sig = os.WTERMSIG(code)
        return {"signal": sig, "signal_name": signal_name(sig), "core_dumped": bool(os.WCOREDUMP(code))}
    return {"exit_status": os.WEXITSTATUS(code)}


def _siginfo_status(r: Any) -> int | None:
    if r.si_code == os.CLD_EXITED:
        return (r.si_status & 0xFF) << 8
    if r.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return r.si_status | (0x80 if r.si_code == os.CLD_DUMPED else 0)
    return None


def _pidfd_exit_code(fd: int) -> int | None:
    buf = bytearray(PIDFD_INFO_SIZE)
    struct.pack_into("<Q", buf, 0, PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(fd, PIDFD_GET_INFO, buf)
    except OSError:
        return None      # a kernel before 6.15, or not reaped yet on some
    if not struct.unpack_from("<Q", buf, 0)[0] & PIDFD_INFO_EXIT:
        return None
    return int(struct.unpack_from("<i", buf, _EXIT_CODE_OFFSET)[0])


def _zombie_exit_code(pid: int) -> int | None:
    """The exit_code field of a zombie's /proc/<pid>/stat (gone once it is reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (state); exit_code is field 52.
    if len(fields) < 50 or fields[0] != "Z":
        return None
    return int(fields[49])


def _is_our_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            # pid (comm) state ppid ...: comm may hold spaces and parentheses.
            return int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
