"""A signal handler that mallocs, in a program that forks, never deadlocks under memtrace.

glibc's fork() holds every malloc arena's lock across the fork syscall; a timer signal landing
there runs a handler whose malloc waits on a lock its own thread holds.  With the agent mapped in
the process the syscall takes long enough that signal_fork hung 5 runs in 5 (blamed on
"anti-debug", exit 0); natively 0 in 8.  memtrace now holds the forking thread's signals from its
atfork prepare handler to its parent/child handlers (cmodule/process.c).

A process-directed signal runs on any thread that does not block it: with the forking thread's
signals held (and SIGALRM blocked inside its own handler) the kernel gave the timer's signal to
Frida's threads -- 1259 of 2159 handlers ran there -- and a handler that mallocs on a thread
interrupted inside libc's allocator corrupted its tcache (SIGSEGV in tcache_get, 1 run in 3 on the
merged tree).  Frida's threads now block every asynchronous signal (process.c, mt_mask_threads).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ..conftest import run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

RUNS = 5
FORKS = 200


@pytest.mark.slow
def test_signal_handler_mallocs_across_fork_never_hang(compile_c, tmp_path: Path) -> None:
    prog = compile_c("signal_fork")
    for i in range(RUNS):
        # (--rpc-timeout: the agent's init waited past 20 s on a machine loaded 30-fold.)
        proc = run_memtrace("malloc", "--device", "local", "--quiet", "--window", "60", "--rpc-timeout", "60",
                            "--out", tmp_path / f"c{i}", "--", prog, str(FORKS), timeout=180)
        assert proc.stdout.startswith(f"ok {FORKS} "), (proc.stdout, proc.stderr)
        # Every handler ran on the program's own thread, as natively (never on Frida's).
        assert proc.stdout.split()[3:5] == ["off-main", "0"], proc.stdout
        show = run_memtrace("show", tmp_path / f"c{i}", "--json")
        assert json.loads(show.stdout)["ended"] == "target-exited"


def test_every_handler_allocation_is_counted_with_its_stack(compile_c, tmp_path: Path) -> None:
    prog = compile_c("signal_fork")
    proc = run_memtrace("malloc", "--device", "local", "--json", "--stack-threshold", "0", "--window", "60",
                        "--top", "50", "--out", tmp_path / "c", "--", prog, str(FORKS), timeout=120)
    doc = json.loads(proc.stdout)
    # The target's stdout goes to stderr with --json: "ok FORKS HANDLED ...".
    assert "ok " in proc.stderr, (doc["ended"], doc["reason"], proc.stderr[-4000:])
    handled = int(proc.stderr.split("ok ")[1].split()[1])
    rows = doc["top_stacks"]
    on_timer = [r for r in rows if r["frames"] and r["frames"][0].get("function") == "on_timer"]
    assert all(r["bytes"] == 96 * r["count"] for r in on_timer)
    # A handler that interrupted one of memtrace's own hooks is counted with its stack skipped.
    nested_mallocs = doc["nested"]["bytes"] // 96
    assert sum(r["count"] for r in on_timer) + nested_mallocs == handled
    child_work = [r for r in rows if r["frames"] and r["frames"][0].get("function") == "child_work"]
    assert sum(r["count"] for r in child_work) == FORKS * 200
    assert sum(r["bytes"] for r in child_work) == FORKS * sum(64 + i for i in range(200))
