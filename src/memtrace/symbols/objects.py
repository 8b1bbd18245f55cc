"""Symbol files opened through Sentry's symbolic: one SymCache per object, built once per run.

A SymCache is symbolic's compact lookup table built from everything an object file knows:
.symtab/.dynsym or the Mach-O symbol table, DWARF line tables and inlined-subroutine trees.
``lookup`` answers one address with its frames, innermost (inlined) first, so file:line and
inlined calls cost one call into Rust per address instead of a DWARF walk in Python.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from symbolic.debuginfo import Archive, Object
from symbolic.exceptions import SymbolicError
from symbolic.symcache import SymCache

from memtrace.symbols.binaries import compressed_section_problem
from memtrace.symbols.store import SymCacheStore

# Frida's architecture names -> symbolic's (a dSYM of an arm64e process is usually arm64).
FRIDA_ARCH = {"arm64": ("arm64", "arm64e"), "x64": ("x86_64", "x86_64h"), "ia32": ("x86",), "arm": ("armv7",)}


@dataclass(frozen=True, slots=True)
class Location:
    """One frame an address resolves to (symbolic's SourceLocation, with empty values as None)."""

    name: str | None
    file: str | None
    line: int | None
    sym_addr: int | None            # start of the containing function; None for inlined frames


@dataclass(slots=True)
class SymbolFile:
    """One architecture of one file, ready for lookups by address relative to its load address."""

    path: str
    arch: str
    debug_id: str                   # Mach-O UUID / ELF build-id folded into a GUID (symbolic's form)
    code_id: str | None             # ELF build-id hex / Mach-O UUID hex
    features: frozenset[str]        # symtab, debug, unwind, sources
    file_format: str                # elf, macho, ...
    cache: SymCache = field(repr=False)
    stored: bool = False            # the SymCache came from the on-disk store (symbols/store.py)

    @property
    def has_lines(self) -> bool:
        return "debug" in self.features

    def lookup(self, rel: int) -> list[Location]:
        out = []
        for loc in self.cache.lookup(rel):
            sym_addr = loc.sym_addr if loc.sym_addr != 0xFFFFFFFF else None
            out.append(Location(loc.symbol or None, loc.full_path or None, loc.line or None, sym_addr))
        return out


class SymbolFiles:
    """Opens each file once and builds each object's SymCache once, for the whole run -- or not at
    all when ``store`` (default: the user's cache folder; None: no store) has it from a run before."""

    def __init__(self, store: SymCacheStore | None | bool = True) -> None:
        self.store: SymCacheStore | None = SymCacheStore() if store is True else (store or None)
        self._archives: dict[str, list[Object] | None] = {}
        self._files: dict[tuple[str, str], SymbolFile] = {}
        self.errors: dict[str, str] = {}
        self.load_s = 0.0

    def objects(self, path: str) -> list[Object]:
        """The objects (architectures) in ``path``; empty when it is no object file."""
        key = str(Path(path).resolve())
        if key not in self._archives:
            t = time.perf_counter()
            bomb = compressed_section_problem(key)
            try:
                if bomb is not None:
                    raise OSError(bomb)
                self._archives[key] = list(Archive.open(key).iter_objects())
            except (SymbolicError, OSError) as e:
                self._archives[key] = None
                self.errors[key] = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.load_s += time.perf_counter() - t
        return self._archives[key] or []

    def error_of(self, path: str) -> str:
        return self.errors.get(str(Path(path).resolve()), "not an object file")

    def select(self, path: str, debug_id: str | None = None, arch: str | None = None) -> Object | None:
        """The object matching ``debug_id`` (none if it does not match), else the one for ``arch``,
        else the only (or first) one."""
        objs = self.objects(path)
        if debug_id is not None:
            want = debug_id.lower().replace("-", "")
            return next((o for o in objs if o.debug_id.replace("-", "") == want
                         or (o.code_id or "").lower() == want), None)
        if arch is not None:
            names = FRIDA_ARCH.get(arch, (arch,))
            for name in names:
                for o in objs:
                    if o.arch == name:
                        return o
        return objs[0] if objs else None

    def load(self, path: str, obj: Object) -> SymbolFile | None:
        key = (str(Path(path).resolve()), obj.debug_id + "/" + obj.arch)
        f = self._files.get(key)
        if f is None:
            t = time.perf_counter()
            try:
                cache = self.store.get(obj) if self.store is not None else None
                stored = cache is not None
                if cache is None:
                    cache = obj.make_symcache()
                    if self.store is not None:
                        self.store.put(obj, cache)
            except SymbolicError as e:
                self.errors[key[0]] = str(e).splitlines()[0] if str(e) else type(e).__name__
                return None
            finally:
                self.load_s += time.perf_counter() - t
            f = self._files[key] = SymbolFile(key[0], obj.arch, obj.debug_id, obj.code_id, obj.features,
                                              obj.file_format, cache, stored)
        return f
