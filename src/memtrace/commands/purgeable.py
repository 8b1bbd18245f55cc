"""memtrace purgeable: when a process declares memory discardable, and when it takes it back."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from memtrace.analyze.purgeable import summarize
from memtrace.capture import read_records
from memtrace.commands.options import emit_json, exit_code, run_capture, target_options
from memtrace.reporters.console_darwin import purgeable_summary


@click.command("purgeable", context_settings={"ignore_unknown_options": True})
@click.option("--standin-madvise", is_flag=True,
              help="Linux tests: also hook libmtdarwin's mtdarwin_madvise as Darwin's madvise "
                   "(reported apart, as madvise_standin).")
@click.option("--top", type=int, default=50, show_default=True, help="Rows per caller table.")
@target_options
def purgeable(standin_madvise: bool, top: int, **kw: Any) -> int:
    """Trace the purgeable state machine (vm_purgable_control & co.), creation and madvise."""
    result = run_capture("purgeable", {"standinMadvise": standin_madvise}, **kw)
    summary = summarize(read_records(result.path)).to_json(capture=str(result.path), top=top)
    if kw["as_json"]:
        emit_json(summary)
    elif not kw["quiet"]:
        purgeable_summary(Console(), summary)
    return exit_code(result)


command = purgeable
