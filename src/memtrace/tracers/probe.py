"""probe: which entries really drive the purgeable state machine, with ledger evidence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markdown import Markdown

from memtrace.analyze.probe import ProbeSummary, render_markdown
from memtrace.errors import InputError
from memtrace.files import save_text
from memtrace.live import LiveStats
from memtrace.report.chapters.probe import ProbeChapter
from memtrace.tracers import Tracer
from memtrace.tracers.options import Option


def _check_markdown(opts: dict[str, Any]) -> None:
    path = opts.get("markdown")
    if path is not None and Path(path).exists():
        raise InputError(f"--markdown {path}: already exists; choose a new file")


def console_view(console: Console, summary: ProbeSummary, opts: dict[str, Any]) -> None:
    text = render_markdown(summary.to_json(capture=opts.get("capture")))
    if opts.get("markdown") is not None:
        write_markdown(Path(opts["markdown"]), text)
    if not opts.get("quiet"):
        console.print(Markdown(text))


def write_markdown(path: Path, text: str) -> None:
    save_text(path, text, "--markdown")


TRACER = Tracer(
    name="probe",
    help="Run the routing probe inside the target: madvise 4/5/7/8, SET VOLATILE/NONVOLATILE/EMPTY, reacquire.",
    description="A truth table: does each entry drive the purgeable state machine, with byte-exact ledger moves.",
    options=(Option("markdown", Path, None, "Also write the truth table as Markdown to FILE.", metavar="FILE",
                    in_plans=False, show_default=False),),
    analyzer="memtrace.analyze.probe",
    summary_type=ProbeSummary,
    console=console_view,
    live=LiveStats,
    chapter=ProbeChapter,
    before_launch=_check_markdown,
    extra={"console_always": True},      # the Markdown file is written even with --json/--quiet
)
