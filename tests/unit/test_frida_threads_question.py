"""load_agent's question to a one-shot agent -- which of the threads born while it injected are
Frida's -- never hangs the host on a target that does not answer (stopped, frozen), and any failure
gives no thread a raised priority.  The script object stands in for Frida's: a frozen target is
what the question must survive, and a real one cannot be frozen between the load and the question."""

from __future__ import annotations

import threading

import frida
import pytest

from memtrace import frida_host


class _Exports:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def frida_threads_among(self, tids: list[int]) -> list[int]:
        if self.answer == "never":
            threading.Event().wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        assert isinstance(self.answer, list)
        return [t for t in tids if t in self.answer]


class _Script:
    def __init__(self, answer: object) -> None:
        self.exports_sync = _Exports(answer)


def test_the_agents_answer_is_taken() -> None:
    assert frida_host._frida_threads_among(_Script([12, 14]), [11, 12, 13, 14]) == {12, 14}


@pytest.mark.parametrize("error", [frida.core.RPCException("unable to find method 'fridaThreadsAmong'"),
                                   frida.InvalidOperationError("script is destroyed")])
def test_an_agent_that_cannot_say_names_no_thread(error: Exception) -> None:
    assert frida_host._frida_threads_among(_Script(error), [11, 12]) == set()


@pytest.mark.timeout(60)      # a hang fails here, not in the whole run's timeout
def test_a_target_that_never_answers_costs_the_timeout_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frida_host, "FRIDA_THREADS_TIMEOUT", 0.2)
    assert frida_host._frida_threads_among(_Script("never"), [11, 12]) == set()


def test_no_script_or_no_thread_asks_nothing() -> None:
    assert frida_host._frida_threads_among(None, [11]) == set()
    assert frida_host._frida_threads_among(_Script("never"), []) == set()
