"""Frames as data: what one return address of a stack means, from capture to every reporter.

A return address resolves to one or more frames: the function that contains it and, when the
debug information says code was inlined there, the inlined calls inside it (innermost first,
each with ``inlined=True``, the containing function last).  Reporters never parse a frame back
out of a display string: they read these fields.  ``to_json`` is the frame object of every
``--json`` output (schema in docs/json-schema.md).
"""

from __future__ import annotations

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

    @property
    def known(self) -> bool:
        return self.function is not None

    def location(self) -> str | None:
        """``file:line`` (file as its basename) or None."""
        if not self.file:
            return None
        base = self.file.rsplit("/", 1)[-1]
        return f"{base}:{self.line}" if self.line else base

    def label(self) -> str:
        """``function (module) file:line``; ``module+0xoffset`` or the address when unnamed."""
        if self.function:
            text = f"{self.function} ({self.module})" if self.module else self.function
        elif self.module is not None and self.offset is not None:
            text = f"{self.module}+{self.offset:#x}"
        else:
            text = f"{self.address:#x}"
        where = self.location()
        if where:
            text += f" {where}"
        if self.inlined:
            text += " [inlined]"
        return text

    def key(self) -> tuple[Any, ...]:
        """What makes two frames the same row: function and source position when known (so one
        source line's several call sites merge), else module and offset."""
        if self.function is not None:
            return (self.function, self.module, self.file, self.line, self.inlined)
        return (None, self.module, self.offset if self.module is not None else self.address)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"function": self.function, "module": self.module, "offset": self.offset,
                               "address": f"{self.address:#x}"}
        if self.file:
            out["file"] = self.file
            out["line"] = self.line
        if self.inlined:
            out["inlined"] = True
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Frame:
        addr = obj.get("address")
        return cls(address=int(addr, 16) if isinstance(addr, str) else int(addr or 0),
                   module=obj.get("module"), offset=obj.get("offset"), function=obj.get("function"),
                   file=obj.get("file"), line=obj.get("line"), inlined=bool(obj.get("inlined", False)))


def stack_key(frames: list[Frame] | tuple[Frame, ...]) -> tuple[tuple[Any, ...], ...]:
    """Rows are keyed by the whole symbolized stack: identical symbolized stacks merge."""
    return tuple(f.key() for f in frames)
