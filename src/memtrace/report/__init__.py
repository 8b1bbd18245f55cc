"""``memtrace report``: a folder of captures -> REPORT.md and report.json (the same numbers).

Stages: :mod:`.collect` finds files and reduces each capture through its tracer's analyzer to a
compact entry (one streaming pass, memory bounded by distinct stacks); :mod:`.aggregate` merges
entries per target and computes the panorama and findings into one document; :mod:`.markdown`
renders that document.  Both outputs are written atomically (temp file + ``os.replace``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrace.analyze.families import load_rules
from memtrace.errors import InputError
from memtrace.files import write_text_atomic
from memtrace.report.aggregate import build_document
from memtrace.report.collect import Skipped, analyze_capture, discover, load_document
from memtrace.report.markdown import render

__all__ = ["ReportResult", "build_report"]


@dataclass
class ReportResult:
    document: dict[str, Any]
    markdown: str
    skipped: list[Skipped] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        # 1 when anything was skipped (even partly read), so scripts notice an incomplete report.
        return 1 if self.skipped else 0


def build_report(folder: Path | str, out: Path | str | None = None, families: Path | str | None = None,
                 write: bool = True) -> ReportResult:
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"{root}: not a folder")
    rules = load_rules(families)
    found = discover(root)
    if not (found.captures or found.census or found.jetsam):
        raise InputError(f"{root}: nothing to report: no capture (*.mtc) and no census/jetsam JSON document "
                         f"in this folder or below it")
    entries: list[dict[str, Any]] = []
    skipped: list[Skipped] = []
    for path in found.captures:
        entry, skip = analyze_capture(path, root, rules)
        if entry is not None:
            entries.append(entry)
        if skip is not None:
            skipped.append(skip)
    docs: dict[str, list[dict[str, Any]]] = {"census": [], "jetsam": []}
    for kind, paths in (("census", found.census), ("jetsam", found.jetsam)):
        for p in paths:
            doc, why = load_document(p, kind)
            if doc is not None:
                docs[kind].append(doc)
            else:
                skipped.append(Skipped(str(p.relative_to(root)), why or "unusable"))
    name = root.resolve().name or str(root)
    document = build_document(name, entries, skipped, docs["census"], docs["jetsam"])
    markdown = render(document)
    result = ReportResult(document, markdown, skipped)
    if write:
        dest = Path(out) if out is not None else root
        dest.mkdir(parents=True, exist_ok=True)
        for fname, text in (("report.json", json.dumps(document, indent=1, ensure_ascii=False) + "\n"),
                            ("REPORT.md", markdown)):
            write_text_atomic(dest / fname, text)
            result.paths.append(dest / fname)
    return result
