"""The purgeable analyzer on synthetic captures written with the real CaptureWriter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memtrace.analyze.purgeable import summarize
from memtrace.capture import CaptureWriter, RecordType, read_records
from memtrace.frames import demangle_nested

APP, FETCH, CA = 0x1000, 0x1100, 0x2000


def write(path: Path, events: list[dict[str, Any]], missing: tuple[str, ...] = ()) -> Path:
    with CaptureWriter(path) as w:
        w.write(RecordType.META, {"tracer": "purgeable", "target": {"label": "synthetic"}, "options": {"window": 5}})
        w.write(RecordType.RECON, {"symbols": [{"name": n, "status": "MISSING"} for n in missing]
                                   + [{"name": "madvise", "status": "found"}], "info": {}})
        w.write(RecordType.MODULES, {"modules": [{"name": "app", "path": "/app", "base": "0x1000", "size": 0x2000}]})
        w.write(RecordType.EVENTS, {"type": "events:json", "events": events})
        w.write(RecordType.SYMBOLS, {"rows": [["0x1010", "app", 0x10, "sqlite_pcache_unpin"],
                                              ["0x1020", "app", 0x20, "sqlite_pcache_unpin"],
                                              ["0x1110", "app", 0x110, "sqlite_pcache_fetch_page"],
                                              ["0x2010", "app", 0x1010, "_ZN2CA6Render5Shmem12set_volatileEbPi"]]})
        w.write(RecordType.END, {"ended": "target-exited", "reason": "exited", "timing": {"captured_s": 1.0}})
    return path


def ev_set(old: int | None, new: int, frames: list[int], nbytes: int | None = 4096,
           entry: str = "vm_purgable_control", control: Any = 0) -> dict[str, Any]:
    return {"type": "set", "entry": entry, "control": control, "old_state": old, "new_state": new,
            "bytes": nbytes, "kr": 0 if old is not None else 4, "frames": [hex(f) for f in frames]}


def counts(set_n: int, get_n: int) -> dict[str, Any]:
    zero = {"set": 0, "get": 0, "purge_all": 0, "set_from_kernel": 0, "other": 0}
    return {"type": "counts", "controls": {"vm_purgable_control": {**zero, "set": set_n, "get": get_n},
                                           "mach_vm_purgable_control": zero},
            "creation_calls": {"vm_allocate": 1, "mach_vm_allocate": 0, "mach_vm_map": 0},
            "madvise_all": {"4": 1}, "madvise_platform": "linux"}


def test_matrix_callers_and_merging_of_call_sites(tmp_path: Path) -> None:
    events = [
        counts(1, 0),                               # an early cumulative snapshot: the last one wins
        ev_set(0, 1, [0x1010, APP]), ev_set(0, 1, [0x1020, APP]),     # two call sites, one function
        ev_set(0, 1, [0x1020, APP]),                                   # the second site again: same row
        ev_set(1, 0, [0x1110, APP]), ev_set(2, 0, [0x1110, APP], nbytes=8192),
        ev_set(0, 1, [0x2010, APP], entry="mach_vm_purgable_control"),
        ev_set(None, 1, [0x1010]),                  # failed SET: no transition
        counts(6, 3),
    ]
    s = summarize(read_records(write(tmp_path / "c.mtc", events))).to_json(capture="c")
    assert s["transitions"] == {"0->1": 4, "1->0": 1, "2->0": 1}
    assert s["transition_bytes"] == {"0->1": 16384, "1->0": 4096, "2->0": 8192}
    assert s["stolen"] == {"count": 1, "bytes": 8192}
    assert s["failed_sets"] == 1
    assert (s["set_calls"], s["get_calls"]) == (6, 3)
    # Rows per transition and whole stack: two call sites of one named function with no line
    # information are one row (issue 23: a stripped binary's function at several offsets).
    rows = sorted((r["entry"], r["transition"], r["caller"], r["count"], r["bytes"], r["stacks"])
                  for r in s["by_caller"])
    assert rows == sorted([
        ("vm_purgable_control", "0->1", "sqlite_pcache_unpin", 3, 12288, 2),
        ("vm_purgable_control", "1->0", "sqlite_pcache_fetch_page", 1, 4096, 1),
        ("vm_purgable_control", "2->0", "sqlite_pcache_fetch_page", 1, 8192, 1),
        ("mach_vm_purgable_control", "0->1", "CA::Render::Shmem::set_volatile", 1, 4096, 1),
    ])
    assert (s["ended"], s["reason"], s["target"]) == ("target-exited", "exited", "synthetic")


def test_call_sites_on_one_source_line_merge_two_paths_through_a_wrapper_stay_apart(tmp_path: Path) -> None:
    """Rows are keyed by the whole symbolized stack: an unrolled loop (several return addresses on one
    line) is one row; one wrapper reached from two business paths is two rows."""
    wrapper, line_a, line_b, path_a, path_b = 0x1010, 0x1020, 0x1030, 0x1110, 0x1120
    events = [ev_set(0, 1, [line_a, path_a]), ev_set(0, 1, [line_b, path_a]),   # one line, two addresses
              ev_set(0, 1, [wrapper, path_a]), ev_set(0, 1, [wrapper, path_b])]
    p = tmp_path / "c.mtc"
    with CaptureWriter(p) as w:
        w.write(RecordType.META, {"tracer": "purgeable", "target": {"label": "t"}})
        w.write(RecordType.MODULES, {"modules": [{"name": "app", "path": "/app", "base": "0x1000", "size": 0x2000}]})
        w.write(RecordType.EVENTS, {"events": events})
        w.write(RecordType.SYMBOLS, {"rows": [["0x1010", "app", 0x10, "set_state", "cache.c", 10],
                                              ["0x1020", "app", 0x20, "unrolled", "cache.c", 20],
                                              ["0x1030", "app", 0x30, "unrolled", "cache.c", 20],
                                              ["0x1110", "app", 0x110, "thumbnails", "ui.c", 5],
                                              ["0x1120", "app", 0x120, "prefetch", "net.c", 7]]})
    s = summarize(read_records(p)).to_json()
    rows = sorted((r["caller"], r["count"], r["frames"][1]["function"]) for r in s["by_caller"])
    assert rows == [("set_state", 1, "prefetch"), ("set_state", 1, "thumbnails"), ("unrolled", 2, "thumbnails")]
    unrolled = next(r for r in s["by_caller"] if r["caller"] == "unrolled")
    assert unrolled["stacks"] == 2 and unrolled["frames"][0] == {
        "function": "unrolled", "module": "app", "offset": 0x20, "address": "0x1020", "file": "cache.c", "line": 20}


def test_unknown_sizes_keep_bytes_honest(tmp_path: Path) -> None:
    events = [ev_set(0, 1, [0x1010], nbytes=None), ev_set(0, 1, [0x1010], nbytes=None)]
    s = summarize(read_records(write(tmp_path / "c.mtc", events))).to_json()
    assert s["by_caller"][0]["bytes"] is None     # never a made-up 0 for objects created before attach
    assert s["transitions"] == {"0->1": 2}


def test_madvise_is_its_own_line_never_a_transition(tmp_path: Path) -> None:
    events = [
        {"type": "madvise", "entry": "madvise", "advice": 8, "platform": "linux", "len": 65536, "frames": ["0x1010"]},
        {"type": "madvise", "entry": "madvise", "advice": 8, "platform": "linux", "len": 65536, "frames": ["0x1020"]},
        {"type": "madvise", "entry": "mtdarwin_madvise", "advice": 7, "platform": "darwin", "len": 4096,
         "frames": ["0x1010"]},
        {"type": "set", "entry": "IOSurfaceSetPurgeable", "control": "keep-current", "old_state": 2,
         "new_state": 3, "bytes": 100, "kr": 0, "frames": []},
    ]
    s = summarize(read_records(write(tmp_path / "c.mtc", events, missing=("mach_vm_map",)))).to_json()
    assert s["madvise"] == {"8": 2}
    assert s["madvise_bytes"] == {"8": 131072}
    assert s["madvise_names"] == {"8": "MADV_FREE"}
    assert s["madvise_standin"] == {"7": 1}
    assert s["transitions"] == {}
    assert s["keep_current"] == 1
    assert s["missing"] == ["mach_vm_map"]


def test_truncated_capture_says_so(tmp_path: Path) -> None:
    p = tmp_path / "c.mtc"
    with CaptureWriter(p) as w:
        w.write(RecordType.EVENTS, {"events": [ev_set(0, 1, [0x1010])]})
    s = summarize(read_records(p)).to_json()
    assert s["ended"] == "truncated"
    assert s["transitions"] == {"0->1": 1}


def test_demangle_nested() -> None:
    assert demangle_nested("_ZN2CA6Render5Shmem9new_shmemEm") == "CA::Render::Shmem::new_shmem"
    assert demangle_nested("__ZN2CA6Render5Shmem12set_volatileEbPi") == "CA::Render::Shmem::set_volatile"
    assert demangle_nested("_ZNK3foo3barEv") == "foo::bar"
    assert demangle_nested("sqlite_pcache_unpin") == "sqlite_pcache_unpin"
    assert demangle_nested("_Z3fooi") == "_Z3fooi"
