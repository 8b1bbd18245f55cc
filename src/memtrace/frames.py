"""Frames as data: what one return address of a stack means, from capture to every reporter.

A return address resolves to one or more frames: the function that contains it and, when the
debug information says code was inlined there, the inlined calls inside it (innermost first,
each with ``inlined=True``, the containing function last).  Reporters never parse a frame back
out of a display string: they read these fields.  ``to_json`` is the frame object of every
``--json`` output (schema in docs/json-schema.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Frame:
    address: int                 # the return address as captured (inlined frames share it)
    module: str | None = None    # module name (basename), None when in no known module
    offset: int | None = None    # address - module base
    function: str | None = None  # demangled function name, None when unknown
    file: str | None = None      # source file, when debug information has it
    line: int | None = None
    inlined: bool = False        # an inlined call inside the next frame's function
    part: str | None = None      # the compiler's split-off part of the function ("cold", "part.0",
                                 # "isra.0"): the frame is named by its parent function, as addr2line does

    @property
    def known(self) -> bool:
        return self.function is not None

    def short_function(self) -> str | None:
        """The function without its parameter list (``Pool<double>::fill``), as callers are named."""
        name = self.function
        if not name:
            return None
        if name.startswith(("_Z", "__Z")):
            return demangle_nested(name)
        depth = 0
        for i, ch in enumerate(name):
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth -= 1
            elif ch == "(" and depth == 0 and i > 0 and not name.startswith("operator", max(0, i - 8)):
                return name[:i]
        return name

    def location(self) -> str | None:
        """``file:line`` (file as its basename) or None."""
        if not self.file:
            return None
        base = self.file.rsplit("/", 1)[-1]
        return f"{base}:{self.line}" if self.line else base

    def name(self) -> str:
        """``function (module)``; ``module+0xoffset`` when unnamed; ``0x7f... (unknown)`` for an
        address in no module the target announced (JIT code, a module unloaded unseen): shown,
        never dropped."""
        if self.function:
            return f"{self.function} ({self.module})" if self.module else self.function
        if self.module is not None and self.offset is not None:
            return f"{self.module}+{self.offset:#x}"
        return f"{self.address:#x} (unknown)"

    def label(self) -> str:
        """``function (module) file:line``, as the console and the reports show a frame."""
        text = self.name()
        where = self.location()
        if where:
            text += f" {where}"
        if self.inlined:
            text += " [inlined]"
        return text

    def key(self) -> tuple[Any, ...]:
        """What makes two frames the same row: function and source line when the line is known
        (several call sites on one line, an unrolled loop, merge); the function alone when it is
        named but no line is known (a stripped App Store binary: one function reached from five
        offsets is one row, not five); else the exact code offset."""
        if self.function is not None and self.line is not None:
            return (self.function, self.module, self.file, self.line, self.inlined)
        if self.function is not None:
            return (self.function, self.module, None, None, self.inlined)
        if self.module is not None and self.offset is not None:
            return (self.function, self.module, self.offset, self.inlined)
        return (self.function, None, self.address, self.inlined)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"function": self.function, "module": self.module, "offset": self.offset,
                               "address": f"{self.address:#x}"}
        if self.file:
            out["file"] = self.file
            out["line"] = self.line
        if self.inlined:
            out["inlined"] = True
        if self.part:
            out["part"] = self.part
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Frame:
        addr = obj.get("address")
        return cls(address=int(addr, 16) if isinstance(addr, str) else int(addr or 0),
                   module=obj.get("module"), offset=obj.get("offset"), function=obj.get("function"),
                   file=obj.get("file"), line=obj.get("line"), inlined=bool(obj.get("inlined", False)),
                   part=obj.get("part") or None)


# GCC's and LLVM's suffixes for the pieces a function is split into or cloned as: hot/cold
# splitting (main.cold), partial inlining (.part.N), interprocedural scalar replacement (.isra.N),
# constant propagation (.constprop.N), LTO privatised and aliased copies, ThinLTO's .llvm.N.
# Any chain of them (foo.constprop.0.isra.0, foo.part.0.cold) ends a symbol.
_PART = re.compile(r"(?:\.(?:cold|hot|part|isra|constprop|lto_priv|localalias|clone|llvm|specialized|unlikely)"
                   r"(?:\.\d+)*)+$")


def split_part(symbol: str) -> tuple[str, str | None]:
    """``main.cold`` -> (``main``, ``cold``); ``_Z3fooi.constprop.0.isra.0`` -> (``_Z3fooi``,
    ``constprop.0.isra.0``); a name without such a suffix -> (name, None)."""
    m = _PART.search(symbol)
    if m is None or m.start() == 0:
        return symbol, None
    return symbol[:m.start()], m.group()[1:]


def demangle_nested(symbol: str) -> str:
    """``_ZN2CA6Render5Shmem12set_volatileEbPi`` -> ``CA::Render::Shmem::set_volatile``.

    Only an Itanium nested name (what callers are matched on); anything else is returned
    unchanged.  Full demangling is the symbolizer's job; this covers names it left mangled."""
    m = re.match(r"_{1,2}ZN[KVr]*", symbol)
    if m is None:
        return symbol
    pos, parts = m.end(), []
    while pos < len(symbol) and symbol[pos].isdigit():
        n = re.match(r"\d+", symbol[pos:])
        assert n is not None
        length = int(n.group())
        start = pos + len(n.group())
        parts.append(symbol[start:start + length])
        pos = start + length
    if not parts or pos >= len(symbol) or symbol[pos] != "E":
        return symbol
    return "::".join(parts)


def stack_key(frames: list[Frame] | tuple[Frame, ...]) -> tuple[tuple[Any, ...], ...]:
    """Rows are keyed by the whole symbolized stack: identical symbolized stacks merge."""
    return tuple(f.key() for f in frames)
