"""What a binary says about itself: format, identity and where its debug information went.

ELF: the GNU build-id note, the ``.gnu_debuglink`` (file name + CRC32 of the debug file) and the
first PT_LOAD address, read with pyelftools from headers only (cheap, whatever the file's size).
Mach-O identities (LC_UUID, per architecture) come from symbolic, which reads fat files too.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ELF_MAGIC = b"\x7fELF"
MACHO_MAGICS = (b"\xfe\xed\xfa\xce", b"\xce\xfa\xed\xfe", b"\xfe\xed\xfa\xcf", b"\xcf\xfa\xed\xfe",
                b"\xca\xfe\xba\xbe", b"\xbe\xba\xfe\xca")


def file_format(path: str | Path) -> str | None:
    """``"elf"``, ``"macho"`` or None (not a binary, or unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    if head == ELF_MAGIC:
        return "elf"
    if head in MACHO_MAGICS:
        return "macho"
    return None


@dataclass(frozen=True, slots=True)
class ElfIdentity:
    build_id: str | None            # lowercase hex
    debuglink: str | None           # file name from .gnu_debuglink
    debuglink_crc: int | None
    first_load: int                 # p_vaddr of the first PT_LOAD segment
    has_dwarf: bool                 # .debug_info with contents (not NOBITS, as in a stripped file)
    has_symtab: bool                # a full .symtab (not only .dynsym)

    @property
    def page_offset(self) -> int:
        """How far past its page the first segment starts: a module's base is that page, while
        symbol addresses count from the segment itself."""
        return self.first_load & 0xFFF


def elf_identity(path: str | Path) -> ElfIdentity | None:
    # pyelftools is imported when first needed: not on a capture's way to the target's start.
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import NoteSection

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            build_id = None
            debuglink = crc = None
            has_dwarf = has_symtab = False
            for section in _sections_named(elf):
                kind = section["sh_type"]
                if kind == "SHT_NOTE" and isinstance(section, NoteSection):
                    for note in section.iter_notes():
                        # Type 3 is the build-id only in a GNU note (SystemTap's stapsdt notes,
                        # libstdc++'s, reuse the number).
                        if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                            build_id = str(note["n_desc"]).lower()
                elif section.name == ".gnu_debuglink" and not section.compressed:
                    data = section.data()
                    end = data.find(b"\0")
                    if end > 0:
                        debuglink = data[:end].decode("utf-8", "replace")
                        at = (end + 4) & ~3
                        if at + 4 <= len(data):
                            crc = int.from_bytes(data[at:at + 4], "little" if elf.little_endian else "big")
                elif section.name in (".debug_info", ".zdebug_info") and kind != "SHT_NOBITS":
                    has_dwarf = section["sh_size"] > 0
                elif kind == "SHT_SYMTAB":
                    has_symtab = section["sh_size"] > 0
            loads = [s["p_vaddr"] for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
            return ElfIdentity(build_id, debuglink, crc, loads[0] if loads else 0, has_dwarf, has_symtab)
    except (OSError, ELFError, ValueError, KeyError):
        return None


SHF_COMPRESSED = 0x800


class _Header:
    """A section by its header alone (name, type, size): what elf_identity reads of every section
    but the notes and the debug link, whose data it needs."""

    __slots__ = ("header", "name")

    def __init__(self, header: Any, name: str) -> None:
        self.header, self.name = header, name

    def __getitem__(self, key: str) -> Any:
        return self.header[key]

    @property
    def compressed(self) -> bool:
        return bool(self.header["sh_flags"] & SHF_COMPRESSED)


def _sections_named(elf: Any, made: Callable[[Any, str], bool] | None = None) -> Iterator[Any]:
    """elf's sections, each made into pyelftools' section object only when elf_identity reads its
    data (notes, .gnu_debuglink): making every one parses whole tables -- a .gnu.hash section's
    alone was 60 % of symbolizing cc1plus's 9,783 addresses with every SymCache cached (issue 21:
    fixed cost); ``made(header, name)`` says which others to make.  pyelftools' header readers are
    private: without them, every section is made."""
    header_of = getattr(elf, "_get_section_header", None)
    name_of = getattr(elf, "_get_section_name", None)
    if header_of is None or name_of is None:
        yield from elf.iter_sections()
        return
    for i in range(elf.num_sections()):
        header = header_of(i)
        name = name_of(header)
        if header["sh_type"] == "SHT_NOTE" or name == ".gnu_debuglink" or (made is not None and made(header, name)):
            yield elf.get_section(i)
        else:
            yield _Header(header, name)


# A compressed debug section may say it holds at most this much: zlib's deflate cannot pack more
# than 1032:1, and no debug section of a real binary nears 4 GiB.  A larger claim is a damaged or
# hostile file; decompressing it would take the machine's memory (and abort the symbolizer).
MAX_DEFLATE_RATIO = 1032
MAX_DEBUG_SECTION = 4 << 30


def compressed_section_problem(path: str | Path) -> str | None:
    """Why ``path``'s compressed debug sections must not be opened (one phrase), or None: one
    claims more than its compressed bytes can hold or more than MAX_DEBUG_SECTION."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            # Only a compressed section's object is made (its header says how much it holds).
            for section in _sections_named(elf, lambda h, _name: bool(h["sh_flags"] & SHF_COMPRESSED)):
                if section["sh_type"] == "SHT_NOBITS":
                    continue
                packed = section["sh_size"]
                if section.compressed:
                    claimed = section.data_size
                elif section.name.startswith(".zdebug"):
                    f.seek(section["sh_offset"])
                    head = f.read(12)
                    if len(head) < 12 or head[:4] != b"ZLIB":
                        continue
                    claimed = int.from_bytes(head[4:], "big")
                else:
                    continue
                if claimed > MAX_DEBUG_SECTION or claimed > packed * MAX_DEFLATE_RATIO + (1 << 16):
                    return (f"compressed section {section.name} claims {claimed} bytes from {packed}: "
                            f"more than compression can give (not opened)")
    except (OSError, ELFError, ValueError, KeyError):
        return None                 # not an ELF file pyelftools reads: the symbolizer says what it is
    return None


def file_crc32(path: str | Path) -> int:
    """The CRC a ``.gnu_debuglink`` records for its debug file (zlib's CRC-32, whole file)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc & 0xFFFFFFFF
