"""What the exported formats can hold, and the one line a writer leaves when a value does not fit.

A value beyond a format's limits (pprof's int64, a finite JSON number, chrome-trace's timestamps)
is clamped to the nearest value the format holds and noted on the Loaded capture: the command
prints each note as one warning line and exits 1.  Never a traceback, never a half-written file.
"""

from __future__ import annotations

import math
from typing import Any

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
# chrome-trace timestamps are microseconds that viewers read as doubles: exact up to 2^53 (285 years).
TS_US_MAX = float(1 << 53)


def _note(loaded: Any, what: str, text: str) -> None:
    notes = loaded.notes
    if not any(n.startswith(f"{what}:") for n in notes):      # the first of each kind is enough
        notes.append(f"{what}: {text}")


def clamp_int64(value: float, what: str, loaded: Any) -> int:
    """``value`` as an int64 holds it (a non-finite float: 0), noting the first clamp of ``what``."""
    if isinstance(value, float) and not math.isfinite(value):
        _note(loaded, what, f"{value} is not a number an int64 holds; written as 0")
        return 0
    v = int(value)
    if INT64_MIN <= v <= INT64_MAX:
        return v
    clamped = max(INT64_MIN, min(INT64_MAX, v))
    _note(loaded, what, f"{v} does not fit a 64-bit signed integer; written as {clamped}")
    return clamped


def finite(value: Any, what: str, loaded: Any, low: float = -math.inf, high: float = math.inf) -> Any:
    """A JSON number within [low, high] (non-finite floats are not JSON: clamped), noting the first clamp."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if isinstance(value, float) and math.isnan(value):
        _note(loaded, what, "NaN is not a JSON number; written as 0")
        return 0
    if value < low or value > high or (isinstance(value, float) and math.isinf(value)):
        clamped = max(low, min(high, value))
        if math.isinf(clamped):
            clamped = math.copysign(1.7976931348623157e308, clamped)
        _note(loaded, what, f"{value} is beyond what the format holds; written as {clamped}")
        return clamped
    return value
