"""``memtrace iosurface`` on the camera scenarios driving the Darwin stand-in (exact counts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.children import kill_and_reap, wait_exit
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
        "IOSurfaceDecrementUseCount", "IOSurfaceClientCreateChild", "IOSurfaceClientLookup",
        "IOSurfaceClientRetain", "IOSurfaceClientRelease", "IOSurfaceClientGetID", "IOSurfaceClientGetAllocSize",
        "IOSurfaceClientGetWidth", "IOSurfaceClientGetHeight", "IOSurfaceClientGetBytesPerRow",
        "IOSurfaceClientGetPixelFormat", "mtdarwin_surface_name"])
    assert s["released"]["visible"] is False


def test_nested_creates_recorded_once_with_geometry_and_releases_at_zero_references(
        compile_c, demo_bin: Path, tmp_path: Path) -> None:
    """As on a device, IOSurfaceCreate builds its client with IOSurfaceClientCreateChild(NULL): each
    surface is recorded once, from the outermost entry, with its geometry (through the client
    accessors where IOSurfaceCreate was not the entry); children keep their parent; six
    IOSurfaceClientRelease calls destroy four surfaces and exactly those four are released."""
    darwin = Path(__file__).resolve().parents[2] / "demo" / "darwin"
    prog = compile_c("standin_surfaces", "-I", str(darwin), "-L", str(demo_bin), "-lmtdarwin",
                     f"-Wl,-rpath,{demo_bin}")
    s = memtrace_json("iosurface", "--device", "local", "--window", "30", "--out", tmp_path / "c", "--", prog)
    assert s["ended"] == "target-exited" and s["missing"] == []
    parent, child, direct = 8306688, 1048576, 1228800   # round_up(7680 * 1080, 16 KiB); 2048 * 512; 2560 * 480
    assert s["surfaces"] == 6 and s["bytes"] == 2 * parent + 3 * child + direct
    assert s["created_via"] == {"IOSurfaceCreate": 2, "IOSurfaceClientCreateChild": 4}
    assert {r["caller"]: r["count"] for r in s["by_stack"]} == {
        "make_parents": 2, "mtdarwin_surface_create_child": 3, "make_direct": 1}
    rows = [(x["id"], x["width"], x["height"], x["bytes_per_row"], x["format"], x["parent_id"])
            for x in s["surface_list"]]
    assert rows == [(1, 1920, 1080, 7680, "BGRA", None), (2, 1920, 1080, 7680, "BGRA", None),
                    (3, 2048, 512, 2048, "420v", 2), (4, 2048, 512, 2048, "420v", 2),
                    (5, 2048, 512, 2048, "420v", 2), (6, 640, 480, 2560, "BGRA", None)]
    assert s["released"] == {"count": 4, "bytes": parent + 2 * child + direct, "ids": [1, 3, 4, 6],
                             "visible": True, "untracked": 0}
    assert s["held_at_end"]["ids"] == [2, 5]


def test_references_dropped_on_surfaces_from_before_the_window_are_not_releases(
        compile_c, demo_bin: Path, tmp_path: Path) -> None:
    """Attached to a running program whose surface 1 (two client references) was made before the
    window: its two reference drops are 'untracked', never a release; surface 2, made and released
    in the window, is the one release."""
    import os
    import signal
    import subprocess

    from memtrace.capture_loop import CaptureOptions, run_capture
    from memtrace.target import TargetSpec
    from memtrace.ui import SilentUI

    darwin = Path(__file__).resolve().parents[2] / "demo" / "darwin"
    prog = compile_c("standin_surfaces_early", "-I", str(darwin), "-L", str(demo_bin), "-lmtdarwin",
                     f"-Wl,-rpath,{demo_bin}")
    proc = subprocess.Popen([str(prog)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready ")

    class GoWhenCapturing(SilentUI):
        def phase(self, name: str) -> None:
            super().phase(name)
            if name == "capturing":
                os.kill(proc.pid, signal.SIGUSR1)

    try:
        result = run_capture("iosurface", TargetSpec(device="local", pid=proc.pid, launch="none"),
                             CaptureOptions(tracer="iosurface", window=30.0, out=tmp_path / "c"), GoWhenCapturing())
        assert wait_exit(proc, 30) == 0         # (this process is Frida's tracer: see exit_of)
    finally:
        kill_and_reap(proc)
    assert result.ended == "target-exited"
    from memtrace.analyze.iosurface import summarize
    from memtrace.capture import read_records

    s = summarize(read_records(tmp_path / "c")).to_json()
    assert [x["id"] for x in s["surface_list"]] == [2]
    assert s["released"] == {"count": 1, "bytes": 262144, "ids": [2], "visible": True, "untracked": 2}
