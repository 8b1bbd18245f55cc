"""A long-lived Python process that runs memtrace's command line again and again (a library user,
the storm's lib driver; --follow-children's hosts within one run) keeps nothing per session: the
hosts are collected (Frida's native side held every handler given to a device, session or
script, and through them the host, its Reactor's eventfd and its queues, for good), and no exit
watcher thread outlives its session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ..conftest import ROOT  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

SESSIONS = 3

DRIVER = textwrap.dedent("""
    import gc, json, os, subprocess, sys, threading, time, weakref
    from memtrace.cli import main
    from memtrace.frida_host import FridaHost

    hosts = []
    init = FridaHost.__init__
    def counted(self, *a, **k):
        init(self, *a, **k)
        hosts.append(weakref.ref(self))
    FridaHost.__init__ = counted

    def eventfds():
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += "eventfd" in os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                pass
        return n

    def watchers():
        return [t.name for t in threading.enumerate() if t.name.startswith("memtrace-exitwatch")]

    target = subprocess.Popen(["sleep", "120"])
    out, fds = sys.argv[1], []
    try:
        for i in range(int(sys.argv[2])):
            try:
                main(["malloc", "--device", "local", "--pid", str(target.pid), "--window", "0.25",
                      "--quiet", "--out", f"{out}/c{i}"])
            except SystemExit as e:
                assert not e.code, e.code
            # The session's threads (Reactor, pumps) end moments after it: wait, bounded.
            end = time.monotonic() + 10
            while time.monotonic() < end:
                gc.collect()
                if not any(r() is not None for r in hosts) and not watchers():
                    break
                time.sleep(0.1)
            fds.append(eventfds())
        print(json.dumps({
            "hosts": len(hosts), "alive": sum(r() is not None for r in hosts), "eventfds": fds,
            "watchers": watchers(),
            "target_alive": target.poll() is None}))
    finally:
        target.kill()
        target.wait()
""")


@pytest.mark.slow
def test_sessions_in_one_process_leave_no_host_behind(tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = subprocess.run([sys.executable, str(driver), str(tmp_path / "out"), str(SESSIONS)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["target_alive"]
    assert seen["hosts"] == SESSIONS
    assert seen["alive"] == 0, seen
    assert seen["watchers"] == [], seen
    # One eventfd per host (its Reactor's) while it lives: none piles up session after session.
    assert len(set(seen["eventfds"])) == 1, seen
