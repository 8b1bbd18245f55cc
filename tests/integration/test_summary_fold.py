"""The summary a tracer command prints is folded while the capture is written (memtrace.fold):
it must be the summary a read of the finished capture makes -- its JSON and its console text
byte for byte -- on real captures: grouped drains of many stacks, a target killed by a signal in
the middle of its window, CPython's own allocations with their symbols."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from memtrace import tracers
from memtrace.capture import RecordType, read_records
from memtrace.capture_loop import CaptureOptions, run_capture
from memtrace.target import TargetSpec
from memtrace.ui import SilentUI

from ..conftest import run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

MALLOC = tracers.get("malloc")


def _console(summary: Any, capture: Path) -> str:
    out = io.StringIO()
    assert MALLOC is not None
    opts = {"capture": str(capture), "top": 10, MALLOC.json_top_option: 10, "quiet": False, "sort": None}
    MALLOC.console(Console(file=out, width=120, force_terminal=False, color_system=None), summary, opts)
    return out.getvalue()


def _folded_and_read(argv: list[str], out: Path, **env: str) -> tuple[Any, Any, Path]:
    assert MALLOC is not None
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)          # the program's environment (Frida's spawn passes the host's on)
    try:
        result = run_capture(MALLOC, TargetSpec(device="local", argv=argv),
                             CaptureOptions(tracer="malloc", out=out, window=120), SilentUI(),
                             summarize=MALLOC.summarize)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert result.summary is not None, "the summary was not folded"
    return result.summary, MALLOC.summarize(read_records(result.path)), result.path


def _same(folded: Any, read: Any, capture: Path) -> None:
    assert json.dumps(folded.to_json(capture=str(capture), top=20)) == \
        json.dumps(read.to_json(capture=str(capture), top=20))
    assert _console(folded, capture) == _console(read, capture)


@pytest.mark.slow
def test_folded_summary_is_the_read_one_over_groups_of_many_stacks(compile_c, tmp_path: Path) -> None:
    # 2^12 stacks in one burst, then churn long enough for several GROUP records (GROUP_S: 2 s).
    folded, read, capture = _folded_and_read([str(compile_c("many_stacks")), "paths", "12"], tmp_path / "stacks")
    _same(folded, read, capture)
    assert folded.counters and sum(folded.counters) >= 4096
    folded, read, capture = _folded_and_read([str(compile_c("churn")), "4.5", "", "20"], tmp_path / "churn")
    _same(folded, read, capture)
    groups = [r for r in read_records(capture) if r.type == RecordType.BATCH]
    assert len({r.offset for r in groups}) < len(groups), "no grouped drains: the test tests too little"


@pytest.mark.slow
def test_folded_summary_of_a_target_killed_mid_window(compile_c, tmp_path: Path) -> None:
    folded, read, capture = _folded_and_read([str(compile_c("crasher")), "1.5"], tmp_path / "c")
    _same(folded, read, capture)
    assert "crashed with SIGSEGV" in folded.end["reason"]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="no /usr/bin/python3 (Debian's CPython)")
def test_folded_summary_of_cpython(tmp_path: Path) -> None:
    code = ("import json, re, zlib\n"
            "d = [{'k': i, 's': str(i) * 3} for i in range(20000)]\n"
            "t = json.dumps(d)\n"
            "assert json.loads(zlib.decompress(zlib.compress(t.encode())).decode()) == d\n"
            "print(len(re.findall(r'\\d+', t)))\n")
    folded, read, capture = _folded_and_read(["/usr/bin/python3", "-c", code], tmp_path / "py",
                                             PYTHONMALLOC="malloc")
    _same(folded, read, capture)
    assert sum(s.count for s in read.stack_stats.values()) > 50_000


@pytest.mark.slow
def test_cli_prints_what_show_prints(compile_c, tmp_path: Path) -> None:
    # The command's own output (folded) against `memtrace show` of its capture (read back).
    for args in (["--json"], []):
        out = tmp_path / f"c{len(args)}"
        traced = run_memtrace("malloc", "--device", "local", *args, "--out", out, "--",
                              compile_c("many_stacks"), "paths", "10")
        shown = run_memtrace("show", *args, out)
        if args:
            t, s = json.loads(traced.stdout), json.loads(shown.stdout)
            s.pop("processes", None)
            assert t == s
        else:
            assert traced.stdout.endswith(shown.stdout)
