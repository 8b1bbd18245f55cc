"""What a session leaves in a --pid target that lives on (a lab's daemon attached again and again):
the fork page every session maps (MAP_SHARED, 64 KiB: process.c's mt_forks, where fork children
post) keeps no memory once its agent has unloaded -- it held ~20 KiB resident per session, the
most of memtrace's residue per attach."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ..conftest import run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

FORK_PAGE_KB = 64


def _shared_anonymous(pid: int) -> list[tuple[int, int]]:
    """(size, resident) in KiB of every shared anonymous mapping of `pid` ("/dev/zero (deleted)",
    rw-s): the fork pages, the program itself maps none."""
    out: list[tuple[int, int]] = []
    size = None       # the current mapping's size once it is one of them, -1 until Size: is read
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+$", fields[0]):
                size = -1 if fields[1] == "rw-s" and " ".join(fields[5:]) == "/dev/zero (deleted)" else None
            elif size is not None and fields[0] == "Size:":
                size = int(fields[1])
            elif size is not None and size >= 0 and fields[0] == "Rss:":
                out.append((size, int(fields[1])))
                size = None
    return out


@pytest.mark.slow
def test_each_sessions_fork_page_gives_its_memory_back(compile_c: Callable[..., Path], tmp_path: Path) -> None:
    exe = compile_c("steady")
    target = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().startswith("ready")
        for i in range(2):
            proc = run_memtrace("malloc", "--device", "local", "--pid", str(target.pid), "--window", "0.5",
                                "--quiet", "--out", tmp_path / f"c{i}")
            assert proc.returncode == 0, proc.stderr
        assert target.poll() is None, "the target died"
        pages = _shared_anonymous(target.pid)
    finally:
        target.kill()
        target.wait()
    # One fork page per session, still mapped (a vfork child may post once more), none resident.
    assert pages == [(FORK_PAGE_KB, 0), (FORK_PAGE_KB, 0)], pages
