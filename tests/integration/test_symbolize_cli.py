"""memtrace symbolize end to end: a real capture of a stripped program, then its separate debug
file given with --symbols; and the one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memtrace.capture import RecordType, read_records

from ..conftest import PROGRAMS, run_memtrace  # noqa: TID252
from .test_symbols import build_id

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

PATTERN = PROGRAMS / "pattern.c"


def source_line(text: str) -> int:
    (n,) = [i for i, line in enumerate(PATTERN.read_text().splitlines(), 1) if text in line]
    return n


def rows_of(cap: Path) -> dict[str, list]:
    rows: dict[str, list] = {}
    for rec in read_records(cap):
        if rec.type == RecordType.SYMBOLS:
            rows.update({r[0]: r for r in rec.body["rows"]})
    return rows


def non_symbol_records(cap: Path) -> list[tuple[RecordType, object, bytes]]:
    return [(r.type, r.body, r.data) for r in read_records(cap) if r.type != RecordType.SYMBOLS]


@pytest.mark.slow
def test_capture_of_a_stripped_program_gains_file_and_line(compile_c, tmp_path: Path) -> None:
    exe = compile_c("pattern")                 # -g -rdynamic: .dynsym keeps the function names
    bid = build_id(exe)
    tree = tmp_path / "syms" / ".build-id" / bid[:2]
    tree.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(exe), str(tree / f"{bid[2:]}.debug")], check=True)
    stripped = tmp_path / "bin" / "pattern"
    stripped.parent.mkdir()
    shutil.copy(exe, stripped)
    subprocess.run(["strip", "--strip-all", str(stripped)], check=True)

    cap = tmp_path / "cap"
    run_memtrace("malloc", "--device", "local", "--window", "30", "--stack-threshold", "4096",
                 "--out", cap, "--", stripped)
    before = rows_of(cap)
    (batch,) = [r for r in before.values() if r[3] == "alloc_4k_batch"]
    assert batch[1:2] == ["pattern"] and batch[4:6] == [None, None]
    kept = non_symbol_records(cap)

    proc = run_memtrace("symbolize", cap, "--symbols", tmp_path / "syms")
    assert f"{tree / (bid[2:] + '.debug')} (build-id)" in proc.stdout
    after = rows_of(cap)
    assert after.keys() == before.keys()
    row = after[batch[0]]
    assert row[:4] == batch[:4]
    assert row[4:6] == [str(PATTERN), source_line("sink[i] = malloc(4096)")]
    mains = [r for r in after.values() if r[3] == "main"]
    assert mains and all(r[4] == str(PATTERN) and r[5] is not None for r in mains)
    assert non_symbol_records(cap) == kept     # every other record exactly as it was

    # Again, as JSON: the same table (each address once), the same counts.
    doc = json.loads(run_memtrace("symbolize", cap, "--symbols", tmp_path / "syms", "--json").stdout)
    assert rows_of(cap) == after
    assert doc["addresses"] == len(after) and doc["unresolved"] == 0
    assert doc["with_lines"] == sum(1 for r in after.values() if r[4] and r[5])
    image = next(i for i in doc["images"] if i["module"] == "pattern")
    assert (image["how"], image["id"]) == ("build-id", bid)


@pytest.mark.parametrize(("args", "needle"), [
    (["symbolize", "/nonexistent/cap"], "/nonexistent/cap: no such capture"),
    (["symbolize", str(PATTERN)], f"{PATTERN}: not a memtrace capture (bad magic)"),
    (["symbolize", str(PATTERN.parent), "--symbols", "/nonexistent/syms"], "--symbols /nonexistent/syms: no such"),
])
def test_bad_input_is_one_clear_line(args: list[str], needle: str) -> None:
    proc = run_memtrace(*args, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
