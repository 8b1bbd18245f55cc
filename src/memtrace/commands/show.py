"""memtrace show: the console summary of one saved capture, as printed at the end of the capture."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console

from memtrace.errors import InputError
from memtrace.views import load


@click.command("show")
@click.argument("capture", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="The summary as one JSON document (docs/json-schema.md).")
@click.option("--top", type=click.IntRange(0), default=None, help="Stacks in each table (default: the tracer's own).")
@click.option("--sort", type=click.Choice(["bytes", "calls", "live"]), default=None,
              help="malloc: order the stack table by gross bytes (default), by calls, or by live bytes at the "
                   "end (with --json: top_stacks in that order).")
def show(capture: Path, as_json: bool, top: int | None, sort: str | None) -> int:
    """Summarize CAPTURE (a capture file or folder) with its own tracer's analyzer and console view.

    Exit status 1 when the capture is incomplete -- cut short, damaged (bad records are skipped and
    the first named), or without an END record: the summary covers what was read."""
    loaded = load(capture)
    if sort is not None and loaded.tracer.name != "malloc":
        raise InputError(f"{loaded.path}: --sort orders malloc's stack table; {loaded.tracer.name} captures' "
                         "tables are ordered by count")
    if top is None:
        top = next((o.default for o in loaded.tracer.options if o.name == loaded.tracer.json_top_option), 10)
    if as_json:
        doc = loaded.summary.to_json(capture=str(loaded.path), top=top)
        if sort is not None:
            from memtrace.tracers.malloc import sorted_stack_rows

            doc["top_stacks"] = [r.to_json() for r in sorted_stack_rows(loaded.summary, top, sort)]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        opts = {"capture": str(loaded.path), "top": top, loaded.tracer.json_top_option: top, "quiet": False,
                "sort": sort}
        loaded.tracer.console(Console(), loaded.summary, opts)
    if loaded.info.problem is not None:
        click.echo(f"memtrace: warning: {loaded.path}: {loaded.info.problem}", err=True)
        return 1
    return 0


command = show
