"""The threads chapter: created, joined, detached, peak; leaked and still-running threads by stack."""

from __future__ import annotations

from typing import Any

from memtrace.report.chapters import CountedLeakChapter, frames_cell
from memtrace.reporters.markdown import cell, table
from memtrace.units import fmt_bytes


class ThreadsChapter(CountedLeakChapter):
    name = "threads"
    stack_tables = ("leaked.by_stack", "running_at_end.by_stack", "created_by_stack")
    leak_headings = ("threads leaked",)
    leak_legend = "threads: exited without being joined or detached."

    leak_key = "leaked"
    leak_top_words = "most created at"

    def leak_text(self, target: str, count: int, at: str) -> str:
        return f"{target}: {count:,} leaked threads (exited, never joined nor detached){at}"

    def markdown(self, targets: list[dict[str, Any]]) -> list[str]:
        runs = [(t["target"], e) for t in targets for e in self.own(t) or []]
        if not runs:
            return []
        lines = ["## Threads", "",
                 "A joinable thread that exits without being joined or detached is leaked: its stack and thread "
                 "descriptor stay reserved until the process dies, and enough of them make pthread_create fail "
                 "(EAGAIN).", ""]
        rows = []
        for target, e in runs:
            failed = ", ".join(f"{err} ×{n:,}" for err, n in e["failed"].items())
            rows.append([target, e["path"], f"{e['created']:,}", f"{e['joined']:,}",
                         f"{e['detached']:,} + {e['created_detached']:,} at creation", f"{e['peak']['count']:,}",
                         f"{e['leaked']['count']:,}", f"{e['running_at_end']['count']:,}", failed or "—"])
        lines += table(["target", "capture", "created", "joined", "detached", "peak alive", "leaked",
                        "running at end", "failed"], "llrrrrrrl", rows)
        for target, e in runs:
            for title, key in (("leaked threads", "leaked"), ("threads still running at the end", "running_at_end")):
                by_stack = e[key]["by_stack"]
                if by_stack:
                    lines += [f"### {cell(target)}: {title}, by creating stack", ""]
                    lines += table(["count", "routine", "caller", "stack reserved", "family", "frames"], "rllrll",
                                   [[f"{r['count']:,}", r["routine"] or "—", r["caller"] or "—",
                                     fmt_bytes(r["stack_bytes"]), r.get("family", "—"), frames_cell(r["frames"])]
                                    for r in by_stack])
        return lines
