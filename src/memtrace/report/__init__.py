"""``memtrace report``: a folder of captures -> REPORT.md, report.json and report.html (the same
numbers; report.html adds a flame graph per capture with stacks).

Stages: :mod:`.collect` finds files and reduces each capture through its tracer's analyzer to a
compact entry (one streaming pass, memory bounded by distinct stacks); :mod:`.aggregate` merges
entries per target and computes the panorama and findings into one document; :mod:`.markdown`
renders that document.  Both outputs are written atomically (temp file + ``os.replace``).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrace.analyze.families import load_rules
from memtrace.capture import CaptureInfo
from memtrace.errors import InputError
from memtrace.files import _why, save_text
from memtrace.report.aggregate import build_document
from memtrace.report.collect import Skipped, _rel, analyze_capture, discover, load_document
from memtrace.report.markdown import render
from memtrace.reporters.html import flame_data, flamegraph_page, has_stacks, report_page
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


FLAMES_DIR = "report-flames"           # one page per capture with stacks, beside report.html
MEMORY_BUDGET = 600 << 20              # what the report's worker processes may hold at once
# Peak memory of analyzing one capture and drawing its flame graph, per byte of capture file
# (measured on bench/view_bench.py's 131,072-stack capture: ~420 MB for 23 MB), plus a worker's base.
MEMORY_PER_CAPTURE_BYTE = 18
MEMORY_PER_WORKER = 60 << 20

Progress = Callable[[int, int, str, float, str], None]


def default_jobs(captures: list[Path]) -> int:
    """Worker processes: one per core, as many as the largest capture leaves room for in the budget
    (a folder of small captures runs on every core; one of huge captures, one at a time)."""
    if len(captures) <= 1:
        return 1
    largest = max((p.stat().st_size for p in captures if p.is_file()), default=0)
    each = MEMORY_PER_WORKER + largest * MEMORY_PER_CAPTURE_BYTE
    return max(1, min(os.cpu_count() or 1, len(captures), MEMORY_BUDGET // each))


def _slug(rel: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", rel)[-80:].strip("_.") or "capture"


@dataclass
class _Done:
    index: int
    entry: dict[str, Any] | None
    skipped: Skipped | None
    flame: tuple[str, str] | None       # (heading, page file name)
    seconds: float


def _analyze_one(index: int, path: Path, root: Path, families: Path | str | None,
                 flames: Path | None) -> _Done:
    """One capture: its entry, and its flame graph page written to ``flames`` (run in a worker
    process: only the compact entry comes back, never the summary)."""
    t0 = time.perf_counter()
    rules = load_rules(families)
    flame: list[tuple[str, str]] = []
    rel = _rel(path, root)

    def keep_flame(p: Path, tracer: Any, summary: Any) -> None:
        if flames is None:
            return
        loaded = Loaded(path=p, tracer=tracer, summary=summary, info=CaptureInfo(p))
        data = flame_data(loaded)
        if has_stacks(data):
            name = f"{index:03d}-{_slug(rel)}.html"
            page = flamegraph_page(loaded, data=data, back=f"../{REPORT_HTML}")
            save_text(flames / name, page, "report folder")
            flame.append((f"{data['title']} ({rel})", name))

    entry, skip = analyze_capture(path, root, rules, on_summary=keep_flame)
    return _Done(index, entry, skip, flame[0] if flame else None, time.perf_counter() - t0)


REPORT_HTML = "report.html"


def build_report(folder: Path | str, out: Path | str | None = None, families: Path | str | None = None,
                 write: bool = True, jobs: int | None = None, progress: Progress | None = None) -> ReportResult:
    """Every capture under ``folder`` into REPORT.md, report.json and report.html (+ one flame graph
    page per capture with stacks, in report-flames/).

    Captures are analyzed one per worker process (``jobs``; default :func:`default_jobs`), each
    reduced at once to its compact entry and its page written by the worker, so memory is bounded
    by the captures in flight, never by the folder.  ``progress(done, total, path, seconds,
    status)`` is called as each capture finishes."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"{root}: not a folder")
    load_rules(families)        # a bad rules file is one error before any work
    found = discover(root)
    if not (found.captures or found.census or found.jetsam or found.unreadable):
        raise InputError(f"{root}: nothing to report: no capture (*.mtc) and no census/jetsam JSON document "
                         f"in this folder or below it")
    dest = Path(out) if out is not None else root
    flames = dest / FLAMES_DIR if write else None
    option = "--out" if out is not None else "report folder"
    if flames is not None:
        # Before any work: an output folder that cannot be made fails as writing report.json would.
        try:
            flames.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"{option} {dest / 'report.json'}: cannot write: {_why(dest / 'report.json', e)}") from None
    n = len(found.captures)
    jobs = max(1, jobs or default_jobs(found.captures))
    done: list[_Done] = []

    def finished(d: _Done) -> None:
        done.append(d)
        if progress is not None:
            status = "skipped" if d.entry is None else "partly read" if d.skipped is not None else "ok"
            progress(len(done), n, _rel(found.captures[d.index], root), d.seconds, status)

    if jobs == 1:
        for i, path in enumerate(found.captures):
            finished(_analyze_one(i, path, root, families, flames))
    else:
        # fork on Linux: the workers start at once and see this process's tracer registry (a tracer
        # added at run time included); spawn elsewhere (macOS frameworks do not survive a fork).
        ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = [pool.submit(_analyze_one, i, path, root, families, flames)
                       for i, path in enumerate(found.captures)]
            for f in as_completed(futures):
                finished(f.result())
    done.sort(key=lambda d: d.index)
    entries = [d.entry for d in done if d.entry is not None]
    skipped = [d.skipped for d in done if d.skipped is not None]
    skipped += [Skipped(_rel(p, root), why) for p, why in found.unreadable]
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
        pages = [(d.flame[0], f"{FLAMES_DIR}/{d.flame[1]}") for d in done if d.flame is not None]
        page = report_page(f"Memory report: {name}", markdown, pages)
        for fname, text in (("report.json", json.dumps(document, indent=1, ensure_ascii=False) + "\n"),
                            ("REPORT.md", markdown), (REPORT_HTML, page)):
            save_text(dest / fname, text, option)
            result.paths.append(dest / fname)
        assert flames is not None
        _drop_stale(flames, {d.flame[1] for d in done if d.flame is not None})
        if pages:
            result.paths.append(flames)
    return result


def _drop_stale(flames: Path, kept: set[str]) -> None:
    """Pages of an earlier run whose capture is gone (or has no stacks now) would be linked from nowhere."""
    for p in flames.glob("*.html"):
        if p.name not in kept:
            p.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        flames.rmdir()              # only when empty: a folder without stacks has no pages
