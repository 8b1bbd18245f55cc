"""The Leaks chapter: what each target leaked, on every line that can tell.

Each tracer's chapter says what its line leaks (``leak_headings``, ``leak_legend``, ``leak_cells``,
``leak_items``, ``leak_details``: malloc --leaks' unreachable blocks, fds' descriptors still open,
threads' never-joined threads); this chapter puts them side by side, one row per target, and adds
one finding that names each leak.  It reads the chapters' aggregates (``target[tracer]``) and
never a tracer by name.
"""

from __future__ import annotations

from typing import Any

from memtrace.report.chapters import Lines
from memtrace.reporters.markdown import table


def findings(targets: list[dict[str, Any]], chapters: Lines) -> list[dict[str, Any]]:
    items = [item for t in targets for c in chapters.chapters for item in c.leak_items(t, t.get(c.name))]
    if not items:
        return []
    return [{"kind": "leaks", "title": "leaks",
             "text": "Memory no pointer reaches, descriptors never closed, threads never joined: each is held until "
                     "the process dies.", "items": items}]


def markdown(targets: list[dict[str, Any]], chapters: Lines) -> list[str]:
    lines_ = [c for c in chapters.chapters if c.leak_headings]
    rows = []
    for t in targets:
        cells: list[Any] = []
        shown = False
        for c in lines_:
            own, says = c.leak_cells(t.get(c.name))
            cells += own
            shown = shown or says
        if shown:
            rows.append([t["target"], *cells])
    if not rows:
        return []
    headings = [h for c in lines_ for h in c.leak_headings]
    lines = ["## Leaks", "", " ".join(c.leak_legend for c in lines_ if c.leak_legend), ""]
    lines += table(["target", *headings], "l" + "r" * len(headings), rows)
    for t in targets:
        for c in lines_:
            lines += c.leak_details(t, t.get(c.name))
    return lines
