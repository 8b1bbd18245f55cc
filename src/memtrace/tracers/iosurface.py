"""iosurface: what a process allocates as IOSurfaces (kernel memory), with stacks."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from memtrace.live import LiveStats, Row, event_stats
from memtrace.tracers import Tracer, lazy
from memtrace.tracers.options import Option, at_least
from memtrace.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from memtrace.analyze.iosurface import IOSurfaceSummary


def _rows(events: Counter[str], stats: LiveStats) -> list[Row]:
    return [("surfaces", f"{events['surface']:,}"), ("surface bytes", fmt_bytes(stats.event_bytes)),
            ("released", f"{events['release']:,}")]


def console_view(console: Console, summary: IOSurfaceSummary, opts: dict[str, Any]) -> None:
    from memtrace.reporters.console import footer, frames_text, header, line, stack_table

    header(console, summary)
    line(console, ("surfaces created", f"{len(summary.surfaces):,} ({fmt_bytes(summary.total_bytes)}, kernel memory "
                                       f"outside every malloc zone)"))
    formats = summary.by_format()
    if formats:
        console.print(stack_table("by pixel format", [("format", "left"), ("count", "right"), ("bytes", "right"),
                                                      ("sizes (w×h, row bytes, alloc)", "left")],
                                  [[f.format, f"{f.count:,}", fmt_bytes(f.bytes),
                                    "; ".join(f"{w}×{h}, {r}, {fmt_bytes(a)}" for w, h, r, a in f.sizes)]
                                   for f in formats]))
    stacks = summary.by_creating_stack(opts.get("top", 20))
    if stacks:
        console.print(stack_table("by creating stack", [("bytes", "right"), ("count", "right"), ("frames", "left")],
                                  [[fmt_bytes(r.bytes), f"{r.count:,}", frames_text(r.frames, 6)] for r in stacks]))
    rel, held = summary.released, summary.held_at_end
    line(console, ("released", f"{rel.count:,} ({fmt_bytes(rel.bytes)})"
                   + ("" if summary.release_visible else " — no destruction entry visible on this platform")
                   + (f"; {summary.releases_untracked:,} references dropped on surfaces made before the window"
                      if summary.releases_untracked else "")))
    line(console, ("held at end", f"{held.count:,} ({fmt_bytes(held.bytes)}): {summary.held_meaning}"))
    footer(console, summary, opts.get("capture"))


TRACER = Tracer(
    name="iosurface",
    help="Trace IOSurfaceCreate with stacks: what a process allocates outside malloc.",
    description="Every IOSurface created (size, dimensions, pixel format) with its creating stack; releases "
                "where visible; what is held at the end.",
    options=(Option("top", int, 20, "Rows per caller table.", check=at_least(0)),),
    analyzer="memtrace.analyze.iosurface",
    events="memtrace.analyze.iosurface:EVENTS",
    summary_type="memtrace.analyze.iosurface:IOSurfaceSummary",
    console=console_view,
    live=event_stats(_rows),
    chapter=lazy("memtrace.report.chapters.iosurface:IOSurfaceChapter"),
    hooks_platform="darwin",
    report_order=1,
)
