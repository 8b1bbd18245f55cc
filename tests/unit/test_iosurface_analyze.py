"""The IOSurface analyzer on synthetic captures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import frame_names

from memtrace.analyze.iosurface import LIST_ROWS, _ids, summarize
from memtrace.capture import CaptureWriter, RecordType, read_records


def surface(n: int, size: int, fmt: str, frames: list[str]) -> dict[str, Any]:
    return {"type": "surface", "surface": hex(0x9000 + n), "id": n, "alloc_size": size, "width": 10, "height": 10,
            "bytes_per_row": 64, "format": fmt, "name": None, "frames": frames}


def write(p: Path, events: list[dict[str, Any]], release_hook: str | None) -> Path:
    with CaptureWriter(p) as w:
        w.write(RecordType.RECON, {"symbols": [], "info": {"release_hook": release_hook}})
        w.write(RecordType.EVENTS, {"events": events})
        w.write(RecordType.SYMBOLS, {"rows": [["0x10", "app", 16, "pool_create"]]})
    return p


def test_held_released_and_untracked(tmp_path: Path) -> None:
    events = [surface(1, 100, "BGRA", ["0x10"]), surface(2, 200, "BGRA", ["0x10"]), surface(3, 50, "420v", []),
              {"type": "use", "op": "inc", "surface": hex(0x9001)},
              {"type": "release", "surface": hex(0x9002)}, {"type": "release", "surface": "0xdead"}]
    s = summarize(read_records(write(tmp_path / "c.mtc", events, "mtdarwin_surface_destroy"))).to_json()
    assert (s["surfaces"], s["bytes"]) == (3, 350)
    assert {**s["by_stack"][0], "frames": frame_names(s["by_stack"][0]["frames"])} == {
        "bytes": 300, "count": 2, "caller": "pool_create", "frames": ["pool_create (app)"]}
    assert s["released"] == {"count": 1, "bytes": 200, "ids": [2], "visible": True, "untracked": 1}
    assert (s["held_at_end"]["count"], s["held_at_end"]["bytes"], s["held_at_end"]["ids"]) == (2, 150, [1, 3])
    assert s["use_count_calls"] == {"increment": 1, "decrement": 0}


def test_no_destruction_entry_is_said_honestly(tmp_path: Path) -> None:
    s = summarize(read_records(write(tmp_path / "c.mtc", [surface(1, 100, "BGRA", [])], None))).to_json()
    assert s["released"]["visible"] is False
    assert "still referenced by the app as far as we saw" in s["held_at_end"]["meaning"]


def test_releases_by_id_whichever_path_created_the_surface(tmp_path: Path) -> None:
    child = {"type": "surface", "via": "IOSurfaceClientCreateChild", "surface": None, "client": "0x7000", "id": 7,
             "alloc_size": 16384, "width": None, "height": None, "bytes_per_row": None, "format": None, "name": None,
             "frames": []}
    events = [surface(1, 100, "BGRA", []), child,
              {"type": "release", "via": "IOSurfaceClientRelease", "id": 7},
              {"type": "release", "via": "IOSurfaceClientRelease", "id": 99}]
    s = summarize(read_records(write(tmp_path / "c.mtc", events, "IOSurfaceClientRelease"))).to_json()
    assert s["created_via"] == {"IOSurfaceCreate": 1, "IOSurfaceClientCreateChild": 1}
    assert s["released"] == {"count": 1, "bytes": 16384, "ids": [7], "visible": True, "untracked": 1}
    assert s["held_at_end"]["ids"] == [1]


def test_reference_drops_on_surfaces_from_before_the_window_are_counted_apart(tmp_path: Path) -> None:
    """The agent reports a release only at zero references; a drop on a surface it never saw created
    (its count unknown) is counted as untracked, never as a release, and children keep their parent."""
    child = {**surface(3, 16384, "420v", []), "via": "IOSurfaceClientCreateChild", "parent_id": 1}
    events = [surface(1, 100, "BGRA", []), child,
              {"type": "release-unknown", "via": "IOSurfaceClientRelease", "id": 42},
              {"type": "release-unknown", "via": "IOSurfaceClientRelease", "id": 42},
              {"type": "release", "via": "IOSurfaceClientRelease", "id": 3}]
    s = summarize(read_records(write(tmp_path / "c.mtc", events, "IOSurfaceClientRelease"))).to_json()
    assert s["released"] == {"count": 1, "bytes": 16384, "ids": [3], "visible": True, "untracked": 2}
    assert [(x["id"], x["parent_id"]) for x in s["surface_list"]] == [(1, None), (3, 1)]


def test_the_json_summary_bounds_its_per_surface_lists(tmp_path: Path) -> None:
    """A program creating surfaces in a loop must not make an unbounded --json document: each
    per-surface list holds LIST_ROWS rows, the first created, and says how many it left out; the
    counts and bytes stay exact."""
    n = LIST_ROWS + 7
    events = [surface(i, 10, "BGRA", ["0x10"]) for i in range(1, n + 1)]
    events += [{"type": "release", "surface": hex(0x9000 + i)} for i in range(1, n + 1, 2)]    # odd ids
    s = summarize(read_records(write(tmp_path / "c.mtc", events, "mtdarwin_surface_destroy"))).to_json()
    assert (s["surfaces"], s["bytes"]) == (n, 10 * n)
    assert [x["id"] for x in s["surface_list"]] == list(range(1, LIST_ROWS + 1))
    assert s["surface_list_omitted"] == 7
    released = list(range(1, n + 1, 2))
    held = list(range(2, n + 1, 2))
    assert s["released"]["count"] == len(released) and s["held_at_end"]["count"] == len(held)
    assert "ids_omitted" not in s["released"] and s["released"]["ids"] == released    # 504 ids: all kept
    small = summarize(read_records(write(tmp_path / "d.mtc", events[:3], "mtdarwin_surface_destroy"))).to_json()
    assert "surface_list_omitted" not in small and len(small["surface_list"]) == 3


def test_an_ids_list_past_the_bound_says_how_many_it_left_out() -> None:
    ids = list(range(LIST_ROWS + 3))
    assert _ids(ids) == {"ids": ids[:LIST_ROWS], "ids_omitted": 3}
    assert _ids(ids[:5]) == {"ids": ids[:5]}
