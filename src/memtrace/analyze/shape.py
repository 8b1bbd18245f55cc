"""The shape of a JSON document read back from a file, checked before anything renders it.

A schema is plain data:

- a tuple of Python types: the value is one of them (``bool`` is never taken for an ``int``);
- ``[item]``: a list whose every element has the shape ``item``;
- ``{"*": value}``: an object whose every value has the shape ``value``;
- ``{key: shape, ...}``: an object; each key present has its shape, and keys wrapped as
  ``Required(shape)`` must be present.  Other keys are allowed (a newer memtrace may add some).

:func:`problem` returns the first mismatch as ``where: expected ..., got ...``, or None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NONE = type(None)
INT = (int,)
OPT_INT = (int, NONE)
STR = (str,)
OPT_STR = (str, NONE)
NUMBER = (int, float)
OPT_NUMBER = (int, float, NONE)


@dataclass(frozen=True)
class Required:
    shape: Any


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", NONE: "null",
          list: "a list", dict: "an object"}


def problem(value: Any, schema: Any, where: str = "") -> str | None:
    """The first place ``value`` does not have ``schema``'s shape, or None."""
    if isinstance(schema, tuple):
        ok = any(isinstance(value, t) and not (isinstance(value, bool) and t is not bool) for t in schema)
        return None if ok else _mismatch(where, " or ".join(_NAMES.get(t, t.__name__) for t in schema), value)
    if isinstance(schema, list):
        if not isinstance(value, list):
            return _mismatch(where, "a list", value)
        for i, item in enumerate(value):
            found = problem(item, schema[0], f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return _mismatch(where, "an object", value)
        if "*" in schema:
            for k, v in value.items():
                found = problem(v, schema["*"], _join(where, k))
                if found:
                    return found
            return None
        for key, sub in schema.items():
            required = isinstance(sub, Required)
            if key not in value:
                if required:
                    return f"{where or 'document'}: missing {key!r}"
                continue
            found = problem(value[key], sub.shape if required else sub, _join(where, key))
            if found:
                return found
        return None
    raise TypeError(f"not a schema: {schema!r}")


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _mismatch(where: str, expected: str, value: Any) -> str:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{where or 'document'}: expected {expected}, got {shown}"
