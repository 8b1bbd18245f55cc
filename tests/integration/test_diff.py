"""memtrace diff on two real captures of the demo workload, at scale 1 and scale 2.

demo/workload.c documents every count per scale: going from 1 to 2 adds exactly one more of
each named function's allocations (24 image frames of 90 MB in all, 16 leaked cache entries).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.conftest import run_memtrace

IMAGE_GROSS = 94371840          # 24 frames: 6 x (1 + 2 + 4 + 8) MB
IMAGE_LIVE = 25165824           # 3 frames of 8 MB kept
CACHE_LEAK = 65536              # 16 x 4096


@pytest.fixture(scope="module")
def two_runs(demo_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("diff")
    for scale in ("1", "2"):
        run_memtrace("malloc", "--device", "local", "--window", "30", "--leaks", "--quiet",
                     "--out", root / f"scale{scale}" / "workload-malloc", "--", demo_bin / "workload",
                     "--scale", scale, timeout=180)
    return root / "scale1", root / "scale2"


def leaf(row: dict) -> str | None:
    return row["frames"][0]["function"] if row["frames"] else None


@pytest.mark.slow
def test_diff_names_every_change_largest_first(two_runs: tuple[Path, Path]) -> None:
    a, b = two_runs
    doc = json.loads(run_memtrace("diff", a / "workload-malloc", b / "workload-malloc", "--json", "--top", "50").stdout)
    (pair,) = doc["pairs"]
    assert (pair["target"], pair["tracer"]) == ("workload", "malloc")
    views = pair["views"]
    image = next(r for r in views["gross"]["rows"] if leaf(r) == "image_decode_frame")
    assert image["bytes"] == {"base": IMAGE_GROSS, "new": 2 * IMAGE_GROSS, "delta": IMAGE_GROSS}
    assert image["count"]["delta"] == 24
    live = next(r for r in views["live"]["rows"] if leaf(r) == "image_decode_frame")
    assert live["bytes"]["delta"] == IMAGE_LIVE and live["count"]["delta"] == 3
    assert views["leaked"]["total"] == {"base": CACHE_LEAK, "new": 2 * CACHE_LEAK, "delta": CACHE_LEAK}
    (leak,) = views["leaked"]["rows"]
    assert leaf(leak) == "cache_insert_entry" and leak["count"]["delta"] == 16
    # At the peak the image thread holds 8 MB frames only (its kept ones, and at most one it is about
    # to free); every other thread's blocks together are far smaller than one frame.
    peak = next(r for r in views["peak"]["rows"] if leaf(r) == "image_decode_frame")
    assert peak["bytes"] == {"base": IMAGE_LIVE, "new": 2 * IMAGE_LIVE, "delta": IMAGE_LIVE}
    assert peak["count"]["delta"] == 3
    fam = {f["family"]: f for f in pair["families"]}
    assert fam["image decode"]["bytes"]["delta"] == IMAGE_GROSS
    deltas = [abs(r["bytes"]["delta"]) for r in views["gross"]["rows"]]
    assert deltas == sorted(deltas, reverse=True)


def test_diff_of_two_folders_pairs_by_target_and_shows_signs(two_runs: tuple[Path, Path]) -> None:
    a, b = two_runs
    doc = json.loads(run_memtrace("diff", b, a, "--json").stdout)
    (pair,) = doc["pairs"]
    assert pair["views"]["leaked"]["total"]["delta"] == -CACHE_LEAK
    assert doc["unpaired"] == []
    text = run_memtrace("diff", a, b).stdout
    assert "+90.0 MB" in text and "image_decode_frame" in text and "cache_insert_entry" in text
    text = run_memtrace("diff", b, a).stdout
    assert "−90.0 MB" in text


def test_diff_refuses_captures_of_different_tracers(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    from tests.conftest import ROOT

    a, _ = two_runs
    proc = run_memtrace("diff", a / "workload-malloc", ROOT / "raw-data" / "camera_surfaces-iosurface", check=False)
    assert proc.returncode == 2
    assert "a iosurface capture cannot be compared with" in proc.stderr


def test_a_view_one_side_lacks_is_said_not_counted_from_zero() -> None:
    """memtrace 0.1's capture of the demo against today's: peak, leaks and temporaries exist on one side only."""
    from tests.conftest import ROOT

    old = ROOT / "tests" / "data" / "captures-v1" / "workload-malloc"
    new = ROOT / "raw-data" / "workload-malloc"
    doc = json.loads(run_memtrace("diff", old, new, "--json").stdout)
    (pair,) = doc["pairs"]
    for view in ("peak", "leaked", "temporary"):
        v = pair["views"][view]
        assert "base_missing" in v and "new_missing" not in v and v["rows"] == [], view
    assert pair["views"]["gross"]["rows"], "both sides have the gross view: its stacks are compared"
    text = run_memtrace("diff", old, new).stdout
    assert "leaked: 64.0 KB in new (16); not in base: no leak scan in this capture" in " ".join(text.split())
    assert "(0 B →" not in text
