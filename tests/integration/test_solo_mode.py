"""Solo mode (cmodule/core.c): while one of the target's threads has a slot, the tracked path's
read-modify-writes on shared state go without the lock prefix; a second thread ends it for good,
with membarrier(2) and a wait, before its first tracked call.  A real program that allocates alone,
then from four threads at once: every count, every live block by its function, nothing unmatched,
and solo mode started and ended once each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import read_records

from ..conftest import memtrace_json  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


@pytest.mark.timeout(300)
def test_solo_mode_ends_when_a_second_thread_comes_and_nothing_is_lost(compile_c, tmp_path: Path) -> None:
    exe = compile_c("solo_threads", "-pthread")
    for run in range(3):
        out = tmp_path / f"cap{run}"
        s = memtrace_json("malloc", "--device", "local", "--top", "100", "--out", out, "--", exe, timeout=240)
        summary = summarize(read_records(out))
        assert summary.counter("solo_started") == 1 and summary.counter("solo_ended") == 1
        # Nothing dropped, no live-table way lost to a race: every free found its block.
        assert all(v == 0 for v in s["dropped"].values()), s["dropped"]

        def rows(fn: str, s: dict = s) -> list[tuple[int, int]]:
            return sorted((r["count"], r["bytes"]) for r in s["top_stacks"] if r["frames"]
                          and r["frames"][0]["function"] == fn)

        assert rows("main_alone") == [(20000, 20000 * 48)]
        assert rows("main_churn") == [(50000, 50000 * 64)]
        assert rows("thread_churn") == [(3000, 3000 * 96), (150000, 150000 * 80)]
        live = {x["frames"][0]["function"]: (x["count"], x["bytes"]) for x in s["live_by_stack"] if x["frames"]}
        assert live["main_alone"] == (10000, 10000 * 48)
        assert live["thread_churn"] == (3000, 3000 * 96)
        assert "main_churn" not in live
