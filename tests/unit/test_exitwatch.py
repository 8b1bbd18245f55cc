"""The exit watcher reads a child's status without reaping it."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from memtrace.exitwatch import ChildExitWatcher

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


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
    assert p.wait(5) == returncode         # WNOWAIT read the status and left the child to reap


def test_not_our_child_is_not_watched() -> None:
    w = ChildExitWatcher(1)
    assert w.wait(0.1) is None
