"""The exit watcher reads a process's status from a pidfd: our child or not, reaped or not."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

import pytest

from memtrace.exitwatch import ChildExitWatcher, decode_status, reaped_status_readable

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and pidfds")


@pytest.mark.parametrize("script, status, returncode", [
    ("read x; exit 7", {"exit_status": 7}, 7),
    ("read x; kill -9 $$", {"signal": 9, "signal_name": "SIGKILL", "core_dumped": False}, -signal.SIGKILL),
])
def test_status_is_read_and_the_child_is_still_reapable(script: str, status: dict, returncode: int) -> None:
    p = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE)
    w = ChildExitWatcher(p.pid)
    assert p.stdin is not None
    p.stdin.write(b"go\n")
    p.stdin.close()
    assert w.wait(5) == status
    assert p.wait(5) == returncode         # the watcher never reaps: the parent still can


@pytest.mark.parametrize("reaper_first", [
    pytest.param(True, marks=pytest.mark.skipif(not reaped_status_readable(), reason="needs Linux 6.15+")),
    False])
def test_status_survives_someone_else_reaping_first(reaper_first: bool) -> None:
    """Frida reaps the programs it spawns and throws the status away: the pidfd still has it."""
    p = subprocess.Popen(["sh", "-c", "read x; exit 42"], stdin=subprocess.PIPE)
    w = ChildExitWatcher(p.pid)
    assert p.stdin is not None
    p.stdin.write(b"go\n")
    p.stdin.close()
    if reaper_first:
        assert p.wait(5) == 42             # reaped before the watcher looked
    assert w.wait(5) == {"exit_status": 42}
    p.wait(5)


def test_a_process_that_is_not_our_child_is_watched_too() -> None:
    """--pid targets: a grandchild here (sh's child), killed by a signal."""
    sh = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    assert sh.stdout is not None
    pid = int(sh.stdout.readline())
    w = ChildExitWatcher(pid)
    os.kill(pid, signal.SIGTERM)
    assert w.wait(5) == {"signal": signal.SIGTERM, "signal_name": "SIGTERM", "core_dumped": False}
    sh.wait(5)


def test_a_live_process_has_no_status_yet() -> None:
    w = ChildExitWatcher(1)
    assert w.wait(0.1) is None
    w.stop()


def test_a_stopped_watcher_leaves_no_thread_behind() -> None:
    """A long-lived host (the storm's lib driver, a library user) runs many sessions against
    one process that outlives them: each session's watcher ends when the session does."""
    import threading

    p = subprocess.Popen(["sh", "-c", "read x"], stdin=subprocess.PIPE)
    try:
        watchers = [ChildExitWatcher(p.pid) for _ in range(5)]
        name = f"memtrace-exitwatch-{p.pid}"
        assert sum(t.name == name for t in threading.enumerate()) == 5
        for w in watchers:
            w.stop()
        for t in [t for t in threading.enumerate() if t.name == name]:
            t.join(5)
        assert [t for t in threading.enumerate() if t.name == name] == []
        assert all(w.wait(0) is None for w in watchers)    # stopped, not exited: no status
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(5)


def test_wait_statuses_decode() -> None:
    assert decode_status(3 << 8) == {"exit_status": 3}
    assert decode_status(signal.SIGSEGV | 0x80) == {"signal": 11, "signal_name": "SIGSEGV", "core_dumped": True}


PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4206, 0x4207


def test_without_pidfds_a_ptrace_stop_is_left_to_the_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Frida's local injector is a thread of memtrace's own process, so memtrace is the tracer of
    the programs it spawned: its wait sees their ptrace stops whatever the flags.  Without pidfds
    the watcher waits (WNOWAIT) and must neither end on such a stop nor take it from the tracer."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    p = subprocess.Popen(["sleep", "30"])
    try:
        if libc.ptrace(PTRACE_SEIZE, p.pid, None, None) != 0:
            pytest.skip(f"cannot ptrace a child here: {os.strerror(ctypes.get_errno())}")
        assert libc.ptrace(PTRACE_INTERRUPT, p.pid, None, None) == 0
        monkeypatch.delattr(os, "pidfd_open")
        w = ChildExitWatcher(p.pid)
        assert w.wait(0.3) is None and not w._done.is_set()        # still watching
        stop = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WSTOPPED | os.WNOHANG)    # the tracer's
        assert stop is not None and stop.si_code == os.CLD_TRAPPED
        assert libc.ptrace(PTRACE_DETACH, p.pid, None, None) == 0
        p.kill()
        assert w.wait(5) == {"signal": 9, "signal_name": "SIGKILL", "core_dumped": False}
    finally:
        p.kill()
        p.wait()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfds (Linux 5.3+)")
def test_the_kill_at_the_end_never_reaches_a_process_that_took_the_pid() -> None:
    """FridaHost.kill signals through the pidfd opened at launch: the program memtrace spawned is
    gone and reaped, and its pid -- simulated here by pointing the host at another live process --
    now names a stranger, which lives on.  The same host kills its own program when it lives."""
    import frida

    from memtrace.exitwatch import open_pidfd
    from memtrace.frida_host import FridaHost
    from memtrace.launchers import Launched
    from memtrace.target import TargetSpec

    gone = subprocess.Popen(["true"])
    gone_fd = open_pidfd(gone.pid)
    gone.wait()
    stranger = subprocess.Popen(["sleep", "30"])
    ours = subprocess.Popen(["sleep", "30"])
    try:
        host = FridaHost(TargetSpec(device="local", argv=["true"]), 5.0, device=frida.get_local_device())
        host.launched = Launched(pid=stranger.pid, t_launch=None, suspended=False, spawned=True, how="test")
        host._pidfd = gone_fd
        host.kill()
        assert stranger.poll() is None
        host.close()
        assert host._pidfd is None
        host.kill()             # closed: no pidfd left, and by pid it could only reach a stranger
        assert stranger.poll() is None

        host = FridaHost(TargetSpec(device="local", argv=["sleep", "30"]), 5.0, device=frida.get_local_device())
        host.launched = Launched(pid=ours.pid, t_launch=None, suspended=False, spawned=True, how="test")
        host._pidfd = open_pidfd(ours.pid)
        host.kill()
        assert ours.wait(timeout=10) == -signal.SIGKILL
        host.close()
    finally:
        for p in (stranger, ours):
            p.kill()
            p.wait()
