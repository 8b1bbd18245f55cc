"""purgeable: when a process declares memory discardable, and when it takes it back."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from memtrace.live import LiveStats, Row, event_stats
from memtrace.tracers import Tracer, lazy
from memtrace.tracers.options import Option, at_least
from memtrace.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from memtrace.analyze.purgeable import PurgeableSummary


def _rows(events: Counter[str], stats: LiveStats) -> list[Row]:
    return [("SET transitions", f"{events['set']:,}"), ("purgeable created", f"{events['create']:,}"),
            ("madvise", f"{events['madvise']:,}"), ("framework calls", f"{events['call']:,}")]


def console_view(console: Console, summary: PurgeableSummary, opts: dict[str, Any]) -> None:
    from memtrace.reporters.console import footer, frames_text, header, line, stack_table

    top = opts.get("top", 50)
    header(console, summary)
    if summary.transitions:
        console.print(stack_table("transitions (0 NONVOL, 1 VOL, 2 EMPTY)",
                                  [("transition", "right"), ("count", "right"), ("bytes", "right")],
                                  [[k, f"{n:,}", fmt_bytes(summary.transition_bytes.get(k))]
                                   for k, n in sorted(summary.transitions.items())]))
    else:
        line(console, ("transitions", "none"))
    stolen, stolen_bytes = summary.stolen
    line(console, ("SET calls", f"{summary.set_calls:,}"), ("GET calls", f"{summary.get_calls:,}"),
         ("stolen (2→0)", f"{stolen:,} ({fmt_bytes(stolen_bytes)})"),
         ("created purgeable", f"{summary.created_purgeable:,} ({fmt_bytes(summary.created_bytes)})"))
    by_caller = summary.groups(summary.by_caller, top)
    if by_caller:
        console.print(stack_table("transitions by caller and stack",
                                  [("entry", "left"), ("transition", "left"), ("count", "right"), ("bytes", "right"),
                                   ("stack", "left")],
                                  [[*r.key, f"{r.count:,}", fmt_bytes(r.bytes), frames_text(r.frames, 4)]
                                   for r in by_caller]))
    calls = summary.framework_calls(top)
    if calls:
        console.print(stack_table("framework entries (their transitions are counted underneath)",
                                  [("entry", "left"), ("calls", "right"), ("callers", "left")],
                                  [[entry, f"{e.calls:,}", ", ".join(f"{c.caller} ×{c.count}" for c in e.by_caller)]
                                   for entry, e in calls.items()]))
    madvise = summary.groups(summary.madvise, top)
    if madvise:
        mad = summary.madvise_figures()
        rows = []
        for r in madvise:
            entry, advice = r.key
            name = mad.names.get(str(advice)) if entry == "madvise" else f"darwin {advice}"
            rows.append([entry, f"{advice} {name or ''}", f"{r.count:,}", fmt_bytes(r.bytes), str(r.caller)])
        console.print(stack_table(f"reusable line: madvise ({mad.platform} advice values; never a "
                                  f"transition)", [("entry", "left"), ("advice", "left"), ("count", "right"),
                                                   ("bytes", "right"), ("caller", "left")], rows))
    footer(console, summary, opts.get("capture"))


TRACER = Tracer(
    name="purgeable",
    help="Trace the purgeable state machine (vm_purgable_control & co.), creation and madvise.",
    description="Every SET transition old→new with bytes and its stack, purgeable creation, framework entries "
                "(IOSurface, Core Animation) and madvise's separate reusable line.",
    options=(
        Option("standin_madvise", bool, False, "Linux tests: also hook libmtdarwin's mtdarwin_madvise as Darwin's "
               "madvise (reported apart, as madvise_standin).", agent_key="standinMadvise", is_flag=True),
        Option("top", int, 50, "Rows per caller table.", check=at_least(0)),
    ),
    analyzer="memtrace.analyze.purgeable",
    events="memtrace.analyze.purgeable:EVENTS",
    summary_type="memtrace.analyze.purgeable:PurgeableSummary",
    console=console_view,
    live=event_stats(_rows),
    chapter=lazy("memtrace.report.chapters.purgeable:PurgeableChapter"),
    hooks_platform="darwin",
    report_order=2,
    c_sources=("purgeable.c",),
    doctor_config={"standinMadvise": True},     # the stand-in's madvise on Linux
)
