"""Return addresses to frames, from a capture's SYMBOLS and MODULES records.

SYMBOLS rows are ``[address, module, offset, function, file, line]`` with an optional seventh
element, the inlined calls at that address as ``[[function, file, line], ...]`` innermost
first.  Rows keep names as the binary spells them (mangled); they are demangled here, on read,
so old captures and new ones read alike.  :meth:`SymbolTable.frames_of` turns one address into its :class:`~memtrace.frames.Frame`
list (inlined calls first), :meth:`SymbolTable.stack` a whole stack.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from memtrace.frames import Frame, split_part
from memtrace.symbols.demangle import demangle


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

    def __iter__(self) -> Any:
        return iter(self._modules)


class SymbolTable:
    """Each address resolved once: symbolizer rows first, module ranges as the fallback."""

    def __init__(self) -> None:
        self._rows: dict[int, list[Frame]] = {}
        self.modules = ModuleMap()
        self._cache: dict[int, list[Frame]] = {}
        # Row keys (stack_key): each distinct Frame.key() as a small int, each address as the ints
        # of its frames.  A stack table groups ~100,000 stacks of 64 frames (cc1plus): keying them
        # as tuples of ints, made in C from these, costs a fraction of a second where building
        # and keying their Frame objects took seconds a table.
        self._key_ids: dict[tuple[Any, ...], int] = {}
        self._addr_keys: dict[int, tuple[int, ...]] = {}
        self._addr_key: dict[int, int] = {}     # the addresses that stand for one frame: its key's int
        self.version = 0            # bumped by every change that may change an address's frames

    def add_rows(self, rows: list[list[Any]]) -> None:
        for row in rows:
            addr = int(row[0], 16) if isinstance(row[0], str) else int(row[0])
            module, offset, (name, part) = row[1], row[2], _name_part(row[3])
            file = row[4] if len(row) > 4 else None
            line = row[5] if len(row) > 5 else None
            outer = Frame(addr, module, offset, name, file or None, line or None, part=part)
            inlined = tuple(Frame(addr, module, offset, _name(i[0]), (i[1] if len(i) > 1 else None) or None,
                                  (i[2] if len(i) > 2 else None) or None, inlined=True)
                            for i in (row[6] if len(row) > 6 and isinstance(row[6], list) else ()))
            self._rows[addr] = [*inlined, outer]
            self._cache.pop(addr, None)
            self._addr_keys.pop(addr, None)
            self._addr_key.pop(addr, None)
        self.version += 1

    def add_modules(self, modules: list[dict[str, Any]]) -> None:
        self.modules.add(modules)
        self.version += 1

    def frames_of(self, address: int) -> list[Frame]:
        """The frames one return address stands for: inlined calls (innermost first), then its function."""
        f = self._cache.get(address)
        if f is not None:
            return f
        f = self._rows.get(address)
        if f is None:
            m = self.modules.find(address)
            f = [Frame(address)] if m is None else [Frame(address, m.name, address - m.base)]
        self._cache[address] = f
        return f

    def frame(self, address: int) -> Frame:
        """The containing function's frame of one address (no inlined calls)."""
        return self.frames_of(address)[-1]

    def stack(self, addresses: Iterable[int]) -> list[Frame]:
        """A whole stack as frames, inlined calls expanded."""
        out: list[Frame] = []
        for a in addresses:
            out.extend(self.frames_of(a))
        return out

    stack_frames = stack

    def key_id(self, key: tuple[Any, ...]) -> int:
        """A Frame.key() as a small int, the same int for equal keys (in this table)."""
        n = self._key_ids.get(key)
        if n is None:
            n = self._key_ids[key] = len(self._key_ids)
        return n

    def _keys_of(self, address: int) -> tuple[int, ...]:
        k = self._addr_keys.get(address)
        if k is None:
            k = self._addr_keys[address] = tuple(self.key_id(f.key()) for f in self.frames_of(address))
            if len(k) == 1:
                self._addr_key[address] = k[0]
        return k

    def stack_key(self, addresses: Sequence[int]) -> tuple[int, ...]:
        """The key of ``stack(addresses)``: equal exactly when the stacks' frames' keys are equal,
        frame by frame, inlined calls expanded (Frame.key() of each, as key_id ints)."""
        try:        # every address one frame, each seen before (most stacks): one pass in C
            return tuple(map(self._addr_key.__getitem__, addresses))
        except KeyError:
            return tuple(chain.from_iterable(map(self._keys_of, addresses)))

    def labels(self, frames: tuple[int, ...] | list[int]) -> list[str]:
        return [self.frame(a).name() for a in frames]


def _name(raw: Any) -> str | None:
    """A symbol as readers show it: demangled; None when unknown (or only an address)."""
    return _name_part(raw)[0]


# A split part a demangler (or an agent's symbolizer) already printed: "f(int) [clone .cold]",
# "f(int) (.cold)".
_DEMANGLED_PART = re.compile(r"(?:\s*(?:\[clone \.([\w.]+)\]|\(\.([\w.]+)\)))+$")


def _name_part(raw: Any) -> tuple[str | None, str | None]:
    """A symbol as readers show it, and the compiler's part of it: a split-off piece of a function
    (``main.cold``, ``f.part.0``, ``g.isra.0``) is named by its parent function, as addr2line
    names it from the debug information; the part is kept beside it."""
    if not raw or not isinstance(raw, str) or raw.startswith("0x"):
        return None, None
    base, part = split_part(raw)
    name = demangle(base)
    m = _DEMANGLED_PART.search(name)
    if m is not None and m.start() > 0:
        parts = re.findall(r"\[clone \.([\w.]+)\]|\(\.([\w.]+)\)", m.group())
        extra = ".".join(a or b for a, b in parts)
        name = name[:m.start()]
        part = f"{part}.{extra}" if part else extra
    return name, part
