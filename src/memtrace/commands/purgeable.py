"""memtrace purgeable: when a process declares memory discardable, and when it takes it back."""

from __future__ import annotations

from typing import Any

import click

from memtrace.analyze.purgeable import summarize
from memtrace.commands.options import target_options, trace_and_summarize
from memtrace.reporters.console_darwin import purgeable_summary


@click.command("purgeable", context_settings={"ignore_unknown_options": True})
@click.option("--standin-madvise", is_flag=True,
              help="Linux tests: also hook libmtdarwin's mtdarwin_madvise as Darwin's madvise "
                   "(reported apart, as madvise_standin).")
@click.option("--top", type=int, default=50, show_default=True, help="Rows per caller table.")
@target_options
def purgeable(standin_madvise: bool, top: int, **kw: Any) -> int:
    """Trace the purgeable state machine (vm_purgable_control & co.), creation and madvise."""
    return trace_and_summarize("purgeable", {"standinMadvise": standin_madvise}, summarize, purgeable_summary, top, **kw)


command = purgeable
