"""Host-side symbolization of Linux modules (ELF), so a local target pays nothing for it.

On the local device every module path is readable by memtrace itself, so return
addresses are resolved from the ELF symbol tables here, once per address --
even after the target has died.  Remote devices (iOS) symbolize in the agent.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from memtrace.analyze.symbols import ModuleMap


class ElfSymbols:
    """Function symbols of one ELF file, by virtual address."""

    def __init__(self, path: str) -> None:
        self.starts: list[int] = []
        self.entries: list[tuple[int, int, str]] = []
        self.load_bias = 0
        try:
            with open(path, "rb") as f:
                elf = ELFFile(f)
                loads = [s["p_vaddr"] & ~0xFFF for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
                self.load_bias = min(loads) if loads else 0
                seen: dict[int, tuple[int, int, str]] = {}
                for section in elf.iter_sections():
                    if not isinstance(section, SymbolTableSection):
                        continue
                    for sym in section.iter_symbols():
                        if sym["st_info"]["type"] not in ("STT_FUNC", "STT_GNU_IFUNC") or not sym.name:
                            continue
                        value = sym["st_value"]
                        if value == 0:
                            continue
                        old = seen.get(value)
                        # Prefer the public name over local aliases at one address.
                        if old is None or (sym["st_info"]["bind"] == "STB_GLOBAL" and old[2].startswith("_")):
                            seen[value] = (value, max(sym["st_size"], 1), sym.name)
                for value in sorted(seen):
                    self.starts.append(value)
                    self.entries.append(seen[value])
        except (OSError, ELFError, ValueError):
            pass

    def lookup(self, vaddr: int) -> str | None:
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i < 0:
            return None
        start, size, name = self.entries[i]
        return name if vaddr < start + size else None


class HostSymbolizer:
    """Resolves addresses against the modules a target announced, read from their ELF files."""

    def __init__(self, modules: ModuleMap) -> None:
        self.modules = modules
        self._elves: dict[str, ElfSymbols] = {}

    def symbolize(self, addresses: list[int]) -> list[list[Any]]:
        """Rows in the agent's shape: [address, module, offset, symbol, file, line]."""
        rows = []
        for a in addresses:
            m = self.modules.find(a)
            if m is None:
                rows.append([hex(a), None, None, None, None, None])
                continue
            offset = a - m.base
            elf = self._elves.get(m.path)
            if elf is None:
                elf = self._elves[m.path] = ElfSymbols(m.path) if Path(m.path).is_file() else ElfSymbols("")
            # A return address points after its call: look up the call itself.
            name = elf.lookup(offset - 1 + elf.load_bias)
            rows.append([hex(a), m.name, offset, name, None, None])
        return rows
