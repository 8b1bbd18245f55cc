"""fds: every descriptor a process opens, with stacks; what is still open; censuses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memtrace.live import LiveStats, Row
from memtrace.tracers import Tracer, lazy
from memtrace.tracers.options import Option, at_least

if TYPE_CHECKING:
    from rich.console import Console

    from memtrace.analyze.fds import FdsSummary


class FdsStats(LiveStats):
    """Descriptors open now (created in the window minus released), as the agent reports them."""

    def __init__(self) -> None:
        super().__init__()
        self.created = 0
        self.released = 0

    def event(self, ev: dict[str, Any]) -> None:
        super().event(ev)
        if ev.get("type") == "open":
            self.created += len(ev.get("fds") or ())
        elif ev.get("type") == "close" and ev.get("known"):
            self.released += 1

    def rows(self) -> list[Row]:
        return [("descriptors created", f"{self.created:,}"), ("released", f"{self.released:,}"),
                ("open now (of those)", f"{self.created - self.released:,}"),
                ("failed", f"{self.events['open-failed']:,}")]


def console_view(console: Console, summary: FdsSummary, opts: dict[str, Any]) -> None:
    from memtrace.reporters.console import footer, frames_text, header, line, plain, stack_table

    top = opts.get("top", 20)
    header(console, summary)
    if summary.calls:
        console.print(stack_table(f"creating calls (descriptors created: {summary.opened:,})",
                                  [("call", "left"), ("calls", "right")],
                                  [[k, f"{v:,}"] for k, v in sorted(summary.calls.items())]))
    else:
        line(console, ("creating calls", "none"))
    closed = ", ".join(f"{k} {v:,}" for k, v in sorted(summary.closes.items())) or "none"
    line(console, ("released", closed), ("dup onto open", f"{summary.replaced:,}"),
         ("releases of unknown fds", f"{summary.closes_unknown:,}"))
    line(console, ("baseline", f"{summary.baseline_count:,} open before the window "
                               f"({summary.baseline_closed:,} closed in it)"),
         ("peak open", f"{summary.peak:,}"))
    line(console, ("opened in the window and still open", f"{len(summary.open):,}{_kinds(summary.open_by_kind())}"))
    groups = summary.open_groups(top)
    if groups:
        rows = []
        for r in groups:
            paths = "\n".join(r.paths[:3]) + ("\n…" if len(r.paths) > 3 else "")
            rows.append([f"{r.count:,}", ", ".join(f"{k} ×{v}" for k, v in r.calls.items()), paths,
                         frames_text(r.frames, 6)])
        console.print(stack_table("still open, by opening stack", [("count", "right"), ("calls", "left"),
                                                                   ("paths", "left"), ("frames", "left")], rows))
    failures = summary.failure_groups(top)
    if failures:
        console.print(stack_table("failed creations", [("call", "left"), ("error", "left"), ("count", "right"),
                                                       ("caller", "left")],
                                  [[r.call, r.error, f"{r.count:,}", str(r.caller)] for r in failures]))
    for c in summary.censuses:
        line(console, ("census", f"({c.trigger}, t={c.t} ms): {c.count:,} open{_kinds(c.by_kind)}"))
    rec = summary.reconciliation()
    if rec and rec.opened_out_of_sight:
        console.print(plain("opened out of sight (no hooked entry saw them): "
                            + ", ".join(f"{u.fd} {u.path}" for u in rec.opened_out_of_sight[:10])),
                      style="yellow")
    footer(console, summary, opts.get("capture"))


TRACER = Tracer(
    name="fds",
    help="Trace open/close/socket/pipe/dup & co. with stacks: fd leaks and the road to EMFILE.",
    description="Every descriptor created or released with its stack, censuses of what is open, what is still "
                "open at the end by opening stack, failures by errno.",
    options=(
        Option("census_at", int, 1000, "Take an fd census (every descriptor and what it is) once more "
               "than N are open...", agent_key="censusAt", metavar="N", check=at_least(0)),
        Option("census_step", int, 50, "...and again each time N more are open than at the last census.",
               agent_key="censusStep", metavar="N", check=at_least(1)),
        Option("top", int, 20, "Rows per stack table.", check=at_least(0)),
    ),
    analyzer="memtrace.analyze.fds",
    events="memtrace.analyze.fds:EVENTS",
    summary_type="memtrace.analyze.fds:FdsSummary",
    console=console_view,
    live=FdsStats,
    chapter=lazy("memtrace.report.chapters.fds:FdsChapter"),
    report_order=4,
    views=("open", "failed"),                       # FdsSummary.count_views
)


def _kinds(by_kind: dict[str, int] | None) -> str:
    """`` (file 11, socketpair 2)``, or nothing."""
    return f" ({', '.join(f'{k} {v:,}' for k, v in by_kind.items())})" if by_kind else ""
