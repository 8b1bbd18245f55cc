"""Unwind tables for code built without frame pointers, computed on the host.

glibc and libstdc++ (and any program built with the compiler's default -fomit-frame-pointer)
keep no frame-pointer chain, so the agent's frame-pointer walk loses the caller of ``strdup``,
``operator new`` or a ``qsort`` callback.  Their call frame information (``.eh_frame``) says, for
every instruction, where the frame's return address and the caller's frame pointer are.  Sentry's
symbolic reads it (``CfiCache``: Breakpad's ``STACK CFI`` text); this module folds those rules into
the compact rows of :data:`memtrace.layout.UNWIND_ROW` that the agent's C walk
(``cmodule/unwind.c``) binary-searches: per code range, CFA = SP or FP + offset, return address at
CFA - 8, frame pointer unchanged or saved at CFA - 8k.  Anything the walk cannot follow
(register-based CFAs of ``__longjmp``, expressions) becomes a row that stops the walk there.

Modules whose code keeps frame pointers get no table: the plain walk is exact and cheaper there.
x86-64 only (the agent asks for nothing elsewhere: Apple arm64 keeps frame records by ABI).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import io
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from symbolic.cfi import CfiCache
from symbolic.debuginfo import Archive
from symbolic.exceptions import SymbolicError

from memtrace.files import write_bytes_atomic
from memtrace.layout import UNWIND_CFA_FP, UNWIND_CFA_SP, UNWIND_INDEX_SHIFT, UNWIND_NONE, UNWIND_ROW
from memtrace.symbols.binaries import compressed_section_problem

ROW = struct.Struct(UNWIND_ROW.format)
# A module whose functions set up a frame pointer at least this often is walked by frame pointer.
FRAME_POINTER_SHARE = 0.5
_RULE = re.compile(r"(\.cfa|\.ra|\$?\w+):")
_NONE = (UNWIND_NONE, 0, 0)


@dataclass(frozen=True)
class UnwindTable:
    """One module's rows (packed :data:`UNWIND_ROW` records), their index (u32 row numbers per
    ``1 << UNWIND_INDEX_SHIFT`` bytes of code) and what was learned building them."""

    rows: bytes
    n_rows: int
    index: bytes
    n_index: int
    functions: int             # functions with call frame information
    frame_pointer_share: float  # of those that build a frame, the share that set up a frame pointer
    build_s: float

    @property
    def keeps_frame_pointers(self) -> bool:
        return self.frame_pointer_share >= FRAME_POINTER_SHARE


def _parse_rules(text: str) -> dict[str, list[str]]:
    """``.cfa: $rsp 16 + $rbp: .cfa -16 + ^`` -> {'.cfa': ['$rsp', '16', '+'], '$rbp': [...]}."""
    parts = _RULE.split(text)
    return {parts[i]: parts[i + 1].split() for i in range(1, len(parts) - 1, 2)}


class _Function:
    """Rules in force while reading one ``STACK CFI INIT`` block (later lines change some)."""

    def __init__(self) -> None:
        self.cfa: tuple[int, int] | None = None      # (register, offset)
        self.ra_ok = False
        self.fp: int | None = 0                      # 0: unchanged, k: at CFA - 8k, None: unknown
        self.frame_pointer = False                   # some rule defines the CFA from the frame pointer
        self.builds_frame = False                    # the CFA moves (the function pushes something)

    def apply(self, rules: dict[str, list[str]]) -> None:
        for reg, expr in rules.items():
            if reg == ".cfa":
                if len(expr) == 3 and expr[2] == "+" and expr[0] in ("$rsp", "$rbp"):
                    try:
                        self.cfa = (UNWIND_CFA_SP if expr[0] == "$rsp" else UNWIND_CFA_FP, int(expr[1]))
                    except ValueError:
                        self.cfa = None
                    if self.cfa is not None and (self.cfa[0] == UNWIND_CFA_FP or self.cfa[1] != 8):
                        self.builds_frame = True
                        self.frame_pointer |= self.cfa[0] == UNWIND_CFA_FP
                else:
                    self.cfa = None
            elif reg == ".ra":
                self.ra_ok = expr == [".cfa", "-8", "+", "^"]
            elif reg == "$rbp":
                self.fp = _saved_at(expr)

    def row(self) -> tuple[int, int, int]:
        if self.cfa is None or not self.ra_ok or self.fp is None:
            return _NONE
        reg, off = self.cfa
        if not 0 < off <= 0xFFFF or off % 8:
            return _NONE
        return (reg, off, self.fp)


def _saved_at(expr: list[str]) -> int | None:
    """The frame pointer's rule: 0 when it keeps its value, k when saved at CFA - 8k."""
    if expr == ["$rbp"]:
        return 0
    if len(expr) == 4 and expr[0] == ".cfa" and expr[2] == "+" and expr[3] == "^":
        try:
            off = -int(expr[1])
        except ValueError:
            return None
        if off > 0 and off % 8 == 0 and off // 8 <= 0xFF:
            return off // 8
    return None


def rows_from_breakpad(text: str) -> tuple[list[tuple[int, int, int, int]], int, float]:
    """Rows (start, cfa_reg, cfa_offset, fp_slot) sorted by start, from ``STACK CFI`` lines;
    the number of functions and the share of frame-building functions that use a frame pointer."""
    blocks: list[tuple[int, int, list[tuple[int, tuple[int, int, int]]]]] = []
    fn: _Function | None = None
    current: list[tuple[int, tuple[int, int, int]]] = []
    building = fp_using = 0

    def close() -> None:
        nonlocal building, fp_using
        if fn is not None:
            building += fn.builds_frame
            fp_using += fn.builds_frame and fn.frame_pointer

    for line in text.splitlines():
        if not line.startswith("STACK CFI "):
            continue
        words = line.split(maxsplit=4)
        if words[2] == "INIT":
            close()
            start, size = int(words[3], 16), int(words[4].split(maxsplit=1)[0], 16)
            fn = _Function()
            fn.apply(_parse_rules(words[4].split(maxsplit=1)[1] if " " in words[4] else ""))
            current = [(start, fn.row())]
            blocks.append((start, start + size, current))
        elif fn is not None:
            rest = line.split(maxsplit=3)
            fn.apply(_parse_rules(rest[3] if len(rest) > 3 else ""))
            current.append((int(rest[2], 16), fn.row()))
    close()

    blocks.sort(key=lambda b: b[0])
    rows: list[tuple[int, int, int, int]] = []
    for i, (start, end, lines) in enumerate(blocks):
        for addr, rule in lines:
            if start <= addr < end:
                rows.append((addr, *rule))
        following = blocks[i + 1][0] if i + 1 < len(blocks) else None
        if following is None or following > end:
            rows.append((end, *_NONE))        # code past the function: no rule
    # Collapse: one row per change, the last rule at an address wins.
    out: list[tuple[int, int, int, int]] = []
    for r in rows:
        if out and out[-1][0] == r[0]:
            out[-1] = r
        elif not out or out[-1][1:] != r[1:]:
            out.append(r)
    share = fp_using / building if building else 0.0
    return out, len(blocks), share


def pack_rows(rows: list[tuple[int, int, int, int]]) -> bytes:
    return b"".join(ROW.pack(start, off, reg, fp) for start, reg, off, fp in rows)


def row_index(starts: list[int]) -> list[int]:
    """Entry b: the last row starting at or before ``b << UNWIND_INDEX_SHIFT`` (0 when none)."""
    if not starts:
        return []
    return [max(0, bisect.bisect_right(starts, b << UNWIND_INDEX_SHIFT) - 1)
            for b in range((starts[-1] >> UNWIND_INDEX_SHIFT) + 1)]


def make_table(rows: list[tuple[int, int, int, int]], functions: int, share: float, build_s: float) -> UnwindTable:
    rows = [r for r in rows if r[0] <= 0xFFFFFFFF]
    index = row_index([r[0] for r in rows])
    return UnwindTable(pack_rows(rows), len(rows), struct.pack(f"<{len(index)}I", *index), len(index),
                       functions, share, build_s)


def build_table(path: str | Path) -> UnwindTable | None:
    """The unwind table of one x86-64 ELF file; None when it has no call frame information or is
    not something symbolic can read."""
    t = time.perf_counter()
    if compressed_section_problem(path) is not None:
        return None                 # a section claiming terabytes would abort symbolic's decompression
    try:
        objects = list(Archive.open(str(path)).iter_objects())
    except (SymbolicError, OSError):
        return None
    obj = next((o for o in objects if o.arch == "x86_64"), None)
    if obj is None or obj.file_format != "elf":
        return None
    try:
        cache = CfiCache.from_object(obj)
    except SymbolicError:
        return None
    buf = io.BytesIO()
    cache.write_to(buf)
    rows, functions, share = rows_from_breakpad(buf.getvalue().decode("ascii", "replace"))
    if functions == 0:
        return None
    return make_table(rows, functions, share, time.perf_counter() - t)


# ---- the host side of a capture ------------------------------------------------------------------

CACHE_FORMAT = 2
_CACHE_HEADER = struct.Struct("<IIIId")     # format, rows, index entries, functions, frame_pointer_share


class TableCache:
    """Tables by file identity (path, size, mtime), in memory and on disk beside the agent cache,
    so libc's table (~0.15 s to build) is built once per machine, not once per capture."""

    def __init__(self, cache_dir: Path | None) -> None:
        self.dir = cache_dir
        self.memory: dict[tuple[str, int, int], UnwindTable | None] = {}

    def get(self, path: str) -> UnwindTable | None:
        try:
            st = Path(path).stat()
        except OSError:
            return None
        key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
        if key in self.memory:
            return self.memory[key]
        name = hashlib.sha256(repr((CACHE_FORMAT, *key)).encode()).hexdigest()[:24]
        table = self._read(name)
        if table is None:
            table = build_table(path)
            if table is not None:
                self._write(name, table)
        self.memory[key] = table
        return table

    def _read(self, name: str) -> UnwindTable | None:
        if self.dir is None:
            return None
        try:
            data = (self.dir / f"unwind-{name}.bin").read_bytes()
            fmt, n_rows, n_index, functions, share = _CACHE_HEADER.unpack_from(data)
        except (OSError, struct.error):
            return None
        split = _CACHE_HEADER.size + n_rows * ROW.size
        if fmt != CACHE_FORMAT or len(data) != split + 4 * n_index:
            return None
        return UnwindTable(data[_CACHE_HEADER.size:split], n_rows, data[split:], n_index, functions, share, 0.0)

    def _write(self, name: str, table: UnwindTable) -> None:
        if self.dir is None:
            return
        with contextlib.suppress(OSError):
            write_bytes_atomic(self.dir / f"unwind-{name}.bin",
                               _CACHE_HEADER.pack(CACHE_FORMAT, table.n_rows, table.n_index, table.functions,
                                                  table.frame_pointer_share) + table.rows + table.index)


@dataclass
class UnwindFeed:
    """Gives a local target's agent the tables of its modules that keep no frame pointers, at
    start and for each module loaded later; the other modules are listed without rows, so the
    walk recognizes them at once.  ``rpc(method, *args)`` calls the agent."""

    cache: TableCache
    loaded: list[str] = field(default_factory=list)           # modules walked through their tables
    frame_pointers: list[str] = field(default_factory=list)   # modules left to the frame-pointer walk
    no_table: list[str] = field(default_factory=list)         # no call frame information readable
    build_s: float = 0.0

    def feed(self, rpc: Callable[..., Any]) -> int:
        t = time.perf_counter()
        tables: list[tuple[dict[str, Any], UnwindTable]] = []
        plain: list[dict[str, Any]] = []
        for m in rpc("unwindModules") or []:
            entry = {"name": m["name"], "base": m["base"], "size": m["size"], "rows": 0, "index": 0}
            table = self.cache.get(m["path"])
            if table is not None and not table.keeps_frame_pointers:
                tables.append(({**entry, "rows": table.n_rows, "index": table.n_index}, table))
            else:
                (self.frame_pointers if table is not None else self.no_table).append(m["name"])
                plain.append(entry)
        # Tables first: the registry is bounded, and a module with none loses nothing by not being in it.
        entries = [e for e, _ in tables] + plain
        if entries:
            rpc("unwindLoad", entries, b"".join(b for _, tb in tables for b in (tb.rows, tb.index)))
            self.loaded += [e["name"] for e, _ in tables]
        self.build_s += time.perf_counter() - t
        return len(tables)

    def info(self) -> dict[str, Any]:
        return {"tables": self.loaded, "frame_pointers": self.frame_pointers, "no_table": self.no_table,
                "seconds": round(self.build_s, 3)}
