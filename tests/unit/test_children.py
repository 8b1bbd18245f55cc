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


def _follower(tmp_path, follow: bool):  # type: ignore[no-untyped-def]
    from memtrace.capture import RecordType
    from memtrace.children import ChildFollower, Family

    written: list[tuple[RecordType, dict]] = []
    warned: list[str] = []
    captured: list[tuple[int, str | None, str | None]] = []

    def capture(child, entry, held):  # type: ignore[no-untyped-def]
        # What the loop's _capture_child does, as far as the follower can tell: a file, an outcome.
        (tmp_path / child.capture).write_bytes(b"")
        captured.append((child.pid, entry, held))
        return type("Result", (), {"ended": "target-exited", "reason": "the target exited on its own"})()

    family = Family(folder=tmp_path, label="t", deadline=float("inf"), follow=follow)
    follower = ChildFollower(family, follow, lambda t, body: written.append((t, body)), warned.append, capture,
                             lambda: 4242)
    return follower, written, warned, captured


def test_the_follower_records_a_child_it_does_not_follow(tmp_path) -> None:  # type: ignore[no-untyped-def]
    follower, written, warned, captured = _follower(tmp_path, follow=False)
    follower.on_child({"pid": 77, "ppid": 4242, "origin": "fork", "lost": 0})
    assert captured == []
    (record,) = written
    assert record[1]["message"] == ("the target made child pid 77 (fork): not followed, it runs untraced "
                                    "(--follow-children traces it)")
    assert warned == [record[1]["message"]]
    assert follower.evidence(root=True) == {"children": [{"pid": 77, "ppid": 4242, "origin": "fork"}]}


def test_the_follower_starts_a_capture_through_the_function_it_was_given(tmp_path) -> None:  # type: ignore[no-untyped-def]
    follower, written, warned, captured = _follower(tmp_path, follow=True)
    follower.on_child({"pid": 78, "ppid": 4242, "origin": "fork", "entry": "0x1234"})
    follower.join(lambda phase: None)
    assert captured == [(78, "0x1234", None)]       # a fork child is released from its atfork entry
    assert written[0][1]["message"] == "the target made child pid 78 (fork): following it"
    assert "child pid 78: traced in child-78.mtc (target-exited)" in warned
    assert follower.evidence(root=True)["children"] == [
        {"pid": 78, "ppid": 4242, "origin": "fork", "capture": "child-78.mtc", "ended": "target-exited",
         "reason": "the target exited on its own"}]


def test_settle_waits_for_a_slow_follow_and_names_no_file_a_failed_one_discarded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A followed child's END (no join: its own children may still be attaching) is settled first:
    # a grandchild's capture that started late is waited for and named; one whose attach failed
    # (its file discarded) is not named -- before, the END named both files at once.
    import threading

    from memtrace.children import ChildFollower, Family
    from memtrace.errors import MemtraceError

    release = threading.Event()

    def capture(child, entry, held):  # type: ignore[no-untyped-def]
        release.wait(5)
        if child.pid == 91:
            raise MemtraceError("--pid 91: no such process on Local System")
        (tmp_path / child.capture).write_bytes(b"")
        return type("Result", (), {"ended": "target-exited", "reason": "exited"})()

    family = Family(folder=tmp_path, label="t", deadline=float("inf"), follow=True)
    follower = ChildFollower(family, True, lambda t, body: None, lambda m: None, capture, lambda: 4242)
    follower.on_child({"pid": 90, "ppid": 4242, "origin": "fork", "entry": "0x1"})
    follower.on_child({"pid": 91, "ppid": 4242, "origin": "fork", "entry": "0x2"})
    threading.Timer(0.2, release.set).start()
    follower.settle(None)
    children = follower.evidence(root=False)["children"]
    assert [(c["pid"], c.get("capture"), c["ended"]) for c in children] == [
        (90, "child-90.mtc", "target-exited"), (91, None, "not-followed")]


def test_settle_drops_an_exec_capture_that_never_started(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from memtrace.children import ChildFollower, Family
    from memtrace.errors import MemtraceError

    def capture(child, entry, held):  # type: ignore[no-untyped-def]
        raise MemtraceError("--pid 4242: no such process on Local System")

    family = Family(folder=tmp_path, label="t", deadline=float("inf"), follow=True)
    follower = ChildFollower(family, True, lambda t, body: None, lambda m: None, capture, lambda: 4242)
    info = {"path": "/bin/true", "argv": ["true"]}
    follower.on_replaced(info, since=0.0)
    assert info["followed"] == "exec-4242.mtc"          # claimed before its capture starts
    follower.settle(info)
    assert "followed" not in info and info["not_followed"].startswith("could not follow: --pid 4242")
