"""The fd analyzer's bookkeeping on hand-made event streams (no process needed)."""

from __future__ import annotations

from memtrace.analyze.fds import FdsSummary, fd_kind


def _fold(*events: dict) -> dict:
    s = FdsSummary()
    for ev in events:
        s.fold_event(ev)
    return s.to_json()


def census(trigger: str, t: int, *fds: tuple[int, str], frida: tuple[int, ...] = ()) -> dict:
    return {"type": "census", "trigger": trigger, "t": t, "fds": [list(f) for f in fds], "frida": list(frida)}


def test_baseline_is_never_blamed_and_its_closes_are_counted() -> None:
    s = _fold(census("start", 0, (0, "/dev/null"), (3, "socket:[1]"), (4, "pipe:[2]"), frida=(3,)),
              {"type": "close", "call": "close", "fd": 4, "t": 1},
              {"type": "open", "call": "open", "fds": [4], "path": "/a", "frames": ["0x10"], "t": 2},
              census("end", 3, (0, "/dev/null"), (3, "socket:[1]"), (4, "/a"), frida=(3,)))
    # fd 3 is Frida's own (cloaked): not the target's, so not in its baseline.
    assert s["baseline"] == {"count": 2, "closed_in_window": 1}
    assert [(c["count"], c["frida"]) for c in s["censuses"]] == [(2, 1), (2, 1)]
    assert s["closed"] == {"close": 1}
    assert s["open_at_end"]["count"] == 1 and s["open_at_end"]["by_stack"][0]["fds"] == [4]
    # fd 3 is Frida's own (cloaked): never "opened out of sight".
    assert s["reconciliation"] == {"census_count": 2, "opened_out_of_sight": [], "closed_out_of_sight": []}
    assert s["peak"] == {"count": 2, "t_ms": 0}


def test_dup2_onto_an_open_descriptor_replaces_it() -> None:
    s = _fold(census("start", 0),
              {"type": "open", "call": "open", "fds": [5], "path": "/x", "frames": ["0x10"], "t": 1},
              {"type": "open", "call": "open", "fds": [6], "path": "/y", "frames": ["0x20"], "t": 2},
              {"type": "open", "call": "dup2", "fds": [6], "from": 5, "frames": ["0x30"], "t": 3},
              {"type": "close", "call": "close", "fd": 6, "t": 4},
              {"type": "close", "call": "close", "fd": 99, "t": 5})
    assert s["replaced"] == 1
    assert s["closed"] == {"close": 1} and s["closes_of_unknown_fds"] == 1
    assert [(r["calls"], r["paths"]) for r in s["open_at_end"]["by_stack"]] == [({"open": 1}, ["/x"])]
    assert s["peak"]["count"] == 2
    assert s["reconciliation"] is None          # no end census: nothing to reconcile


def test_reconciliation_names_both_directions() -> None:
    s = _fold(census("start", 0, (0, "/dev/null")),
              {"type": "open", "call": "socket", "fds": [7], "frames": [], "t": 1},
              {"type": "open", "call": "open", "fds": [8], "path": "/z", "frames": [], "t": 2},
              census("end", 3, (0, "/dev/null"), (8, "/z"), (9, "anon_inode:[eventfd]")))
    assert s["reconciliation"]["opened_out_of_sight"] == [{"fd": 9, "path": "anon_inode:[eventfd]",
                                                           "kind": "anon_inode:eventfd"}]
    assert s["reconciliation"]["closed_out_of_sight"] == [7]
    assert s["open_at_end"]["by_kind"] == {"socket": 1, "file": 1}


def test_failures_by_errno_and_stack() -> None:
    s = _fold(*[{"type": "open-failed", "call": "open", "errno": 24, "frames": ["0x1"], "path": "/f"}] * 3,
              {"type": "open-failed", "call": "socket", "errno": 23, "frames": ["0x2"]})
    assert s["failed"] == {"open": {"EMFILE": 3}, "socket": {"ENFILE": 1}}
    assert [(r["call"], r["error"], r["count"]) for r in s["failures_by_stack"]] == [
        ("open", "EMFILE", 3), ("socket", "ENFILE", 1)]


def test_fd_kind() -> None:
    assert [fd_kind(p) for p in ("/tmp/a", "/dev/null", "socket:[12]", "pipe:[3]", "anon_inode:[eventfd]",
                                 "anon_inode:inotify", "vnode:", None, "")] == [
        "file", "device", "socket", "pipe", "anon_inode:eventfd", "anon_inode:inotify", "vnode", "unknown",
        "unknown"]
