"""The END record's account of the processes a target made stays bounded (it is written into the
disk space set aside for it at the start)."""

from __future__ import annotations

import json

from memtrace.capture import END_RESERVE, HELD_MAX
from memtrace.children import END_CHILDREN, Child, children_evidence


def _child(i: int) -> Child:
    return Child(pid=1000 + i, ppid=999, origin="spawn", path="/" + "p" * 250, capture=f"child-{1000 + i}.mtc",
                 ended="not-followed", reason="could not follow: --pid 1: no such process on the local device")


def test_every_child_is_listed_up_to_the_bound() -> None:
    children = [_child(i) for i in range(END_CHILDREN)]
    ev = children_evidence(children)
    assert [c["pid"] for c in ev["children"]] == [1000 + i for i in range(END_CHILDREN)]
    assert "children_not_listed" not in ev
    assert children_evidence([]) == {"children": []}


def test_past_the_bound_the_rest_are_counted_and_the_end_still_fits_its_reserve() -> None:
    ev = children_evidence([_child(i) for i in range(5000)])
    assert len(ev["children"]) == END_CHILDREN and ev["children_not_listed"] == 5000 - END_CHILDREN
    assert ev["children"][0] == {"pid": 1000, "ppid": 999, "origin": "spawn", "path": "/" + "p" * 250,
                                 "capture": "child-1000.mtc", "ended": "not-followed",
                                 "reason": "could not follow: --pid 1: no such process on the local device"}
    # Children with the longest paths the agent posts still leave the END room beside the held symbols.
    assert len(json.dumps(ev)) < END_RESERVE - HELD_MAX
