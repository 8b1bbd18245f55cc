"""memtrace iosurface: what a process allocates as IOSurfaces (kernel memory), with stacks."""

from __future__ import annotations

from typing import Any

import click

from memtrace.analyze.iosurface import summarize
from memtrace.commands.options import target_options, trace_and_summarize
from memtrace.reporters.console_darwin import iosurface_summary


@click.command("iosurface", context_settings={"ignore_unknown_options": True})
@click.option("--top", type=int, default=20, show_default=True, help="Rows per caller table.")
@target_options
def iosurface(top: int, **kw: Any) -> int:
    """Trace IOSurfaceCreate with stacks: what a process allocates outside malloc."""
    return trace_and_summarize("iosurface", {}, summarize, iosurface_summary, top, **kw)


command = iosurface
