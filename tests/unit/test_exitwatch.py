"""The exit watcher reads a child's status without reaping it."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from memtrace.exitwatch import ChildExitWatcher

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def test_exit_status_and_the_child_is_still_reapable() -> None:
    p = subprocess.Popen(["sh", "-c", "read x; exit 7"], stdin=subprocess.PIPE)
    w = ChildExitWatcher(p.pid)
    assert p.stdin is not None
    p.stdin.write(b"go\n")
    p.stdin.close()
    assert w.wait(5) == {"exit_status": 7}
    assert p.wait(5) == 7                  # WNOWAIT read the status and left the child to reap


def test_killed_by_a_signal() -> None:
    p = subprocess.Popen(["sh", "-c", "read x; kill -9 $$"], stdin=subprocess.PIPE)
    w = ChildExitWatcher(p.pid)
    assert p.stdin is not None
    p.stdin.write(b"go\n")
    p.stdin.close()
    assert w.wait(5) == {"signal": 9, "signal_name": "SIGKILL", "core_dumped": False}
    assert p.wait(5) == -signal.SIGKILL


def test_not_our_child_is_not_watched() -> None:
    w = ChildExitWatcher(1)
    assert w.wait(0.1) is None
