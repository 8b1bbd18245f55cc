"""The malloc core under AddressSanitizer + UndefinedBehaviorSanitizer and under ThreadSanitizer:
cmodule/'s C as the agent compiles it (layout header generated from memtrace/layout.py), built
natively with the CModule stand-ins in shim/ and driven by harness.c from 8 threads with signals,
thread churn, forks and a concurrent drain, in each of the core's modes.  The harness also checks
the core's own promises (every call counted, nothing left in the live table, the peak never below
what was tracked) and provokes the findings fixed with it (slots_hw past the slot array, a peak
raised while its lock is held, a Darwin bucket lock nobody lets go).  A clean run prints nothing
from a sanitizer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .build import HERE, SANITIZERS, build, compiler, sanitizer_works

pytestmark = [
    pytest.mark.native,
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="the harness stands in for a Linux target"),
]

MODES = ("stacked", "sampled", "events", "logger")
ITERATIONS = "20000"            # per worker thread: ~180,000 hooked calls a run


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """Each sanitizer's harness, or why it cannot be built here."""
    cc = compiler()
    work = tmp_path_factory.mktemp("native")
    out: dict[str, Path | str] = {}
    for name in SANITIZERS:
        if cc is None:
            out[name] = "no C compiler (gcc or clang) on PATH"
            continue
        why = sanitizer_works(cc, name, work)
        out[name] = why if why is not None else build(work, name, cc)
    return out


def sanitizer_env(name: str) -> dict[str, str]:
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    env["TSAN_OPTIONS"] = f"halt_on_error=1:history_size=7:suppressions={HERE / 'tsan.supp'}"
    return env


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sanitizer", list(SANITIZERS))
def test_core_runs_clean_under_sanitizers(harnesses: dict[str, Path | str], sanitizer: str, mode: str) -> None:
    exe = harnesses[sanitizer]
    if isinstance(exe, str):
        pytest.skip(exe)
    proc = subprocess.run([str(exe), mode, ITERATIONS], capture_output=True, text=True, timeout=400,
                          env=sanitizer_env(sanitizer))
    report = proc.stderr[-6000:]
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, report
    assert proc.returncode == 0, report
    # harness <mode>: N calls, N counted, peak P B, 0 failures
    line = proc.stdout.strip().splitlines()[-1]
    words = line.split()
    assert words[:2] == ["harness", f"{mode}:"] and words[-2:] == ["0", "failures"], line
    assert int(words[2]) == int(words[4]) > 8 * int(ITERATIONS), line
