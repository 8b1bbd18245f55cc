"""``memtrace iosurface`` on the camera scenarios driving the Darwin stand-in (exact counts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import frame_names, memtrace_json

FRAME_1080 = 2080768        # round_up(1920 * 1080, 16384)
FRAME_4K = 33177600         # 15360 * 2160


@pytest.mark.slow
def test_camera_pool(demo_bin: Path, tmp_path: Path) -> None:
    s = memtrace_json("iosurface", "--device", "local", "--window", "30", "--out", tmp_path / "c",
                      "--", demo_bin / "scn_camera")
    assert s["ended"] == "target-exited"
    assert s["missing"] == []
    assert s["surfaces"] == 12
    assert s["bytes"] == 8 * FRAME_1080 + 4 * FRAME_4K == 149356544
    # Every surface from one function; two call sites (1080p and 4K loops) -> two stacks.
    assert {r["caller"] for r in s["by_stack"]} == {"camera_pool_create_surface"}
    assert sorted((r["count"], r["bytes"]) for r in s["by_stack"]) == [(4, 4 * FRAME_4K), (8, 8 * FRAME_1080)]
    assert all(frame_names(r["frames"])[1] == "main (scn_camera)" for r in s["by_stack"])
    assert s["by_format"] == [
        {"format": "BGRA", "count": 4, "bytes": 132710400, "sizes": [[3840, 2160, 15360, FRAME_4K]]},
        {"format": "420v", "count": 8, "bytes": 16646144, "sizes": [[1920, 1080, 1920, FRAME_1080]]},
    ]
    assert [x["id"] for x in s["surface_list"]] == list(range(1, 13))
    assert {x["name"] for x in s["surface_list"]} == {"CameraPool.1080p", "CameraPool.4K"}
    assert s["released"] == {"count": 5, "bytes": 41500672, "ids": [1, 2, 7, 8, 12], "visible": True,
                             "untracked": 0}
    assert s["held_at_end"]["count"] == 7
    assert s["held_at_end"]["bytes"] == 107855872
    assert s["held_at_end"]["ids"] == [3, 4, 5, 6, 9, 10, 11]
    assert s["use_count_calls"] == {"increment": 12, "decrement": 12}


def test_camera_surfaces_workload(demo_bin: Path, tmp_path: Path) -> None:
    s = memtrace_json("iosurface", "--device", "local", "--window", "30", "--out", tmp_path / "c",
                      "--", demo_bin / "camera_surfaces")
    assert s["surfaces"] == 8
    assert s["bytes"] == 6 * 933888 + 2 * 8306688 == 22216704
    assert {r["caller"] for r in s["by_stack"]} == {"camera_session_configure"}
    assert {f["format"]: (f["count"], f["bytes"]) for f in s["by_format"]} == {
        "420v": (6, 6 * 933888), "BGRA": (2, 2 * 8306688)}
    assert s["released"]["count"] == 0
    assert s["held_at_end"]["count"] == 8


def test_plain_glibc_program_lists_iosurface_missing(demo_bin: Path, tmp_path: Path) -> None:
    s = memtrace_json("iosurface", "--device", "local", "--window", "30", "--out", tmp_path / "c",
                      "--", demo_bin / "workload")
    assert s["surfaces"] == 0
    assert sorted(s["missing"]) == sorted([
        "IOSurfaceCreate", "IOSurfaceGetAllocSize", "IOSurfaceGetWidth", "IOSurfaceGetHeight",
        "IOSurfaceGetBytesPerRow", "IOSurfaceGetPixelFormat", "IOSurfaceGetID", "IOSurfaceIncrementUseCount",
        "IOSurfaceDecrementUseCount", "IOSurfaceClientCreateChild", "IOSurfaceClientRelease",
        "IOSurfaceClientGetID", "IOSurfaceClientGetAllocSize", "mtdarwin_surface_name"])
    assert s["released"]["visible"] is False


def test_child_surfaces_and_releases_by_id(compile_c, demo_bin: Path, tmp_path: Path) -> None:
    """Child surfaces made through IOSurfaceClientCreateChild without IOSurfaceCreate are traced, and
    releases are seen at IOSurfaceClientRelease, matched by IOSurface ID, whichever path made them."""
    darwin = Path(__file__).resolve().parents[2] / "demo" / "darwin"
    prog = compile_c("standin_surfaces", "-I", str(darwin), "-L", str(demo_bin), "-lmtdarwin",
                     f"-Wl,-rpath,{demo_bin}")
    s = memtrace_json("iosurface", "--device", "local", "--window", "30", "--out", tmp_path / "c", "--", prog)
    assert s["ended"] == "target-exited" and s["missing"] == []
    parent, child = 8306688, 1048576       # round_up(7680 * 1080, 16384); round_up(2048 * 512, 16384)
    assert s["surfaces"] == 5 and s["bytes"] == 2 * parent + 3 * child
    assert s["created_via"] == {"IOSurfaceCreate": 2, "IOSurfaceClientCreateChild": 3}
    assert {r["caller"]: r["count"] for r in s["by_stack"]} == {"make_parents": 2, "mtdarwin_surface_create_child": 3}
    assert s["released"] == {"count": 3, "bytes": parent + 2 * child, "ids": [1, 3, 4], "visible": True,
                             "untracked": 0}
    assert s["held_at_end"]["ids"] == [2, 5]
