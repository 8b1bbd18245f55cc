"""memtrace fds: every descriptor a process opens, with stacks; what is still open; censuses."""

from __future__ import annotations

from typing import Any

import click

from memtrace.analyze.fds import summarize
from memtrace.commands.options import target_options, trace_and_summarize
from memtrace.reporters.console import fds_summary


@click.command("fds", context_settings={"ignore_unknown_options": True})
@click.option("--census-at", type=click.IntRange(min=0), default=1000, show_default=True, metavar="N",
              help="Take an fd census (every descriptor and what it is) once more than N are open...")
@click.option("--census-step", type=click.IntRange(min=1), default=50, show_default=True, metavar="N",
              help="...and again each time N more are open than at the last census.")
@click.option("--top", type=int, default=20, show_default=True, help="Rows per stack table.")
@target_options
def fds(census_at: int, census_step: int, top: int, **kw: Any) -> int:
    """Trace open/close/socket/pipe/dup & co. with stacks: fd leaks and the road to EMFILE."""
    return trace_and_summarize("fds", {"censusAt": census_at, "censusStep": census_step}, summarize,
                               fds_summary, top, **kw)


command = fds
