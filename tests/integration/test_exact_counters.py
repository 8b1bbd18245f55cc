"""No 64-bit figure passes through a JavaScript Number (issue 20, item 8).

A Number holds integers exactly only up to 2^53; past it the agent sends a value as its decimal
string and the host makes it an int.  Proved on a real process, the real agent and core, with
figures past 2^53: tests/programs/huge_zone.c logs blocks of 2^52 + n bytes to malloc_logger as
libmalloc does for a program's own zone (the stand-in libmtmalloc), so the gross bytes, the
tracked bytes, the peak and the top stacks' live bytes are all odd numbers past 2^53, which no
double holds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import RecordType, read_records
from memtrace.capture_loop import CaptureOptions, run_capture
from memtrace.exact import exact_batch_ints
from memtrace.target import TargetSpec
from memtrace.ui import SilentUI

from ..conftest import ROOT, memtrace_json  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

BASE = 1 << 52
SIZES = (BASE + 2, BASE + 3, BASE + 4)
ALL_THREE = sum(SIZES)                      # 3 * 2^52 + 9: live while the program sleeps, the peak
LAST_TWO = SIZES[1] + SIZES[2]              # 2^53 + 7: still live at the end


def test_the_figures_past_2_53_are_not_representable_as_doubles() -> None:
    # The test below proves something only if a double would have changed these values.
    for v in (ALL_THREE, LAST_TWO):
        assert v > 2 ** 53 and int(float(v)) != v


def test_exact_batch_ints_makes_every_64_bit_string_an_int() -> None:
    payload = {"counters": [1, str(ALL_THREE)], "lost": "0", "live": 2, "stacks": 3,
               "tracked": {"bytes": str(LAST_TWO), "blocks": 2}, "peak": {"bytes": str(ALL_THREE), "epoch": 4, "t": 5},
               "sample": {"t": 1, "tracked_bytes": str(LAST_TWO), "tracked_blocks": 2, "peak_bytes": str(ALL_THREE),
                          "in_use": None, "footprint": "4096", "top": [[7, str(LAST_TWO)]]}, "mode": "aggregate"}
    exact_batch_ints(payload)
    assert payload["counters"] == [1, ALL_THREE] and payload["lost"] == 0
    assert payload["tracked"] == {"bytes": LAST_TWO, "blocks": 2}
    assert payload["peak"] == {"bytes": ALL_THREE, "epoch": 4, "t": 5}
    assert payload["sample"]["top"] == [[7, LAST_TWO]] and payload["sample"]["footprint"] == 4096
    assert payload["mode"] == "aggregate"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("toolchain", ["external", "internal"])
def test_figures_past_2_53_are_exact_from_core_to_report(compile_c, demo_bin: Path, tmp_path: Path,
                                                         toolchain: str) -> None:
    # -fPIC: malloc_logger is read through the GOT, as libmalloc's own code does (a copy relocation
    # would give the program a copy of its own, one the agent never sets).
    prog = compile_c("huge_zone", "-fPIC", "-I", str(ROOT / "demo" / "darwin"), "-L", str(demo_bin), "-lmtmalloc",
                     "-lmtdarwin", f"-Wl,-rpath,{demo_bin}")
    out = tmp_path / "c"
    result = run_capture("malloc", TargetSpec(device="local", argv=[str(prog)]),
                         CaptureOptions(tracer="malloc", window=30, out=out,
                                        agent_config={"backend": "logger", "toolchain": toolchain,
                                                      "liveThreshold": 0, "stackThreshold": 0}),
                         SilentUI(passthrough=False))
    assert result.ended == "target-exited"
    records = list(read_records(out))
    batches = [r.body for r in records if r.type == RecordType.BATCH]

    # The periodic drains while all three blocks were live: the tracked bytes, the peak and the
    # timeline sample's top stack, exactly (a Number would have made them 3 * 2^52 + 8).
    during = [b for b in batches if b.get("tracked", {}).get("bytes") == ALL_THREE]
    assert during, [b.get("tracked") for b in batches]
    assert all(b["tracked"]["blocks"] == 3 and b["peak"]["bytes"] == ALL_THREE for b in during)
    sampled = [b["sample"] for b in during if "sample" in b]
    assert sampled and all(s["tracked_bytes"] == ALL_THREE and s["peak_bytes"] == ALL_THREE for s in sampled)
    assert all(s["top"][0][1] == ALL_THREE for s in sampled)
    # The last drain: two blocks still live, 2^53 + 7 bytes.
    last = batches[-1]
    assert (last["tracked"]["bytes"], last["tracked"]["blocks"], last["peak"]["bytes"]) == (LAST_TWO, 2, ALL_THREE)
    assert all(type(v) is int for b in batches for v in b["counters"])

    # The analysis and the CLI read the same exact figures.
    s = summarize(records).to_json()
    assert s["calls"]["malloc"] == 3 and s["gross_bytes"] == ALL_THREE
    assert (s["live"]["count"], s["live"]["bytes"]) == (2, LAST_TWO)
    assert (s["peak"]["bytes"], s["peak"]["count"]) == (ALL_THREE, 3)
    shown = memtrace_json("show", out)
    assert shown["gross_bytes"] == ALL_THREE and shown["live"]["bytes"] == LAST_TWO
    assert shown["peak"]["bytes"] == ALL_THREE
    (row,) = [r for r in shown["top_stacks"] if r["exact_bytes"] == ALL_THREE]
    assert row["count"] == 3 and "huge_reserve" in [f["function"] for f in row["frames"]]
