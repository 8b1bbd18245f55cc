"""What every analyzer reads the same way: who/what/how it ended, recon, calibration, symbols."""

from __future__ import annotations

from typing import Any, Protocol

from memtrace.analyze.symbols import SymbolTable
from memtrace.capture import Record, RecordType


class HasContext(Protocol):
    meta: dict[str, Any]
    end: dict[str, Any]
    recon: list[dict[str, Any]]
    missing: list[str]
    symbols: SymbolTable
    warnings: list[dict[str, Any]]


def fold_context(s: HasContext, rec: Record) -> bool:
    """Fold a record every tracer shares into ``s``; False when the record is the tracer's own."""
    t = rec.type
    if t == RecordType.SYMBOLS:
        s.symbols.add_rows(rec.body.get("rows", []))
    elif t == RecordType.MODULES:
        s.symbols.add_modules(rec.body.get("modules", []))
    elif t == RecordType.META:
        s.meta = rec.body
    elif t == RecordType.RECON:
        s.recon = rec.body.get("symbols", [])
        s.missing = [r["name"] for r in s.recon if r.get("status") == "MISSING"]
        if hasattr(s, "info"):
            s.info = rec.body.get("info", {})
    elif t == RecordType.CALIBRATION:
        if hasattr(s, "calibration"):
            s.calibration[rec.body.get("phase", "?")] = rec.body
    elif t == RecordType.END:
        s.end = rec.body      # the last END wins (a batch may append its verdict)
    elif t == RecordType.WARNING:
        s.warnings.append(rec.body)
    else:
        return False
    return True
