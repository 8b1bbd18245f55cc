"""The live panel: what it waits for at the start, and for malloc the footprint and the allocator's
in-use beside tracked live, and the stacks whose live bytes grow fastest."""

from __future__ import annotations

import io

from rich.console import Console

from memtrace.tracers.malloc import MallocStats
from memtrace.ui import Progress, RichUI

MB = 1 << 20


def body(t: int, tracked: int, top: list[list[int]]) -> dict:
    return {"counters": [0] * 64, "tracked": {"bytes": tracked, "blocks": 3}, "peak": {"bytes": tracked, "epoch": 1},
            "sample": {"t": t, "tracked_bytes": tracked, "tracked_blocks": 3, "peak_bytes": tracked,
                       "in_use": tracked + 2 * MB, "footprint": tracked + 40 * MB, "top": top}}


def test_malloc_rows_show_footprint_in_use_and_the_fastest_growing_stacks() -> None:
    stats = MallocStats()
    stats.label = {1: "decode_tile ← worker", 2: "cache_put ← main", 3: "steady ← main"}.get  # type: ignore[assignment]
    stats.batch(body(1000, 10 * MB, [[1, 4 * MB], [2, 1 * MB], [3, 5 * MB]]))
    stats.batch(body(2000, 20 * MB, [[1, 12 * MB], [2, 3 * MB], [3, 5 * MB]]))
    rows = dict(stats.rows())
    assert rows["tracked live / peak"] == "20.0 MB / 20.0 MB"
    assert rows["allocator in use / footprint"] == "22.0 MB / 60.0 MB"
    assert rows["growing fastest"] == "+8.0 MB/s (12.0 MB live) decode_tile ← worker"
    assert ("", "+2.0 MB/s (3.0 MB live) cache_put ← main") in stats.rows()
    assert not any("steady" in v for _, v in stats.rows())          # not growing: not listed
    assert stats.growing(1) == [(1, 8 * MB, 12 * MB)]


def test_the_panel_says_what_it_is_waiting_for() -> None:
    out = io.StringIO()
    ui = RichUI(Console(file=out, force_terminal=True, width=120))
    ui.phase("loading agent")
    assert "building the agent…" in _text(ui)
    ui.phase("waiting")
    assert "waiting for the target…" in _text(ui)
    ui.progress(Progress(elapsed=1.0, window=10.0, activity_per_s=5.0, bytes_per_s=0.0, dropped=0,
                         rows=[("allocator in use / footprint", "22.0 MB / 60.0 MB")]))
    ui.phase("capturing")
    text = _text(ui)
    assert "capturing" in text and "allocator in use / footprint" in text
    ui.close()


def _text(ui: RichUI) -> str:
    buf = io.StringIO()
    Console(file=buf, width=120).print(ui._render())
    return buf.getvalue()
