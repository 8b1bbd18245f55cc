"""memtrace threads: every thread created, with stacks; leaked (never joined) threads; the peak."""

from __future__ import annotations

from typing import Any

import click

from memtrace.analyze.threads import summarize
from memtrace.commands.options import target_options, trace_and_summarize
from memtrace.reporters.console import threads_summary


@click.command("threads", context_settings={"ignore_unknown_options": True})
@click.option("--top", type=int, default=20, show_default=True, help="Rows per stack table.")
@target_options
def threads(top: int, **kw: Any) -> int:
    """Trace pthread_create/detach/join and thread starts and exits: leaks and the road to EAGAIN."""
    return trace_and_summarize("threads", {}, summarize, threads_summary, top, **kw)


command = threads
