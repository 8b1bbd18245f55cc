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
        doc["processes"] = children_tree(loaded.path, getattr(loaded.summary, "end", None) or {})
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


def children_tree(path: Path, end: dict[str, Any], depth: int = 0) -> list[dict[str, Any]]:
    """The processes the target made, each with how it ended and its capture (when that file
    exists in the folder), and theirs under them (``children``): ``show --json``'s ``processes``."""
    from memtrace.capture import RecordType, read_records

    children = [c for c in end.get("children") or [] if isinstance(c, dict)]
    exec_info = (end.get("evidence") or {}).get("exec") or {}
    if exec_info.get("followed"):       # the image it exec'd, traced in a capture of its own
        children.append({"pid": end.get("pid"), "origin": "exec", "path": exec_info.get("path"),
                         "capture": exec_info["followed"], "ended": "replaced it"})
    out = []
    for c in children:
        item = {k: c.get(k) for k in ("pid", "ppid", "origin", "path", "ended", "reason") if c.get(k) is not None}
        capture = c.get("capture")
        if isinstance(capture, str) and (path.parent / capture).is_file():
            item["capture"] = capture
            child_end: dict[str, Any] = {}
            if depth < 8:
                try:
                    for r in read_records(path.parent / capture):
                        if r.type == RecordType.END:
                            child_end = r.body
                except Exception:  # noqa: BLE001 -- a damaged child capture is listed, not followed
                    child_end = {}
            if "ended" not in item and child_end.get("ended"):
                # still running when this END was written: how its own capture ended
                item["ended"], item["reason"] = child_end["ended"], child_end.get("reason")
            item["children"] = children_tree(path.parent / capture, child_end, depth + 1)
        out.append(item)
    return out


def show_children(console: Console, path: Path, end: dict[str, Any]) -> None:
    """The processes the target made (:func:`children_tree`), nested: a process is shown with its children."""
    from rich.text import Text

    from memtrace.reporters.console import plain

    def lines(tree: list[dict[str, Any]], depth: int) -> None:
        for c in tree:
            what = f"{c.get('origin')}" + (f" {c['path']}" if c.get("path") else "")
            where = f" -> {c['capture']}" if c.get("capture") else " (no capture)"
            console.print(Text("  " * (depth + 1) + f"pid {c.get('pid')} {what}: {c.get('ended') or '?'}") + plain(where))
            lines(c.get("children") or [], depth + 1)

    tree = children_tree(path, end)
    if tree:
        console.print(Text("processes it made:", style="bold"))
        lines(tree, 0)


command = show
