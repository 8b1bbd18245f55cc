"""The flame graph's tree (memtrace.views.flame): merged by function, small nodes folded with exact
totals, names written once; and on a large synthetic capture, the same totals as the profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memtrace.frames import Frame
from memtrace.report.synthetic import write_large_capture
from memtrace.reporters.html import flame_data, flamegraph_page
from memtrace.views import load
from memtrace.views.flame import NODE_FIELDS, OTHER, Strings, flame_view
from memtrace.views.profile import Sample, profile


def rows(nodes: list[int], names: Strings, wheres: Strings) -> list[tuple[Any, ...]]:
    return [(nodes[i], names.items[nodes[i + 1]], wheres.items[nodes[i + 2]], *nodes[i + 3:i + 6])
            for i in range(0, len(nodes), NODE_FIELDS)]


def frame(fn: str, line: int) -> Frame:
    return Frame(0x1000 + line, "app", line, fn, "/src/app.c", line)


def test_one_box_per_function_with_every_line_in_the_tooltip() -> None:
    main = frame("main", 1)
    samples = [Sample([frame("grow", line), main], 100 * line, line) for line in (10, 11, 12, 13)]
    names, wheres = Strings(), Strings()
    out = rows(flame_view(samples, names, wheres, min_fraction=0), names, wheres)
    assert out == [(-1, "all", "", 4600, 46, 0), (0, "main (app)", "app.c:1", 4600, 46, 0),
                   (1, "grow (app)", "app.c:10, app.c:11, app.c:12, app.c:13", 4600, 46, 0)]
    # Split by line: four boxes, largest first.
    out = rows(flame_view(samples, names, wheres, by_line=True, min_fraction=0), names, wheres)
    assert [(r[1], r[2], r[3]) for r in out[2:]] == [("grow (app)", "app.c:13", 1300), ("grow (app)", "app.c:12", 1200),
                                                     ("grow (app)", "app.c:11", 1100), ("grow (app)", "app.c:10", 1000)]


def test_small_callees_fold_into_one_other_node_with_exact_totals() -> None:
    main = frame("main", 1)
    big = Sample([frame("big", 2), main], 1_000_000, 1)
    small = [Sample([frame(f"tiny_{i}", 100 + i), main], 7 + i, 2) for i in range(50)]
    names, wheres = Strings(), Strings()
    out = rows(flame_view([big, *small], names, wheres, min_fraction=0.001), names, wheres)
    total = 1_000_000 + sum(7 + i for i in range(50))
    assert out[0] == (-1, "all", "", total, 101, 0)
    assert out[2] == (1, "big (app)", "app.c:2", 1_000_000, 1, 0)
    assert out[3] == (1, OTHER, "", sum(7 + i for i in range(50)), 100, 50)
    assert len(out) == 4 and not any(n.startswith("tiny_") for n in names.items)
    # A lone small callee is kept as itself: nothing would be gained by calling it "other".
    names, wheres = Strings(), Strings()
    out = rows(flame_view([big, small[0]], names, wheres, min_fraction=0.001), names, wheres)
    assert len(out) == 4 and out[3][5] == 0


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    path = tmp_path_factory.mktemp("large") / "capture.mtc"
    return path, write_large_capture(path, stacks=4096, samples=8)


def test_large_capture_trees_keep_the_profiles_totals(large: tuple[Path, dict[str, int]]) -> None:
    path, truth = large
    loaded = load(path)
    data = flame_data(loaded)
    for view in ("gross", "live", "peak"):
        p = profile(loaded, view)
        nodes = data["views"][view]["nodes"]
        assert (nodes[3], nodes[4]) == (p.total_bytes, p.total_count), view
    assert data["views"]["gross"]["nodes"][3] == truth["bytes"]
    assert data["views"]["live"]["nodes"][3] == truth["live_bytes"]
    assert data["views"]["peak"]["nodes"][3] == truth["peak_bytes"]
    # Every name and location once: the tables have no duplicates, and far fewer rows than stacks.
    assert len(set(data["names"])) == len(data["names"]) and len(set(data["wheres"])) == len(data["wheres"])
    unfolded = flame_data(loaded, min_fraction=0)["views"]["gross"]["nodes"]
    assert unfolded[3] == truth["bytes"] and len(data["views"]["gross"]["nodes"]) < len(unfolded) // 4
    # The timeline carries its largest stacks for the time-range view, and the peak.
    tl = data["timeline"]
    assert tl["peak"]["bytes"] == truth["peak_bytes"] and len(tl["stacks"]) == 16
    assert all(len(st["live"]) == len(tl["t"]) for st in tl["stacks"])


def test_large_page_is_small(large: tuple[Path, dict[str, int]]) -> None:
    page = flamegraph_page(load(large[0]))
    assert len(page.encode()) < 1 << 20
    assert "std::vector&lt;" not in page          # names only in the JSON data, never as markup
