"""purgeable: when a process declares memory discardable, and when it takes it back."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console

from memtrace.analyze import purgeable as purgeable_analysis
from memtrace.analyze.purgeable import PurgeableSummary
from memtrace.live import LiveStats, Row, event_stats
from memtrace.report.chapters.purgeable import PurgeableChapter
from memtrace.reporters.console import footer, frames_text, header, line, stack_table
from memtrace.tracers import Tracer
from memtrace.tracers.options import Option, at_least
from memtrace.units import fmt_bytes


def _rows(events: Counter[str], stats: LiveStats) -> list[Row]:
    return [("SET transitions", f"{events['set']:,}"), ("purgeable created", f"{events['create']:,}"),
            ("madvise", f"{events['madvise']:,}"), ("framework calls", f"{events['call']:,}")]


def console_view(console: Console, summary: PurgeableSummary, opts: dict[str, Any]) -> None:
    s = summary.to_json(capture=opts.get("capture"), top=opts.get("top", 50))
    header(console, "purgeable", s)
    if s["transitions"]:
        console.print(stack_table("transitions (0 NONVOL, 1 VOL, 2 EMPTY)",
                                  [("transition", "right"), ("count", "right"), ("bytes", "right")],
                                  [[k, f"{n:,}", fmt_bytes(s["transition_bytes"].get(k))]
                                   for k, n in s["transitions"].items()]))
    else:
        line(console, ("transitions", "none"))
    line(console, ("SET calls", f"{s['set_calls']:,}"), ("GET calls", f"{s['get_calls']:,}"),
         ("stolen (2→0)", f"{s['stolen']['count']:,} ({fmt_bytes(s['stolen']['bytes'])})"),
         ("created purgeable", f"{s['created_purgeable']:,} ({fmt_bytes(s['created_bytes'])})"))
    if s["by_caller"]:
        console.print(stack_table("transitions by caller and stack",
                                  [("entry", "left"), ("transition", "left"), ("count", "right"), ("bytes", "right"),
                                   ("stack", "left")],
                                  [[r["entry"], r["transition"], f"{r['count']:,}", fmt_bytes(r["bytes"]),
                                    frames_text(r["frames"], 4)] for r in s["by_caller"]]))
    if s["framework_calls"]:
        console.print(stack_table("framework entries (their transitions are counted underneath)",
                                  [("entry", "left"), ("calls", "right"), ("callers", "left")],
                                  [[entry, f"{v['calls']:,}",
                                    ", ".join(f"{c['caller']} ×{c['count']}" for c in v["by_caller"])]
                                   for entry, v in s["framework_calls"].items()]))
    if s["madvise_by_caller"]:
        rows = []
        for r in s["madvise_by_caller"]:
            name = s["madvise_names"].get(str(r["advice"])) if r["entry"] == "madvise" else f"darwin {r['advice']}"
            rows.append([r["entry"], f"{r['advice']} {name or ''}", f"{r['count']:,}", fmt_bytes(r["bytes"]),
                         str(r["caller"])])
        console.print(stack_table(f"reusable line: madvise ({s['madvise_platform']} advice values; never a "
                                  f"transition)", [("entry", "left"), ("advice", "left"), ("count", "right"),
                                                   ("bytes", "right"), ("caller", "left")], rows))
    footer(console, s)


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
    events=purgeable_analysis.EVENTS,
    summary_type=PurgeableSummary,
    console=console_view,
    live=event_stats(_rows),
    chapter=PurgeableChapter,
    hooks_platform="darwin",
    report_order=2,
    c_sources=("purgeable.c",),
    doctor_config={"standinMadvise": True},     # the stand-in's madvise on Linux
)
