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
