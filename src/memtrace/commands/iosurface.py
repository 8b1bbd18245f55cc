"""memtrace iosurface: what a process allocates as IOSurfaces (kernel memory), with stacks."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from memtrace.analyze.iosurface import summarize
from memtrace.capture import read_records
from memtrace.commands.options import emit_json, exit_code, run_capture, target_options
from memtrace.reporters.console_darwin import iosurface_summary


@click.command("iosurface", context_settings={"ignore_unknown_options": True})
@click.option("--top", type=int, default=20, show_default=True, help="Rows per caller table.")
@target_options
def iosurface(top: int, **kw: Any) -> int:
    """Trace IOSurfaceCreate with stacks: what a process allocates outside malloc."""
    result = run_capture("iosurface", {}, **kw)
    summary = summarize(read_records(result.path)).to_json(capture=str(result.path), top=top)
    if kw["as_json"]:
        emit_json(summary)
    elif not kw["quiet"]:
        iosurface_summary(Console(), summary)
    return exit_code(result)


command = iosurface
