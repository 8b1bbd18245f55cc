"""The symbolization service: return addresses -> SYMBOLS rows, each address resolved once.

A row is ``[address_hex, module, offset, function, file, line, inlined?]``: ``function`` is the
containing (outermost) function and ``file``/``line`` the position inside it -- the call site of
the outermost inlined call when there is one; ``inlined`` (only present when there are inlined
calls) lists ``[function, file, line]`` innermost first.  Names are kept as the binary spells
them (mangled for C++ and Swift, like the agent's rows): nothing is lost, and readers demangle
(``SymbolTable.frames_of``).  ``module`` and ``offset`` are always kept, so a capture can be
symbolized again later from the files alone.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from memtrace.symbols.locate import SYSTEM_DEBUG_DIRS, Locator, ModuleRef, Source
from memtrace.symbols.objc import ObjcNames
from memtrace.symbols.objects import Location, SymbolFiles

if TYPE_CHECKING:
    from memtrace.symbols.device import DeviceSymbols


class AnnouncedModule(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def base(self) -> int: ...


class ModuleMap(Protocol):
    """What the symbolizer reads of analyze.symbols.ModuleMap (a protocol: no import back up)."""

    def find(self, address: int) -> AnnouncedModule | None: ...


@dataclass(slots=True)
class Usage:
    """What one module's source did for the addresses in it."""

    module: str
    source: Source
    addresses: int = 0
    named: int = 0
    with_lines: int = 0
    inlined: int = 0
    reported: bool = False


class Symbolizer:
    """Resolves addresses against the modules a target announced, from files on this machine."""

    def __init__(self, modules: ModuleMap, symbol_dirs: Sequence[Path | str] = (), arch: str | None = None,
                 ids: dict[str, tuple[str, ...]] | None = None,
                 system_dirs: Sequence[Path] = SYSTEM_DEBUG_DIRS, device_symbols: DeviceSymbols | None = None) -> None:
        self.modules = modules
        self.files = SymbolFiles()
        self.locator = Locator(self.files, symbol_dirs, system_dirs, arch)
        self.ids = ids or {}                    # module name -> build-ids / UUIDs the capture recorded
        self._usage: dict[tuple[str, str], Usage] = {}
        self._rows: dict[int, list[Any]] = {}
        self._objc: dict[str, ObjcNames | None] = {}      # Mach-O path -> its Objective-C method names
        self.device_symbols = device_symbols                # an iOS device's shared-cache symbols, by UUID

    def symbolize(self, addresses: Iterable[int]) -> list[list[Any]]:
        """Rows for ``addresses`` (return addresses: each is looked up one byte back)."""
        return [self.row(a) for a in addresses]

    def row(self, address: int) -> list[Any]:
        r = self._rows.get(address)
        if r is None:
            m = self.modules.find(address)
            if m is None:
                r = [hex(address), None, None, None, None, None]
            else:
                r = self.resolve(m.name, m.path, address, address - m.base)
            self._rows[address] = r
        return r

    def resolve(self, module: str, path: str, address: int, offset: int) -> list[Any]:
        """One address by its module and offset (also for rows whose module map is gone)."""
        usage = self._usage_of(module, path)
        usage.addresses += 1
        row: list[Any] = [hex(address), module, offset, None, None, None]
        src = usage.source
        rel = offset - 1 - src.slide                 # a return address points after its call
        if src.symbols is None or rel < 0:
            if self.device_symbols is not None and self.ids.get(module):
                row[3] = self.device_symbols.name(self.ids[module], offset)
                usage.named += row[3] is not None
            return row
        locs = src.symbols.lookup(rel)
        method = self._objc_method(src, rel, locs)
        if method is not None:
            row[3] = method
            usage.named += 1
            return row
        if not locs:
            return row
        outer = locs[-1]
        row[3:6] = [self._name(outer, src, rel), outer.file, outer.line]
        usage.named += 1
        usage.with_lines += outer.line is not None
        if len(locs) > 1:
            # Same adjusted address: the inlined calls at the call instruction, innermost first.
            row.append([[x.name, x.file, x.line] for x in locs[:-1]])
            usage.inlined += 1
        return row

    def images(self, new_only: bool = False) -> list[dict[str, Any]]:
        """The files used, per module, with their identity: what a later ``memtrace symbolize``
        checks a file against before trusting it (``new_only``: those not listed before)."""
        out = []
        for u in self._usage.values():
            if not (new_only and u.reported):
                u.reported = True
                out.append(_image(u))
        return out

    def usage(self) -> list[dict[str, Any]]:
        """Each image with what it did: addresses, named, with file:line, with inlined calls."""
        return [{**_image(u), "addresses": u.addresses, "named": u.named, "with_lines": u.with_lines,
                 "inlined": u.inlined} for u in self._usage.values()]

    @property
    def load_seconds(self) -> float:
        return self.files.load_s

    def cache_counts(self) -> dict[str, int]:
        """The symbol store's hits, SymCaches built and entries rejected (symbols/store.py)."""
        store = self.files.store
        return store.counts() if store is not None else {"hits": 0, "built": 0, "rejected": 0}

    # -- internals -------------------------------------------------------------

    def _usage_of(self, module: str, path: str) -> Usage:
        key = (module, path)
        u = self._usage.get(key)
        if u is None:
            try:
                source = self.locator.find(ModuleRef(module, path, self.ids.get(module, ())))
            except Exception as e:  # noqa: BLE001 -- a malformed file must not end a capture
                source = Source(None, "none", note=f"{path or module}: unreadable ({type(e).__name__}: {e})")
            u = self._usage[key] = Usage(module, source)
        return u

    def _objc_method(self, src: Source, rel: int, locs: list[Location]) -> str | None:
        """``-[Class selector]`` for an address in a stripped Mach-O's Objective-C method: where the
        symbol files say nothing, or name a function that does not start where this one does (the
        nearest export of a stripped binary).  Symbols with lines (a dSYM) are trusted as they are."""
        if locs and (locs[-1].line is not None or src.symbols is None):
            return None
        names = self._objc_names(src)
        hit = names.lookup(rel) if names is not None else None
        if hit is None or (locs and locs[-1].sym_addr == hit[1]):
            return None
        return hit[0]

    def _objc_names(self, src: Source) -> ObjcNames | None:
        for f in (src.exports, src.symbols):
            if f is None or f.file_format != "macho":
                continue
            if f.path not in self._objc:
                try:
                    names: ObjcNames | None = ObjcNames(f.path, f.arch)
                except (OSError, ValueError, struct.error):
                    names = None
                self._objc[f.path] = names if names else None
            if self._objc[f.path] is not None:
                return self._objc[f.path]
        return None

    @staticmethod
    def _name(outer: Location, src: Source, rel: int) -> str | None:
        name = outer.name
        # Debug files' symbol tables hold every local alias of a function (__GI___libc_malloc,
        # __libc_start_main_alias_2); the module's own exported name at the same start wins.
        if src.exports is not None and outer.sym_addr is not None:
            exported = src.exports.lookup(rel)
            if exported and exported[-1].sym_addr == outer.sym_addr and exported[-1].name:
                name = exported[-1].name
        return name


def _image(u: Usage) -> dict[str, Any]:
    f = u.source.symbols
    return {"module": u.module, "file": f.path if f else None, "how": u.source.how,
            "id": (f.code_id or f.debug_id) if f else None, "arch": f.arch if f else None,
            "lines": bool(f and f.has_lines), "note": u.source.note,
            "symcache": None if f is None else "stored" if f.stored else "built"}


# The capture-time entry point the session uses (local targets: modules readable here).
HostSymbolizer = Symbolizer
