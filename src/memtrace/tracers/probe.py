"""probe: which entries really drive the purgeable state machine, with ledger evidence."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtrace.errors import InputError
from memtrace.files import save_text
from memtrace.live import LiveStats
from memtrace.tracers import Tracer, lazy
from memtrace.tracers.options import Option
from memtrace.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from memtrace.analyze.probe import ProbeSummary


def _check_markdown(opts: dict[str, Any]) -> None:
    path = opts.get("markdown")
    if path is not None and Path(path).exists():
        raise InputError(f"--markdown {path}: already exists; choose a new file")


def console_view(console: Console, summary: ProbeSummary, opts: dict[str, Any]) -> None:
    from memtrace.analyze.probe import render_markdown

    if opts.get("markdown") is not None:
        # A file is an edge: it is written from the JSON document, as the report's chapter is.
        write_markdown(Path(opts["markdown"]), render_markdown(summary.to_json(capture=opts.get("capture"))))
    if not opts.get("quiet"):
        print_truth_table(console, summary)


# Short state names for the terminal (the Markdown file keeps the numbers and the full names).
SHORT_STATES = {0: "NONVOL", 1: "VOL", 2: "EMPTY", 3: "DENY"}


def print_truth_table(console: Console, summary: ProbeSummary) -> None:
    """The probe's truth table for a terminal: the entry whole, ledger moves in KB/MB (the
    Markdown written with --markdown keeps exact bytes)."""
    from rich.table import Table

    from memtrace.analyze.probe import LEDGER_KEYS
    from memtrace.reporters.console import line, plain

    probe = summary.table()
    console.rule(plain(f"Purgeable routing probe — {summary.target_label or ''}"))
    if probe.bytes:
        line(console, ("mapping", f"{fmt_bytes(probe.bytes)} purgeable (mach_vm_allocate ANYWHERE|PURGABLE)"),
             ("madvise entry", probe.madvise_entry or "—"), ("platform", probe.platform or "—"))
    for e in probe.errors:
        line(console, ("error", e))
    if summary.missing:
        line(console, ("MISSING", ", ".join(map(str, summary.missing))))
    if not probe.rows:
        return
    # The byte columns never wrap (a cut number is a wrong number); the entry and state wrap by word.
    t = Table(show_edge=False, box=None, padding=(0, 1), show_lines=False,
              caption="ledger moves per entry (Δ bytes): footprint, purgeable volatile / nonvolatile, reusable")
    t.add_column("entry", ratio=1, min_width=12, overflow="fold")
    t.add_column("drives?", no_wrap=True)
    t.add_column("state", min_width=8)
    for head in ("footprint", "volatile", "nonvol", "reusable"):
        t.add_column(head, justify="right", no_wrap=True, min_width=8)
    for row in probe.rows:
        drives = row.drives_state_machine
        d = row.ledger_delta or {}
        states = " → ".join("—" if v is None else SHORT_STATES.get(v, str(v))
                            for v in (row.state_before, row.state_after))
        t.add_row(plain(row.entry or ""),
                  plain(row.error) if row.error else ("—" if drives is None else "yes" if drives else "no"),
                  states, *(fmt_bytes(v, signed=True) if isinstance(v := d.get(k), int) else "—" for k in LEDGER_KEYS))
    console.print(t)


def write_markdown(path: Path, text: str) -> None:
    save_text(path, text, "--markdown")


TRACER = Tracer(
    name="probe",
    help="Run the routing probe inside the target: madvise 4/5/7/8, SET VOLATILE/NONVOLATILE/EMPTY, reacquire.",
    description="A truth table: does each entry drive the purgeable state machine, with byte-exact ledger moves.",
    options=(Option("markdown", Path, None, "Also write the truth table as Markdown to FILE.", metavar="FILE",
                    in_plans=False, show_default=False),),
    analyzer="memtrace.analyze.probe",
    result="memtrace.analyze.probe:ProbeResult",
    summary_type="memtrace.analyze.probe:ProbeSummary",
    console=console_view,
    live=LiveStats,
    chapter=lazy("memtrace.report.chapters.probe:ProbeChapter"),
    before_launch=_check_markdown,
    extra={"console_always": True},      # the Markdown file is written even with --json/--quiet
    hooks_platform="darwin",
    report_order=3,
    doctor_checks=("probe-result",),
)
