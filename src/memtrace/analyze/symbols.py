"""Return addresses to readable frames, from a capture's SYMBOLS and MODULES records.

A SYMBOLS row is ``[address_hex, module, offset, function, file, line, inlined?]``; rows from
older captures have six elements (no inlined calls) and may carry mangled names, which
:meth:`SymbolTable.frames_of` demangles on read.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from memtrace.frames import Frame as SourceFrame
from memtrace.symbols.demangle import demangle


@dataclass(frozen=True, slots=True)
class Frame:
    address: int
    module: str | None
    offset: int | None
    symbol: str | None
    file: str | None = None
    line: int | None = None

    def label(self) -> str:
        """`symbol (module)` when known, else `module+0xoffset`, else the address."""
        if self.symbol and not self.symbol.startswith("0x"):
            return f"{self.symbol} ({self.module})" if self.module else self.symbol
        if self.module is not None and self.offset is not None:
            return f"{self.module}+{self.offset:#x}"
        return f"{self.address:#x}"


@dataclass(frozen=True, slots=True)
class Module:
    name: str
    path: str
    base: int
    size: int


class ModuleMap:
    """The modules a target announced, by address range."""

    def __init__(self) -> None:
        self._bases: list[int] = []
        self._modules: list[Module] = []

    def add(self, modules: list[dict[str, Any]]) -> None:
        for m in modules:
            base = int(m["base"], 16) if isinstance(m["base"], str) else int(m["base"])
            i = bisect.bisect_left(self._bases, base)
            if i < len(self._bases) and self._bases[i] == base:
                continue
            self._bases.insert(i, base)
            self._modules.insert(i, Module(m["name"], m.get("path") or "", base, int(m["size"])))

    def find(self, address: int) -> Module | None:
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0:
            return None
        m = self._modules[i]
        return m if address < m.base + m.size else None


class SymbolTable:
    """Each address resolved once: agent-provided rows first, module ranges as the fallback."""

    def __init__(self) -> None:
        self._rows: dict[int, Frame] = {}
        self._inlined: dict[int, list[tuple[str | None, str | None, int | None]]] = {}
        self.modules = ModuleMap()
        self._cache: dict[int, Frame] = {}
        self._frames: dict[int, list[SourceFrame]] = {}

    def add_rows(self, rows: list[list[Any]]) -> None:
        for row in rows:
            addr = int(row[0], 16) if isinstance(row[0], str) else int(row[0])
            module, offset, name = row[1], row[2], row[3]
            file = row[4] if len(row) > 4 else None
            line = row[5] if len(row) > 5 else None
            self._rows[addr] = Frame(addr, module, offset, name or None, file or None, line or None)
            inlined = row[6] if len(row) > 6 and isinstance(row[6], list) else []
            self._inlined[addr] = [(x[0] or None, x[1] or None, x[2] or None) for x in inlined
                                   if isinstance(x, list) and len(x) >= 3]
            self._cache.pop(addr, None)
            self._frames.pop(addr, None)

    def add_modules(self, modules: list[dict[str, Any]]) -> None:
        self.modules.add(modules)

    def frame(self, address: int) -> Frame:
        f = self._cache.get(address)
        if f is not None:
            return f
        f = self._rows.get(address)
        if f is None:
            m = self.modules.find(address)
            f = Frame(address, None, None, None) if m is None else Frame(address, m.name, address - m.base, None)
        self._cache[address] = f
        return f

    def labels(self, frames: tuple[int, ...] | list[int]) -> list[str]:
        return [self.frame(a).label() for a in frames]

    def frames_of(self, address: int) -> list[SourceFrame]:
        """What one return address means: its inlined calls (innermost first, ``inlined=True``),
        then the function that contains it; names demangled."""
        out = self._frames.get(address)
        if out is None:
            f = self.frame(address)
            name = f.symbol if f.symbol and not f.symbol.startswith("0x") else None
            out = [SourceFrame(address, f.module, f.offset, demangle(n) if n else None, file, line, inlined=True)
                   for n, file, line in self._inlined.get(address, ())]
            out.append(SourceFrame(address, f.module, f.offset, demangle(name) if name else None, f.file, f.line))
            self._frames[address] = out
        return out

    def stack_frames(self, frames: tuple[int, ...] | list[int]) -> list[SourceFrame]:
        """A whole stack, innermost first, inlined calls expanded in place."""
        return [x for a in frames for x in self.frames_of(a)]
