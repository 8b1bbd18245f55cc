"""``memtrace report``: a folder of captures -> REPORT.md, report.json and report.html (the same
numbers; report.html adds a flame graph per capture with stacks).

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
from memtrace.capture import CaptureInfo
from memtrace.errors import InputError
from memtrace.files import save_text
from memtrace.report.aggregate import build_document
from memtrace.report.collect import Skipped, _rel, analyze_capture, discover, load_document
from memtrace.report.markdown import render
from memtrace.reporters.html import flame_data, report_page
from memtrace.views import Loaded

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
    flames: list[tuple[str, dict[str, Any]]] = []

    def keep_flame(path: Path, tracer: Any, summary: Any) -> None:
        if write:
            data = flame_data(Loaded(path=path, tracer=tracer, summary=summary, info=CaptureInfo(path)))
            if any(v["samples"] for v in data["views"].values()):
                flames.append((f"{data['title']} ({_rel(path, root)})", data))

    for path in found.captures:
        entry, skip = analyze_capture(path, root, rules, on_summary=keep_flame)
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
        page = report_page(f"Memory report: {name}", markdown, flames)
        for fname, text in (("report.json", json.dumps(document, indent=1, ensure_ascii=False) + "\n"),
                            ("REPORT.md", markdown), ("report.html", page)):
            save_text(dest / fname, text, "--out" if out is not None else "report folder")
            result.paths.append(dest / fname)
    return result
