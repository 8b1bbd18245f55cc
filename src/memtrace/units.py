"""The one way memtrace writes sizes, shares and durations, on the terminal and in every report.

Sizes are binary and written KB/MB/GB (1 MB = 1048576 B), one decimal for KB and MB, two from a
GB up; a missing
value is an em dash, never 0.  Byte-exact figures (ledger moves, where a KB of rounding would
hide the evidence) use :func:`fmt_exact`.
"""

from __future__ import annotations

MISSING = "—"
_UNITS = ("B", "KB", "MB", "GB", "TB")


def fmt_bytes(n: float | int | None, signed: bool = False) -> str:
    """``1.5 MB``; ``+1.5 MB`` / ``−1.5 MB`` / ``±0 B`` when ``signed``."""
    if n is None or isinstance(n, bool) or not isinstance(n, int | float):
        return MISSING
    sign = _sign(n) if signed else ("−" if n < 0 else "")
    v = abs(float(n))
    for unit in _UNITS:
        if v < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{v:,.0f} B"
            # Three significant figures from a GB up: a 1.42 GB limit is not a 1.4 GB one.
            return f"{sign}{v:,.2f} {unit}" if unit in ("GB", "TB") else f"{sign}{v:,.1f} {unit}"
        v /= 1024
    raise AssertionError("unreachable")


def _sign(n: float) -> str:
    return "+" if n > 0 else "−" if n < 0 else "±"


def fmt_exact(n: int | None, signed: bool = False) -> str:
    """Every byte: ``1,048,576 B``; ``+4,096 B`` when ``signed`` (0 stays ``0 B``)."""
    if n is None or isinstance(n, bool) or not isinstance(n, int):
        return MISSING
    if n == 0:
        return "0 B"
    sign = _sign(n) if signed else ("−" if n < 0 else "")
    return f"{sign}{abs(n):,} B"


def fmt_pct(x: float | None) -> str:
    return MISSING if x is None else f"{x * 100:.1f} %"


def fmt_seconds(x: float | None) -> str:
    return MISSING if x is None else f"{x:g} s"


def fmt_count(n: int | None) -> str:
    return MISSING if n is None else f"{n:,}"


def plural(n: int, word: str) -> str:
    """``1 thread``, ``2 threads``, ``1,024 threads`` (regular plurals only)."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")
