"""The file-descriptor chapter: created, released, peak, still open by opening stack."""

from __future__ import annotations

from typing import Any

from memtrace.report.chapters import CountedLeakChapter, frames_cell
from memtrace.reporters.markdown import Markup, cell, table, text


class FdsChapter(CountedLeakChapter):
    name = "fds"
    stack_tables = ("open_at_end.by_stack",)
    leak_headings = ("fds still open",)
    leak_legend = "fds: opened in the window, still open at its end."

    leak_key = "open_at_end"
    leak_top_words = "most from"

    def leak_text(self, target: str, count: int, at: str) -> str:
        return f"{target}: {count:,} file descriptors opened in the window and still open at its end{at}"

    def markdown(self, targets: list[dict[str, Any]]) -> list[str]:
        runs = [(t["target"], e) for t in targets for e in self.own(t) or []]
        if not runs:
            return []
        lines = ["## File descriptors", "",
                 "Descriptors created in the window and never released are leaks in the making: each holds a "
                 "kernel object until the process dies, and past the descriptor limit every open fails (EMFILE).",
                 ""]
        rows = []
        for target, e in runs:
            failed = ", ".join(f"{call} {err} ×{n:,}" for call, errs in e["failed"].items() for err, n in errs.items())
            rec = e.get("reconciliation") or {}
            rows.append([target, e["path"], f"{e['opened']:,}", f"{sum(e['closed'].values()):,}",
                         f"{e['baseline']['count']:,}", f"{e['peak']['count']:,}", f"{e['open_at_end']['count']:,}",
                         f"{len(rec.get('opened_out_of_sight') or []):,}" if rec else "—", failed or "—"])
        lines += table(["target", "capture", "created", "released", "open before", "peak open", "still open",
                        "opened out of sight", "failed"], "llrrrrrrl", rows)
        for target, e in runs:
            by_stack = e["open_at_end"]["by_stack"]
            if not by_stack:
                continue
            lines += [f"### {cell(target)}: still open at the end, by opening stack", ""]
            lines += table(["count", "calls", "caller", "family", "paths", "frames"], "rlllll",
                           [[f"{r['count']:,}", ", ".join(f"{k} ×{v:,}" for k, v in r["calls"].items()),
                             r["caller"] or "—", r.get("family", "—"),
                             Markup("<br>".join(text(p) for p in r["paths"][:3])
                                    + (" …" if len(r["paths"]) > 3 else "") or "—"),
                             frames_cell(r["frames"])] for r in by_stack])
        return lines
