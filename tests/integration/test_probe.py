"""``memtrace probe`` inside a program that loads the Darwin stand-in: the truth table, byte-exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.conftest import memtrace_json, run_memtrace

P = 16 * 1024 * 1024


def ledger(footprint: int = 0, vol: int = 0, nonvol: int = 0, reusable: int = 0) -> dict[str, int]:
    return {"footprint": footprint, "purgeable_volatile": vol, "purgeable_nonvolatile": nonvol, "reusable": reusable}


def test_truth_table(demo_bin: Path, tmp_path: Path) -> None:
    md = tmp_path / "probe.md"
    s = memtrace_json("probe", "--device", "local", "--window", "10", "--out", tmp_path / "c",
                      "--markdown", md, "--", demo_bin / "scn_sqlite_cache")
    assert s["errors"] == []
    assert s["missing"] == []
    assert s["madvise_entry"] == "mtdarwin_madvise"
    rows = {r["entry"]: r for r in s["rows"]}
    table = [(r["entry"], r["drives_state_machine"], r["state_before"], r["state_after"], r["ledger_delta"])
             for r in s["rows"]]
    assert table == [
        ("mach_vm_allocate(ANYWHERE|PURGABLE)", None, None, 0, ledger(P, 0, P, 0)),
        ("madvise(MADV_DONTNEED=4)", False, 0, 0, ledger()),
        ("madvise(MADV_FREE=5)", False, 0, 0, ledger(reusable=P)),
        ("madvise(MADV_FREE_REUSABLE=7)", False, 0, 0, ledger(reusable=P)),
        ("madvise(MADV_FREE_REUSE=8)", False, 0, 0, ledger(reusable=-P)),
        ("SET_STATE VOLATILE", True, 0, 1, ledger(-P, P, -P)),
        ("SET_STATE NONVOLATILE", True, 1, 0, ledger(P, -P, P)),
        ("SET_STATE EMPTY", True, 0, 2, ledger(-P, 0, -P)),
        ("reacquire (SET_STATE NONVOLATILE)", True, 2, 0, ledger(P, 0, P)),
    ]
    # The kernel writes the old state back: the reacquire reads EMPTY ("stolen").
    assert rows["reacquire (SET_STATE NONVOLATILE)"]["old_state_read_back"] == 2
    assert rows["SET_STATE VOLATILE"]["old_state_read_back"] == 0
    text = md.read_text()
    assert "| `SET_STATE EMPTY` | **yes** | 0 NONVOLATILE → 2 EMPTY | −16,777,216 B | 0 B | −16,777,216 B | 0 B |" in text
    assert "| `madvise(MADV_FREE_REUSABLE=7)` | no | 0 NONVOLATILE → 0 NONVOLATILE | 0 B | 0 B | 0 B | +16,777,216 B |" in text
    # On an 80-column terminal: every line fits, no number is cut, each entry is there whole (folded).
    out = run_memtrace("show", tmp_path / "c", env={"COLUMNS": "80"}).stdout
    assert all(len(x) <= 80 for x in out.splitlines()), out
    header = next(x for x in out.splitlines() if x.split()[:1] == ["entry"])
    assert header.split() == ["entry", "drives?", "state", "footprint", "volatile", "nonvol", "reusable"]
    volatile = next(x for x in out.splitlines() if x.split()[:1] == ["SET_STATE"])     # SET_STATE VOLATILE
    assert volatile.split()[1:] == ["yes", "NONVOL", "→", "VOL", "−16.0", "MB", "+16.0", "MB", "−16.0", "MB", "±0", "B"]
    lines = out.splitlines()
    first = lines.index(header) + 1
    entry_column = "".join(x[:header.index("drives?")].strip() for x in lines[first:first + 40])
    assert "madvise(MADV_FREE_REUSABLE=7)madvise(MADV_FREE_REUSE=8)" in entry_column


@pytest.mark.slow
def test_without_standin_reports_missing_and_error(demo_bin: Path, tmp_path: Path) -> None:
    proc = run_memtrace("probe", "--device", "local", "--window", "10", "--out", tmp_path / "c", "--json",
                        "--", demo_bin / "workload", check=False)
    # A probe that cannot run is a failure: exit 1, the reason on stderr, the JSON still on stdout.
    assert proc.returncode == 1
    assert "probe could not run: the target has no mach_vm_allocate" in proc.stderr
    s = json.loads(proc.stdout)
    assert s["rows"] == []
    assert sorted(s["missing"]) == sorted(["mach_vm_allocate", "mach_vm_purgable_control", "mach_vm_deallocate",
                                           "mach_task_self_", "task_info", "mtdarwin_madvise"])
    assert len(s["errors"]) == 1 and "libmtdarwin" in s["errors"][0]


def test_markdown_file_is_not_overwritten(demo_bin: Path, tmp_path: Path) -> None:
    md = tmp_path / "exists.md"
    md.write_text("keep")
    proc = run_memtrace("probe", "--device", "local", "--out", tmp_path / "c", "--markdown", md,
                        "--", demo_bin / "scn_sqlite_cache", check=False)
    assert proc.returncode != 0
    assert "already exists" in proc.stderr
    assert md.read_text() == "keep"
