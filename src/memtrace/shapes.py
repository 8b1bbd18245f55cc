"""Tiny shape checks for decoded JSON: what a reader accepts before any analyzer sees it.

A *check* is a function of one decoded JSON value that returns ``None`` when the value has the
shape, or a short phrase saying what is wrong and where (``"events[3].frames[0]: expected an
address, got '0xZZ'"``).  Checks are built once from the combinators below and are cheap to run
on every record.  Objects accept keys they do not declare (a newer writer may add fields);
declared keys that are present must have their shape.  :mod:`memtrace.capture` holds the table of
record shapes built from these.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], "str | None"]

_HEX = re.compile(r"(0[xX])?[0-9a-fA-F]{1,16}")


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(name: str, test: Callable[[Any], bool]) -> Check:
    def check(v: Any) -> str | None:
        return None if test(v) else f"expected {name}, got {_show(v)}"
    return check


ANY: Check = lambda v: None  # noqa: E731 -- the check that accepts everything
STR = _kind("a string", lambda v: type(v) is str)
BOOL = _kind("true or false", lambda v: type(v) is bool)
INT = _kind("an integer", lambda v: type(v) is int)
UINT = _kind("a non-negative integer", lambda v: type(v) is int and v >= 0)
_U64_LIMIT = 1 << 64


def _uint(v: Any) -> str | None:
    # Every count the agent keeps is a u64: a larger one is not a number memtrace wrote.
    if type(v) is int and 0 <= v < _U64_LIMIT:
        return None
    if type(v) is int and v >= _U64_LIMIT:
        return f"expected a 64-bit count, got {_show(v)} (2^64 or more)"
    return UINT(v)


U64: Check = _uint
_TOTAL_LIMIT = 1 << 63
_TIME_LIMIT = float(1 << 53)


def _total(v: Any) -> str | None:
    # A running total (bytes, calls) fits an int64, as every exporter needs: no real run comes near.
    if type(v) is int and 0 <= v < _TOTAL_LIMIT:
        return None
    if type(v) is int and v >= _TOTAL_LIMIT:
        return f"expected a total below 2^63, got {_show(v)}"
    return UINT(v)


def _amount(v: Any) -> str | None:
    # A measured amount (bytes in use, a rate): a finite number, not negative, below 2^63.
    p = NUM(v)
    if p is not None:
        return p
    return None if 0 <= v < _TOTAL_LIMIT else f"expected an amount from 0 to 2^63, got {_show(v)}"


def _time(v: Any) -> str | None:
    # A clock reading or a duration (seconds or milliseconds): within 2^53, where a double is exact.
    p = NUM(v)
    if p is not None:
        return p
    return None if -_TIME_LIMIT < v < _TIME_LIMIT else f"expected a time within 2^53, got {_show(v)}"


TOTAL: Check = _total
AMOUNT: Check = _amount
TIME: Check = _time
NUM = _kind("a finite number", lambda v: (type(v) is int) or (type(v) is float and math.isfinite(v)))
# A code address as the agents write it: "0x7fb5b893c75e" (or a plain non-negative integer).
ADDR = _kind("an address", lambda v: (type(v) is str and _HEX.fullmatch(v) is not None)
             or (type(v) is int and 0 <= v < 1 << 64))


def opt(check: Check) -> Check:
    """``null`` or ``check``."""
    def optional(v: Any) -> str | None:
        return None if v is None else check(v)
    return optional


def one_of(*checks: Check) -> Check:
    def either(v: Any) -> str | None:
        problems = [c(v) for c in checks]
        return None if None in problems else " or ".join(p for p in problems if p)
    return either


def seq(item: Check, min_len: int = 0) -> Check:
    """A list whose every element has ``item``'s shape (at least ``min_len`` of them)."""
    def items(v: Any) -> str | None:
        if type(v) is not list:
            return f"expected a list, got {_show(v)}"
        if len(v) < min_len:
            return f"expected at least {min_len} elements, got {len(v)}"
        if item is not ANY:
            for i, x in enumerate(v):
                p = item(x)
                if p is not None:
                    return f"[{i}]{_sep(p)}{p}"
        return None
    return items


def row(*positions: Check, min_len: int) -> Check:
    """A list read by position: element i has ``positions[i]``'s shape; the first ``min_len`` are
    required, later ones optional, any beyond ``positions`` ignored."""
    def fixed(v: Any) -> str | None:
        if type(v) is not list:
            return f"expected a list, got {_show(v)}"
        if len(v) < min_len:
            return f"expected at least {min_len} elements, got {len(v)}"
        for i, (x, check) in enumerate(zip(v, positions, strict=False)):
            p = check(x)
            if p is not None:
                return f"[{i}]{_sep(p)}{p}"
        return None
    return fixed


def mapping(value: Check) -> Check:
    """An object with any keys, every value of ``value``'s shape."""
    def values(v: Any) -> str | None:
        if type(v) is not dict:
            return f"expected an object, got {_show(v)}"
        if value is not ANY:
            for k, x in v.items():
                p = value(x)
                if p is not None:
                    return f".{k}{_sep(p)}{p}"
        return None
    return values


def obj(fields: dict[str, Check] | None = None, required: tuple[str, ...] = ()) -> Check:
    """An object: each key of ``fields`` that is present has its shape; ``required`` keys must be."""
    declared = list((fields or {}).items())

    def check(v: Any) -> str | None:
        if type(v) is not dict:
            return f"expected an object, got {_show(v)}"
        for k in required:
            if k not in v:
                return f"missing {k!r}"
        for k, c in declared:
            if k in v:
                p = c(v[k])
                if p is not None:
                    return f".{k}{_sep(p)}{p}"
        return None
    return check


def tagged(tag: str, shapes: dict[str, Check], common: Check) -> Check:
    """An object checked by ``common``, then by the shape its ``tag`` value names (if any)."""
    def check(v: Any) -> str | None:
        p = common(v)
        if p is not None:
            return p
        name = v.get(tag)
        specific = shapes.get(name) if type(name) is str else None
        return None if specific is None else specific(v)
    return check


def _sep(problem: str) -> str:
    # "events[3].frames[0]: expected ..." -- a path step joins the next one directly.
    return "" if problem.startswith((".", "[")) else ": "
