"""A silent agent in a target that starves memtrace's threads is said to be starved, with who kept
the CPUs busy -- never "anti-debug" (issue 27: 128 spinning threads made the unhook time out and
memtrace blamed anti-debug)."""

from __future__ import annotations

from typing import Any

from memtrace.deaths import DeathThresholds, classify_end


def _end(timeout_info: dict[str, Any]) -> dict[str, Any]:
    return classify_end(window=2, attach_delay=0, t_start=10.0, t_attach=9.0, t_gone=None, t_now=140.0,
                        interrupted=False, detach_reason=None, exit_info=None, crash_info=None,
                        timeout_info=timeout_info, rates=[], thresholds=DeathThresholds())


def test_a_busy_target_starves_the_agent() -> None:
    starved = {"target_runnable_threads": 128, "target_threads": 129, "target_cpus": 2, "load_1min": 1.5,
               "machine_cpus": 2}
    end = _end({"what": "stop", "timeout_s": 120, "starved": starved})
    assert end["ended"] == "starved"
    assert end["reason"] == ("the agent did not answer stop within 120 s: the target's 128 runnable threads on "
                             "2 CPUs kept memtrace's threads from running (not anti-debug: the target ran all "
                             "along)")
    assert end["evidence"]["timeout"]["starved"] == starved


def test_a_loaded_machine_starves_the_agent() -> None:
    starved = {"target_runnable_threads": 1, "target_threads": 5, "target_cpus": 2, "load_1min": 150.2,
               "machine_cpus": 2}
    end = _end({"what": "script load", "timeout_s": 20, "starved": starved})
    assert end["ended"] == "starved"
    assert "the machine's load (150.2 on 2 CPUs) kept memtrace's threads from running" in end["reason"]
    assert "target's" not in end["reason"]


def test_both_are_named() -> None:
    starved = {"target_runnable_threads": 64, "target_threads": 65, "target_cpus": 2, "load_1min": 90.0,
               "machine_cpus": 2}
    reason = _end({"what": "stop", "timeout_s": 10, "starved": starved})["reason"]
    assert "the target's 64 runnable threads on 2 CPUs and the machine's load (90 on 2 CPUs)" in reason


def test_a_frozen_target_is_still_anti_debug() -> None:
    end = _end({"what": "script load", "timeout_s": 3})
    assert end["ended"] == "anti-debug"
    assert "starved" not in end["reason"]
