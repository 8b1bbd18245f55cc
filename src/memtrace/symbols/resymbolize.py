"""Symbolize a finished capture again, offline: every address it references, against its modules.

The capture's MODULES say where each module was loaded; its files are looked for on this
machine (the recorded path, separate debug files, and the ``--symbols`` folders: dSYMs, ``.app``
bundles, debug files, ``.build-id`` trees).  Rows the capture already had are kept when this
machine knows nothing better about their address (an iOS system library the agent named on the
device), so symbolizing again never loses a name.  The new table replaces the old SYMBOLS
records atomically; every other record is kept as it was.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrace.analyze.symbols import ModuleMap
from memtrace.capture import (
    REC_STACK,
    CaptureInfo,
    Record,
    RecordType,
    iter_agent_tuples,
    read_records,
    replace_records,
)
from memtrace.errors import InputError
from memtrace.symbols.service import Symbolizer

ROWS_PER_RECORD = 20000


@dataclass
class Referenced:
    """What a capture needs symbolized, in first-seen order."""

    addresses: dict[int, None] = field(default_factory=dict)
    old_rows: dict[int, list[Any]] = field(default_factory=dict)
    modules: ModuleMap = field(default_factory=ModuleMap)
    paths: dict[str, str] = field(default_factory=dict)            # module name -> path
    ids: dict[str, tuple[str, ...]] = field(default_factory=dict)  # module name -> build-ids / UUIDs
    arch: str | None = None

    def add(self, address: int) -> None:
        self.addresses.setdefault(address, None)

    def fold(self, rec: Record) -> None:
        t = rec.type
        if t == RecordType.BATCH:
            for r in iter_agent_tuples(rec.data):
                if r[0] == REC_STACK:
                    for a in r[4]:
                        self.add(a)
        elif t == RecordType.EVENTS:
            for ev in rec.body.get("events", []):
                for a in ev.get("frames") or ():
                    self.add(_addr(a))
                routine = ev.get("routine")
                if isinstance(routine, str | int):
                    # A start routine is a function's first byte; rows hold it one byte in, as
                    # every address is read as a return address (the session does the same).
                    self.add(_addr(routine) + 1)
        elif t == RecordType.SYMBOLS:
            for row in rec.body.get("rows", []):
                a = _addr(row[0])
                self.old_rows[a] = row
                self.add(a)
            for image in rec.body.get("images") or ():
                if image.get("id") and image.get("module"):
                    self._add_id(image["module"], image["id"])
        elif t == RecordType.MODULES:
            mods = rec.body.get("modules", [])
            self.modules.add(mods)
            for m in mods:
                self.paths.setdefault(m["name"], m.get("path") or "")
                for key in ("build_id", "uuid"):
                    if m.get(key):
                        self._add_id(m["name"], m[key])
        elif t == RecordType.RECON:
            self.arch = (rec.body.get("device") or {}).get("arch") or self.arch

    def _add_id(self, module: str, value: str) -> None:
        have = self.ids.get(module, ())
        if value not in have:
            self.ids[module] = (*have, value)


@dataclass
class Outcome:
    capture: Path
    addresses: int = 0
    named: int = 0
    with_lines: int = 0
    inlined: int = 0
    kept: int = 0                  # names the capture had that this machine could not redo
    unresolved: int = 0
    images: list[dict[str, Any]] = field(default_factory=list)
    truncated: str | None = None
    timing: dict[str, float] = field(default_factory=dict)
    symbol_cache: dict[str, int] = field(default_factory=dict)     # symbols/store.py's counts

    def to_json(self) -> dict[str, Any]:
        return {"capture": str(self.capture), "addresses": self.addresses, "named": self.named,
                "with_lines": self.with_lines, "inlined": self.inlined, "kept": self.kept,
                "unresolved": self.unresolved, "images": self.images, "truncated": self.truncated,
                "timing": self.timing, "symbol_cache": self.symbol_cache}


def check_symbol_dirs(dirs: Iterable[Path]) -> list[Path]:
    out = []
    for d in dirs:
        if not d.exists():
            raise InputError(f"--symbols {d}: no such file or folder")
        if not os.access(d, os.R_OK | (os.X_OK if d.is_dir() else 0)):
            raise InputError(f"--symbols {d}: cannot read it (permission denied)")
        out.append(d)
    return out


def resymbolize(capture: Path, symbol_dirs: Iterable[Path] = (), device_symbols: Path | None = None) -> Outcome:
    """``device_symbols``: a DeviceSupport ``Symbols`` folder (symbols/device.py) naming an iOS
    capture's system frames by their modules' UUIDs."""
    t0 = time.perf_counter()
    dirs = check_symbol_dirs(symbol_dirs)
    info = CaptureInfo(capture)
    refs = Referenced()
    for rec in read_records(capture, info):
        refs.fold(rec)
    t_read = time.perf_counter()
    out = Outcome(info.path, truncated=info.problem)
    device = None
    if device_symbols is not None:
        from memtrace.symbols.device import DeviceSymbols

        device = DeviceSymbols(device_symbols)
    sym = Symbolizer(refs.modules, dirs, arch=refs.arch, ids=refs.ids, device_symbols=device)
    rows = []
    for a in refs.addresses:
        old = refs.old_rows.get(a)
        if refs.modules.find(a) is not None:
            row = sym.row(a)
        elif old is not None and old[1] is not None and old[2] is not None:
            # The module map lost this range (or never had it): module + offset still place it.
            row = sym.resolve(old[1], refs.paths.get(old[1], ""), a, int(old[2]))
        else:
            row = [hex(a), None, None, None, None, None]
        if row[3] is None and old is not None and len(old) > 3 and old[3]:
            row = list(old)
            out.kept += 1
        rows.append(row)
        out.named += row[3] is not None
        out.with_lines += len(row) > 5 and bool(row[4]) and row[5] is not None
        out.inlined += len(row) > 6 and bool(row[6])
    out.addresses = len(rows)
    out.unresolved = out.addresses - out.named
    out.images = sym.usage()
    out.symbol_cache = sym.cache_counts()
    t_resolved = time.perf_counter()
    bodies: list[dict[str, Any]] = [{"rows": rows[i:i + ROWS_PER_RECORD], "by": "memtrace symbolize"}
              for i in range(0, len(rows), ROWS_PER_RECORD)] or [{"rows": [], "by": "memtrace symbolize"}]
    bodies[0]["images"] = sym.images()
    replace_records(info.path, RecordType.SYMBOLS, bodies)
    t_end = time.perf_counter()
    out.timing = {"total_s": round(t_end - t0, 3), "read_s": round(t_read - t0, 3),
                  "symbolize_s": round(t_resolved - t_read, 3), "load_s": round(sym.load_seconds, 3),
                  "write_s": round(t_end - t_resolved, 3)}
    return out


def _addr(value: str | int) -> int:
    return int(value, 16) if isinstance(value, str) else int(value)
