"""One error model: every expected failure is a MemtraceError, caught once in ``cli.main``."""

from __future__ import annotations


class MemtraceError(Exception):
    """A failure the user can act on: printed as one line, no traceback."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class TargetError(MemtraceError):
    """The target could not be found, launched or attached."""


class InputError(MemtraceError):
    """A file or argument given by the user is unusable."""


class AgentTimeout(MemtraceError):
    """The agent did not answer in time: evidence of a frozen process (anti-debug), not a hang."""

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(f"the agent did not answer {what} within {seconds:g} s")
        self.what = what
        self.seconds = seconds


class TargetGone(Exception):  # noqa: N818 -- an outcome, not a failure
    """The target ended before instrumentation finished (not an error: the capture says so)."""


class TargetLost(MemtraceError):
    """The target, or the connection to it, went away while memtrace was talking to it."""


def first_line(e: BaseException) -> str:
    """An exception's message in one line (its type's name when it has none): errors from Frida
    and the device services carry register dumps and tracebacks after their first line."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def is_frida_error(e: BaseException) -> bool:
    """Whether e is one of Frida's own exceptions (frida.*), whatever its class."""
    return type(e).__module__.split(".")[0] in ("frida", "_frida")
