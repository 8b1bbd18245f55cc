"""memtrace show: the console summary of one saved capture, as printed at the end of the capture."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

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
    if sort is not None and sort not in loaded.tracer.sorts:
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
        show_children(Console(), loaded.path, getattr(loaded.summary, "end", None) or {})
    if loaded.info.problem is not None:
        click.echo(f"memtrace: warning: {loaded.path}: {loaded.info.problem}", err=True)
        return 1
    return 0


def show_children(console: Console, path: Path, end: dict[str, Any], depth: int = 0) -> None:
    """The processes the target made, each with its capture (when one exists in the folder) and
    how it ended, and theirs below them: a process is shown with its children."""
    from rich.text import Text

    from memtrace.capture import RecordType, read_records
    from memtrace.reporters.console import plain

    children = list(end.get("children") or [])
    exec_info = (end.get("evidence") or {}).get("exec") or {}
    if exec_info.get("followed"):       # the image it exec'd, traced in a capture of its own
        children.append({"pid": end.get("pid"), "origin": "exec", "path": exec_info.get("path"),
                         "capture": exec_info["followed"], "ended": "replaced it"})
    if not children:
        return
    if depth == 0:
        console.print(Text("processes it made:", style="bold"))
    for c in children:
        capture = c.get("capture")
        exists = capture is not None and (path.parent / capture).is_file()
        what = f"{c.get('origin')}" + (f" {c['path']}" if c.get("path") else "")
        status = c.get("ended") or "?"
        where = f" -> {capture}" if exists else " (no capture)"
        console.print(Text("  " * (depth + 1) + f"pid {c.get('pid')} {what}: {status}") + plain(where))
        if exists and depth < 8:
            child_end: dict[str, Any] = {}
            try:
                for r in read_records(path.parent / capture):
                    if r.type == RecordType.END:
                        child_end = r.body
            except Exception:  # noqa: BLE001 -- a damaged child capture is listed, not followed
                child_end = {}
            show_children(console, path.parent / capture, child_end, depth + 1)


command = show
