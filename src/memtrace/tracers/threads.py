"""threads: every thread created, with stacks; leaked (never joined) threads; the peak."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from memtrace.live import LiveStats, Row, event_stats
from memtrace.tracers import Tracer, lazy
from memtrace.tracers.options import Option, at_least
from memtrace.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from memtrace.analyze.threads import ThreadsSummary


def _rows(events: Counter[str], stats: LiveStats) -> list[Row]:
    return [("created", f"{events['create']:,}"), ("exited", f"{events['exit']:,}"),
            ("joined / detached", f"{events['join']:,} / {events['detach']:,}"),
            ("failed", f"{events['create-failed']:,}")]


def console_view(console: Console, summary: ThreadsSummary, opts: dict[str, Any]) -> None:
    from memtrace.reporters.console import footer, frames_text, header, line, stack_table

    top = opts.get("top", 20)
    created = summary.created
    header(console, summary)
    line(console, ("created", f"{len(created):,} ({sum(r.detached_at_create for r in created):,} detached at "
                              f"creation)"),
         ("joined", f"{sum(r.joined for r in created):,}"), ("detached", f"{sum(r.detached for r in created):,}"),
         ("exited", f"{sum(r.exited for r in created):,}"))
    leaked, running = summary.leaked(top), summary.running_at_end(top)
    line(console, ("threads alive", f"{summary.existing:,} at start, peak {summary.peak:,}"),
         ("running at end", f"{running.count:,} created in the window ({running.joinable:,} joinable)"))
    line(console, ("leaked (exited, never joined or detached)",
                   f"{leaked.count:,} holding {fmt_bytes(leaked.stack_bytes)} of stack"))
    for title, rows in (("leaked threads, by creating stack", leaked.by_stack),
                        ("still running at the end, by creating stack", running.by_stack)):
        if rows:
            console.print(stack_table(title, [("count", "right"), ("routine", "left"), ("stack", "right"),
                                              ("frames", "left")],
                                      [[f"{r.count:,}", str(r.routine), fmt_bytes(r.stack_bytes),
                                        frames_text(r.frames, 6)] for r in rows]))
    failures = summary.failure_groups(top)
    if failures:
        console.print(stack_table("failed pthread_create", [("error", "left"), ("count", "right"),
                                                            ("routine", "left"), ("caller", "left")],
                                  [[r.error, f"{r.count:,}", str(r.routine), str(r.caller)] for r in failures]))
    footer(console, summary, opts.get("capture"))


TRACER = Tracer(
    name="threads",
    help="Trace pthread_create/detach/join and thread starts and exits: leaks and the road to EAGAIN.",
    description="Every thread created with its stack and start routine, joins and detaches, the peak alive, "
                "leaked (never joined) threads by creating stack, failed creations.",
    options=(Option("top", int, 20, "Rows per stack table.", check=at_least(0)),),
    analyzer="memtrace.analyze.threads",
    events="memtrace.analyze.threads:EVENTS",
    summary_type="memtrace.analyze.threads:ThreadsSummary",
    console=console_view,
    live=event_stats(_rows),
    chapter=lazy("memtrace.report.chapters.threads:ThreadsChapter"),
    report_order=5,
    views=("created", "running", "leaked"),          # ThreadsSummary.count_views
)
