"""A running program's environment is its own while memtrace attaches (review of issue 21's gcc
stand-in): the stand-in for gcc (frida_host.gcc_cache_shim) can only reach Frida's compile through
the target's PATH, and changing that needs setenv inside the target -- which, in a program already
running, races its threads' getenv and setenv, and shows them memtrace's PATH meanwhile.  So only
a program held before its own code runs gets the stand-in (FridaHost.program_held); a --pid target
compiles with the gcc of its own PATH and nothing in its environment is written.

The program (tests/programs/env_churn.c) reads PATH in a loop, counting every value that is not
the one it started with, and sets and reads back MT_CHURN in another thread.  Several sessions
attach to it and detach; it lives on, saw PATH change never, read back every MT_CHURN it set, and
its PATH is its own.  Before the fix every attach showed it the stand-in's folder.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from memtrace.capture import RecordType, read_records

from ..conftest import run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

ATTACHES = 4
PATH = "/usr/local/bin:/usr/bin:/bin"


def _seen(target: subprocess.Popen[str]) -> dict[str, str]:
    assert target.stdin is not None and target.stdout is not None
    target.stdin.write("report\n")
    target.stdin.flush()
    return dict(re.findall(r"(\w+)=(\S+)", target.stdout.readline()))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_attaching_to_a_running_program_never_writes_its_environment(compile_c, tmp_path: Path) -> None:
    exe = compile_c("env_churn")
    cache = tmp_path / "cache"
    target = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={"PATH": PATH})
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        before = _seen(target)
        for i in range(ATTACHES):
            out = tmp_path / f"attach{i}"
            proc = run_memtrace("malloc", "--device", "local", "--pid", str(target.pid), "--window", "0.5",
                                "--quiet", "--out", out, env={"MEMTRACE_CACHE_DIR": str(cache)}, timeout=120)
            records = list(read_records(out))
            recon = next(r.body for r in records if r.type == RecordType.RECON)
            # The precompiled core went through gcc inside the target: the path the stand-in served.
            assert recon["info"]["toolchain"] == "external" and recon["info"]["precompiled"] is True, recon
            assert target.poll() is None, (f"attach {i}: the target died ({target.returncode}); its END: "
                                           f"{records[-1].body}; memtrace said: {proc.stderr.strip()}")
        after = _seen(target)
    finally:
        if target.stdin is not None:
            target.stdin.close()
        try:
            target.wait(timeout=10)
        except subprocess.TimeoutExpired:
            target.kill()
            target.wait()
    assert target.returncode == 0
    # The threads kept running through every session, and neither ever saw memtrace's hand.
    assert int(after["path_reads"]) > int(before["path_reads"]) and int(after["churn_sets"]) > int(before["churn_sets"])
    assert after["path_changes"] == "0", after
    assert after["churn_wrong"] == "0", after
    assert after["path"] == PATH
