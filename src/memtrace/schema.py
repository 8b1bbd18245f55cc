"""What memtrace accepts when it reads JSON back: declared as msgspec Structs, checked by msgspec.

One mechanism for every JSON document memtrace reads: a capture's record bodies (declared in
:mod:`memtrace.capture`), each tracer's events and results (declared in the tracer's analyze module
and registered through its :class:`~memtrace.tracers.Tracer`), and the JSON documents a report
folder holds (``analyze/census.py``, ``analyze/jetsam.py``).  A schema is a :class:`Shape` (an
object: each field that is present has its type; fields without a default must be present; other
keys are allowed, so a newer writer may add some) or a :class:`Row` (a list read by position:
fields without a default are required, later ones optional, any beyond ignored), built from the
value types below (``Count``, ``Addr``, ...), ``list[...]``, ``dict[str, ...]``, ``| None`` (the
key may hold null) and ``Maybe[...]`` (the key may be missing but, when present, never null).

msgspec (C, strict: a bool is never an int, a string never a number) does the checking: the old
hand-written combinators cost a Python call per value.  The decoded JSON handed to the analyzers
stays the plain dicts and lists it was; the Structs only say what shape they must have.

:func:`problem` turns msgspec's verdict into the one phrase memtrace has always said --
``.events[3].frames[0]: expected an address, got '0xZZ'`` -- by walking the value and the schema
along the path msgspec names, so the phrase shows the offending value, not just a type.

Why msgspec rather than pydantic: it is one small C extension with no dependencies, validates a
dict against a Struct (``msgspec.convert``) several times faster than pydantic v2, is strict by
default exactly as the old checks were, and its ``array_like`` Structs say "a row with optional
trailing fields" directly.  Its one limit that matters here: integer bounds must fit an int64,
so a count is checked below 2^63 (every total an exporter writes is an int64 column anyway).
"""

from __future__ import annotations

import re
import types
import typing
from functools import cache
from typing import Annotated, Any, TypeVar, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

__all__ = ["UNSET", "Addr", "Amount", "Count", "Line", "Maybe", "Num", "Row", "Shape", "Time", "problem"]

T = TypeVar("T")
# The key may be missing; when present it has the type (null is not allowed unless the type says it).
Maybe = Union[T, UnsetType]  # noqa: UP007 -- a generic alias msgspec resolves

_INT64_MAX = (1 << 63) - 1


class Shape(Struct):
    """An object: declared fields that are present have their type; unknown keys are allowed.
    (Required fields, those without a default, come first: a Struct's fields are ordered.)"""


class Row(Struct, array_like=True):
    """A list read by position: fields without a default are required, trailing ones optional."""


# ---- value types: each names itself in the one phrase a mismatch gives ----------------------------

# A count or running total the agent keeps (bytes, calls, ids, sizes): a u64 in the agent; here
# below 2^63, which every real run stays far from and every exporter's int64 column needs.
Count = Annotated[int, Meta(ge=0, le=_INT64_MAX, description="a non-negative integer",
                            extra={"above": "a count below 2^63"})]
# A measured amount (bytes in use, a rate): a number (integer or finite float), 0 to 2^63.
Amount = Annotated[float, Meta(ge=0, lt=float(1 << 63), description="an amount from 0 to 2^63")]
# A clock reading or a duration (seconds or milliseconds): within 2^53, where a double is exact.
Time = Annotated[float, Meta(gt=-float(1 << 53), lt=float(1 << 53), description="a time within 2^53")]
Num = Annotated[float, Meta(description="a finite number")]
Line = Annotated[int, Meta(ge=0, lt=1 << 32, description="a line number (0 to 2^32)")]
# A code address as the agents write it: "0x7fb5b893c75e" (or a plain non-negative integer).
_HEX = r"^(0[xX])?[0-9a-fA-F]{1,16}\Z"
Addr = Union[Annotated[str, Meta(pattern=_HEX, description="an address")],  # noqa: UP007
             Annotated[int, Meta(ge=0, le=_INT64_MAX, description="an address")]]


# ---- the phrase a mismatch gives ---------------------------------------------------------------------

_NAMES: dict[Any, str] = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
                          type(None): "null", list: "a list", dict: "an object", tuple: "a list"}
_AT = re.compile(r" - at `\$(.*)`$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_MISSING = re.compile(r"^Object missing required field `(.*)`")
_SHORT = re.compile(r"^Expected `array` of (?:at least length|length >=) (\d+)")


def problem(value: Any, schema: Any, null_said: bool = False) -> tuple[str, str] | None:
    """Where ``value`` does not have ``schema``'s shape and what is wrong, or None when it has.

    The place is a path (``.rows[0][0]``, empty for the value itself); the phrase says what was
    expected and what was found.  ``null_said``: an optional type says "or null" in the phrase."""
    try:
        msgspec.convert(value, schema)
        return None
    except msgspec.ValidationError as e:
        return _explain(value, schema, str(e), null_said)


def _explain(value: Any, schema: Any, message: str, null_said: bool) -> tuple[str, str]:
    at = _AT.search(message)
    said = message[:at.start()] if at else message
    where = ""
    for m in _STEP.finditer(at.group(1) if at else ""):
        name, index = m.groups()
        if name is not None:
            schema = _field_type(schema, name, value)
            value = value[name]
            where += f".{name}"
        elif index == "...":       # a mapping's value: msgspec does not say which key
            values = _dict_value_type(schema)
            key = next((k for k, v in value.items() if problem(v, values) is not None), None)
            inner = None if key is None else problem(value[key], values, null_said)
            if inner is None:       # a key itself is wrong (not from JSON): msgspec's own words
                return where, said[0].lower() + said[1:]
            return f"{where}.{key}{inner[0]}", inner[1]
        else:
            schema = _item_type(schema, int(index))
            value = value[int(index)]
            where += f"[{index}]"
    missing = _MISSING.match(said)
    if missing:
        return where, f"missing {missing.group(1)!r}"
    short = _SHORT.match(said)
    if short and isinstance(value, list):
        return where, f"expected at least {short.group(1)} elements, got {len(value)}"
    return where, f"expected {_describe(schema, value, null_said)}, got {_show(value)}"


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _members(schema: Any) -> list[Any]:
    """A union's members (a single type is its own only member)."""
    return list(typing.get_args(schema)) if typing.get_origin(schema) in (Union, types.UnionType) else [schema]


def _strip(schema: Any) -> Any:
    """The type a value of ``schema`` is checked against once it is there and not null."""
    members = [m for m in _members(schema) if m is not UnsetType and m is not type(None)]
    for m in members:                   # the container or Struct among them, if any
        base = typing.get_origin(m) or m
        if base in (list, dict) or (isinstance(base, type) and issubclass(base, Struct)):
            return m
    return members[0] if len(members) == 1 else Union[tuple(members)]  # noqa: UP007


@cache
def _fields(cls: type[Struct]) -> list[tuple[str, Any]]:
    """(name in the JSON, type) of each field, in order."""
    return [(f.encode_name, f.type) for f in msgspec.structs.fields(cls)]


def _field_type(schema: Any, name: str, value: Any) -> Any:
    cls = _strip(schema)
    if isinstance(cls, type) and issubclass(cls, Struct):
        return dict(_fields(cls)).get(name, Any)
    return Any


def _item_type(schema: Any, index: int) -> Any:
    cls = _strip(schema)
    if isinstance(cls, type) and issubclass(cls, Struct):     # a Row: the index-th field
        fields = _fields(cls)
        return fields[index][1] if index < len(fields) else Any
    args = typing.get_args(cls)
    return args[0] if typing.get_origin(cls) is list and args else Any


def _dict_value_type(schema: Any) -> Any:
    args = typing.get_args(_strip(schema))
    return args[1] if len(args) == 2 else Any


def _describe(schema: Any, value: Any, null_said: bool) -> str:
    said = []
    for m in _members(schema):
        if m is UnsetType or (m is type(None) and not null_said):
            continue
        text = _describe_one(m, value)
        if text not in said:
            said.append(text)
    return " or ".join(said) or "nothing"


def _describe_one(t: Any, value: Any) -> str:
    if typing.get_origin(t) is Annotated:
        base, *extras = typing.get_args(t)
        meta = next((x for x in extras if isinstance(x, Meta)), None)
        if meta is not None and meta.description:
            above = (meta.extra or {}).get("above")
            if above and type(value) is int and meta.le is not None and value > meta.le:
                return str(above)
            return meta.description
        t = base
    origin = typing.get_origin(t) or t
    if isinstance(origin, type) and issubclass(origin, Struct):
        return "a list" if origin.__struct_config__.array_like else "an object"
    return _NAMES.get(origin, getattr(origin, "__name__", str(origin)))


def document_problem(value: Any, schema: Any) -> str | None:
    """:func:`problem` as a report folder's JSON documents say it: ``rows[0].pid: expected an
    integer, got '1'`` (``document`` for the value itself), null named where it is allowed."""
    found = problem(value, schema, null_said=True)
    if found is None:
        return None
    where, what = found
    return f"{where.removeprefix('.') or 'document'}: {what}"
