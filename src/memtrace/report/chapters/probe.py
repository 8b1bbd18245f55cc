"""The probe chapter: each routing probe's truth table."""

from __future__ import annotations

from typing import Any

from memtrace.analyze.probe import render_markdown
from memtrace.report.chapters import BaseChapter
from memtrace.reporters.markdown import cell


class ProbeChapter(BaseChapter):
    name = "probe"

    def markdown(self, targets: list[dict[str, Any]]) -> list[str]:
        probes = [(t["target"], e) for t in targets for e in self.own(t) or []]
        if not probes:
            return []
        lines = ["## Probe truth tables", ""]
        for target, e in probes:
            lines += [f"### {cell(target)} ({cell(e['path'])})", "", render_markdown(e).rstrip(), ""]
        return lines
