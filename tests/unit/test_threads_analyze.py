"""The thread analyzer's bookkeeping on hand-made event streams: ordering and handle reuse."""

from __future__ import annotations

from memtrace.analyze.threads import ThreadsSummary


def _fold(*events: dict) -> dict:
    s = ThreadsSummary()
    for ev in events:
        s.fold_event(ev)
    return s.to_json()


def create(handle: str, t: int, detached: bool = False) -> dict:
    return {"type": "create", "handle": handle, "routine": "0x1000", "detached": detached,
            "stack_size": 8192, "frames": ["0x2000"], "t": t}


def test_start_before_create_is_one_thread() -> None:
    # The new thread runs (and reports its start) before pthread_create returns in its creator.
    s = _fold({"type": "existing", "tid": 1, "t": 0},
              {"type": "start", "tid": 2, "handle": "0xa", "t": 1}, create("0xa", 2),
              {"type": "exit", "tid": 2, "handle": "0xa", "t": 3}, {"type": "join", "handle": "0xa", "t": 4})
    assert (s["created"], s["joined"], s["exited"], s["leaked"]["count"]) == (1, 1, 1, 0)
    assert s["peak"]["count"] == 2 and s["existing_at_start"] == 1


def test_a_reused_handle_names_a_new_thread() -> None:
    # glibc caches a finished thread's stack, so the next thread gets the same handle.
    s = _fold(create("0xa", 1), {"type": "start", "tid": 2, "handle": "0xa", "t": 2},
              {"type": "detach", "handle": "0xa", "t": 3}, {"type": "exit", "tid": 2, "t": 4},
              {"type": "start", "tid": 3, "handle": "0xa", "t": 5}, create("0xa", 6),
              {"type": "exit", "tid": 3, "t": 7})
    assert (s["created"], s["detached"], s["exited"]) == (2, 1, 2)
    assert s["leaked"]["count"] == 1 and s["leaked"]["stack_bytes"] == 8192


def test_late_exit_of_the_previous_owner_of_a_handle() -> None:
    # The old thread's exit arrives after its handle's next thread started: matched by tid.
    s = _fold(create("0xa", 1, detached=True), {"type": "start", "tid": 2, "handle": "0xa", "t": 2},
              {"type": "start", "tid": 3, "handle": "0xa", "t": 3}, create("0xa", 4),
              {"type": "exit", "tid": 2, "t": 5})
    assert s["created"] == 2 and s["exited"] == 1
    assert s["running_at_end"]["count"] == 1 and s["running_at_end"]["joinable"] == 1
    assert s["leaked"]["count"] == 0


def test_a_thread_whose_join_was_returning_at_the_end_is_not_leaked() -> None:
    # The window ended after the thread's exit and before its joiner's pthread_join returned
    # (CI: "183 created, 182 joined, 1 leaked" on a program that joins every thread it makes).
    waiting = _fold(create("0xa", 1), {"type": "start", "tid": 2, "handle": "0xa", "t": 2},
                    {"type": "joining", "handle": "0xa", "t": 3}, {"type": "exit", "tid": 2, "t": 4})
    assert waiting["exited"] == 1 and waiting["joined"] == 0 and waiting["leaked"]["count"] == 0
    # A join that failed (EDEADLK, say) leaves it leaked; one that was never begun does too.
    failed = _fold(create("0xa", 1), {"type": "start", "tid": 2, "handle": "0xa", "t": 2},
                   {"type": "joining", "handle": "0xa", "t": 3}, {"type": "join-failed", "handle": "0xa", "errno": 35},
                   {"type": "exit", "tid": 2, "t": 4})
    never = _fold(create("0xa", 1), {"type": "start", "tid": 2, "handle": "0xa", "t": 2},
                  {"type": "exit", "tid": 2, "t": 4})
    assert failed["leaked"]["count"] == 1 and never["leaked"]["count"] == 1


def test_unmatched_and_failures() -> None:
    s = _fold({"type": "join", "handle": "0xdead"},
              {"type": "create-failed", "errno": 11, "frames": ["0x1"], "routine": "0x1000"},
              {"type": "create-failed", "errno": 11, "frames": ["0x1"], "routine": "0x1000"},
              {"type": "pthread-exit", "handle": "0xb"})
    assert s["unmatched"] == {"join": 1}
    assert s["failed"] == {"EAGAIN": 2} and s["failures_by_stack"][0]["count"] == 2
    assert s["pthread_exit_calls"] == 1


def test_an_exit_before_its_creator_said_the_start() -> None:
    # The start is said when pthread_create returns in the creator; a short thread may have ended
    # first (its exit listener had the script's lock first), its id cleared to 0 in its descriptor
    # by then (CI: 13 exits of 14).  Or its id still read, when the creator read it in time.
    for start_tid in (0, 7):
        s = _fold({"type": "exit", "tid": 7, "handle": "0xa", "t": 1}, create("0xa", 2),
                  {"type": "start", "tid": start_tid, "handle": "0xa", "t": 2},
                  {"type": "detach", "handle": "0xa", "t": 3})
        assert (s["created"], s["exited"], s["detached"], s["leaked"]["count"]) == (1, 1, 1, 0), start_tid


def test_an_earlier_threads_exit_is_not_a_new_threads() -> None:
    # A thread there at attach (no start seen) exits; a new thread gets its handle (glibc's stack
    # cache) and runs on: it has not exited.
    s = _fold({"type": "existing", "tid": 5, "t": 0}, {"type": "exit", "tid": 5, "handle": "0xa", "t": 1},
              create("0xa", 2), {"type": "start", "tid": 9, "handle": "0xa", "t": 2})
    assert (s["created"], s["exited"]) == (1, 0)
    s = _fold({"type": "existing", "tid": 5, "t": 0}, {"type": "exit", "tid": 5, "handle": "0xa", "t": 1},
              create("0xa", 2), {"type": "start", "tid": 9, "handle": "0xa", "t": 2},
              {"type": "exit", "tid": 9, "handle": "0xa", "t": 3})
    assert (s["created"], s["exited"]) == (1, 1)
