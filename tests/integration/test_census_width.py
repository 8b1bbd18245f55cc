"""``memtrace census`` at 80 columns: every line fits, the most useful columns stay, the rest are named."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from tests.conftest import run_memtrace

from memtrace.commands.census import fit_columns

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="local census")


@pytest.fixture
def twelve_sleepers() -> Iterator[None]:
    """At least ten processes to list, however bare the machine (a CI container may run only a handful)."""
    procs = [subprocess.Popen(["sleep", "120"]) for _ in range(12)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.usefixtures("twelve_sleepers")
def test_census_fits_80_columns() -> None:
    out = run_memtrace("census", "--device", "local", "--top", "10", env={"COLUMNS": "80"}).stdout
    lines = out.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), max(lines, key=len)
    header = next(line for line in lines if "process" in line and "footprint" in line)
    assert header.split()[:3] == ["pid", "process", "footprint"]
    assert any(line.startswith("(not shown at 80 columns: ") for line in lines)
    # Each data row is one line: a pid first, then the process name whole.
    rows = [line for line in lines if line.strip()[:1].isdigit()]
    assert len(rows) == 10 and all(line.split()[0].isdigit() for line in rows)


def test_wide_terminal_shows_every_column() -> None:
    out = run_memtrace("census", "--device", "local", "--top", "5", env={"COLUMNS": "200"}).stdout
    header = next(line for line in out.splitlines() if "process" in line and "footprint" in line)
    assert header.split() == ["pid", "process", "footprint", "max", "band", "limit", "status", "pss", "swap",
                              "lazyfree"]
    assert "(not shown at" not in out


def test_fit_columns_keeps_order_and_drops_from_the_end() -> None:
    rows = [{"pid": 123456, "name": "a-very-long-process-name-indeed", "footprint": 1 << 30, "lifetime_max": 1 << 31,
             "band": "FOREGROUND", "priority": 10, "limit": 1 << 31, "status": "ok"}]
    cols, dropped = fit_columns("darwin", rows, 60)
    assert [c[0] for c in cols][:3] == ["pid", "name", "footprint"]
    kept = [c[1] for c in cols]
    assert kept + dropped == ["pid", "process", "footprint", "max", "band", "limit", "status", "purg vol",
                              "purg nonvol", "reusable", "graphics"]
    assert dropped
