"""Finding the file that knows a module's symbols: the module itself, or its separate debug file.

Search order for an ELF module whose own file has no DWARF (a stripped or distro library):
  1. build-id: ``DIR/.build-id/xx/rest.debug`` under every ``--symbols`` DIR and /usr/lib/debug
     (the file's own build-id must match);
  2. ``.gnu_debuglink``: next to the module, in its ``.debug/``, under ``/usr/lib/debug/<its dir>/``
     and in every ``--symbols`` DIR (the CRC32 recorded in the link must match);
  3. by name in the ``--symbols`` DIRs (``NAME``, ``NAME.debug``), checked by build-id when known.
A Mach-O module (iOS: its file is on the device, stripped) is matched to a dSYM
(``X.dSYM/Contents/Resources/DWARF/X``), an ``.app`` bundle's binary or a plain file in the
``--symbols`` DIRs: by UUID where the capture knows it, by name otherwise (said so in ``how``).
When nothing better is found, the module's own symbol table is used and ``note`` says what was
looked for, so "no file:line" always comes with its reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from memtrace.symbols.binaries import elf_identity, file_crc32, file_format
from memtrace.symbols.objects import SymbolFile, SymbolFiles

SYSTEM_DEBUG_DIRS = (Path("/usr/lib/debug"),)


@dataclass(frozen=True, slots=True)
class ModuleRef:
    name: str
    path: str                        # where the target loaded it (may not exist on this machine)
    ids: tuple[str, ...] = ()        # build-ids / UUIDs the capture recorded for it


@dataclass(slots=True)
class Source:
    """Where one module's symbols come from."""

    symbols: SymbolFile | None       # None: nothing readable at all
    how: str                         # module file | build-id | debuglink | uuid | name (unverified) | none
    exports: SymbolFile | None = None  # the module's own file, when symbols came from elsewhere
    slide: int = 0                   # module offset -> address relative to the symbol file
    note: str | None = None          # why there is no better source (what was looked for)


def _norm_id(value: str) -> str:
    return value.lower().replace("-", "")


class Locator:
    def __init__(self, files: SymbolFiles, search: Sequence[Path | str] = (),
                 system_dirs: Sequence[Path] = SYSTEM_DEBUG_DIRS, arch: str | None = None) -> None:
        self.files = files
        self.search = [Path(p) for p in search]
        self.system_dirs = list(system_dirs)
        self.arch = arch
        self._index: dict[str, list[str]] | None = None

    # -- the search ------------------------------------------------------------

    def find(self, module: ModuleRef) -> Source:
        runtime = module.path if module.path and os.path.isfile(module.path) and os.access(module.path, os.R_OK) else None
        fmt = file_format(runtime) if runtime else None
        if runtime and fmt and module.ids and self.files.select(runtime, _norm_id(module.ids[0])) is None:
            # The file at that path is not the one the capture saw (a library updated since):
            # only the recorded identity may be trusted.
            return self._find_elsewhere(module, f"{runtime} is not the file the capture saw "
                                                f"(its id is not {module.ids[0]})")
        if fmt == "elf":
            return self._find_elf(module, runtime)  # type: ignore[arg-type]
        if fmt == "macho":
            return self._find_macho(module, runtime)  # type: ignore[arg-type]
        where = "not on this machine" if runtime is None else "not an object file"
        return self._find_elsewhere(module, f"{module.path or module.name}: {where}", exclude=runtime)

    def _find_elf(self, module: ModuleRef, runtime: str) -> Source:
        ident = elf_identity(runtime)
        own = self._load(runtime)
        slide = ident.page_offset if ident else 0
        if ident is not None and ident.has_dwarf and own is not None:
            return Source(own, "module file", slide=slide)
        build_id = ident.build_id if ident else None
        looked: list[str] = []
        for bid in ([build_id] if build_id else list(module.ids)):
            for cand in self._build_id_paths(bid):
                looked.append(str(cand))
                if cand.is_file() and (found := self._load(str(cand), want_id=bid)) is not None:
                    return Source(found, "build-id", own, slide)
        if ident is not None and ident.debuglink:
            for cand in self._debuglink_paths(runtime, ident.debuglink):
                looked.append(str(cand))
                if not cand.is_file() or (ident.debuglink_crc is not None
                                          and file_crc32(cand) != ident.debuglink_crc):
                    continue
                found = self._load(str(cand), want_id=build_id)
                if found is not None:
                    return Source(found, "debuglink", own, slide)
        for named in self._by_name(module.name):
            if named != runtime and (found := self._load(named, want_id=build_id)) is not None and found.has_lines:
                return Source(found, "build-id" if build_id else "name (unverified)", own, slide)
        if own is None:
            return Source(None, "none", note=f"{runtime}: unreadable ({self.files.error_of(runtime)})")
        what = f"build-id {build_id}" if build_id else "no build-id"
        note = f"no debug file ({what}; looked for {', '.join(looked) or 'nothing'})"
        return Source(own, "module file", slide=slide, note=note)

    # DEVICE-UNVERIFIED: the Mach-O paths are tested with binaries linked by ld64.lld and dSYMs
    # made by LLVM's dsymutil on Linux, and with captures shaped like an iPhone session's; not
    # yet with an Xcode build's dSYM against a capture from a device.
    def _find_macho(self, module: ModuleRef, runtime: str) -> Source:
        want = module.ids[0] if module.ids else None
        obj = self.files.select(runtime, want, self.arch)
        own = self.files.load(runtime, obj) if obj is not None else None
        if own is not None and own.has_lines:
            return Source(own, "module file")
        uuid = own.debug_id if own is not None else want
        found = self._search_named(module.name, uuid, exclude=runtime)
        if found is not None:
            return found
        if own is None:
            return Source(None, "none", note=f"{runtime}: no {self.arch or ''} object with the recorded UUID")
        return Source(own, "module file", note=f"no dSYM with UUID {uuid} named {module.name} in --symbols")

    def _find_elsewhere(self, module: ModuleRef, why: str, exclude: str | None = None) -> Source:
        """The module's own file is not usable here (a device's path): ids, then names."""
        for bid in module.ids:
            for cand in self._build_id_paths(bid):
                if cand.is_file() and (found := self._load(str(cand), want_id=bid)) is not None:
                    return Source(found, "build-id", slide=self._slide(str(cand)))
        named_source = self._search_named(module.name, module.ids[0] if module.ids else None, exclude=exclude)
        if named_source is not None:
            return named_source
        hint = f"no file named {module.name} in --symbols" if self.search else "give --symbols DIR"
        return Source(None, "none", note=f"{why}; {hint}")

    def _search_named(self, name: str, want_id: str | None, exclude: str | None) -> Source | None:
        """Best file called ``name`` in the --symbols dirs: id-verified first, then with DWARF."""
        best: Source | None = None
        for cand in self._by_name(name):
            if cand == exclude:
                continue
            found = self._load(cand, want_id=want_id)
            if found is None:
                continue
            how = "uuid" if want_id and found.file_format == "macho" else "build-id" if want_id else "name (unverified)"
            source = Source(found, how, slide=self._slide(cand))
            if found.has_lines:
                return source
            best = best or source
        return best

    # -- candidate paths -------------------------------------------------------

    def _build_id_paths(self, build_id: str) -> Iterator[Path]:
        bid = _norm_id(build_id)
        if len(bid) < 3:
            return
        rel = Path(bid[:2]) / f"{bid[2:]}.debug"
        for d in [*self.search, *self.system_dirs]:
            yield d / ".build-id" / rel
            if d.name == ".build-id":
                yield d / rel

    def _debuglink_paths(self, runtime: str, link: str) -> Iterator[Path]:
        here = Path(runtime).resolve().parent
        yield here / link
        yield here / ".debug" / link
        for d in self.system_dirs:
            yield d / here.relative_to(here.anchor) / link
        for d in self.search:
            yield d / link
        for p in self._by_name(link):
            yield Path(p)

    def _by_name(self, name: str) -> list[str]:
        if not self.search or not name:
            return []
        if self._index is None:
            self._index = {}
            for root in self.search:
                for p in _walk(root):
                    base = os.path.basename(p)
                    self._index.setdefault(base, []).append(p)
                    if base.endswith(".debug"):
                        self._index.setdefault(base[:-6], []).append(p)
        return self._index.get(name, [])

    # -- loading ---------------------------------------------------------------

    def _load(self, path: str, want_id: str | None = None) -> SymbolFile | None:
        obj = self.files.select(path, _norm_id(want_id) if want_id else None, self.arch)
        return self.files.load(path, obj) if obj is not None else None

    @staticmethod
    def _slide(path: str) -> int:
        if file_format(path) == "elf":
            ident = elf_identity(path)
            return ident.page_offset if ident else 0
        return 0


def _walk(root: Path) -> Iterator[str]:
    if root.is_file():
        yield str(root)
        return
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            yield os.path.join(dirpath, n)
