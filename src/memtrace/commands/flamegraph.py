"""memtrace flamegraph: one capture as a self-contained HTML flame graph."""

from __future__ import annotations

from pathlib import Path

import click

from memtrace import tracers
from memtrace.errors import InputError
from memtrace.files import save_text
from memtrace.reporters.html import flame_data, flamegraph_page, has_stacks
from memtrace.views import load
from memtrace.views.flame import MIN_FRACTION

ALL_VIEWS = tracers.all_views()


@click.command("flamegraph")
@click.argument("capture", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="The HTML file to write.")
@click.option("--view", type=click.Choice(ALL_VIEWS), default=None,
              help="The view the page opens on (every view the capture has is in the page). malloc: gross "
                   "(default), live, peak, leaked, temporary; fds: open (default), failed; threads: created "
                   "(default), running, leaked.")
@click.option("--by-line", is_flag=True, help="One box per source line instead of one per function.")
@click.option("--min-fraction", type=click.FloatRange(0, 1), default=MIN_FRACTION, show_default=True,
              help="Callees under this fraction of the view's total fold into one \"other\" box per caller.")
def command(capture: Path, output: Path, view: str | None, by_line: bool, min_fraction: float) -> int:
    """Write CAPTURE's flame graph to an HTML file: one file, no network, with zoom, search,
    tooltips (full name, bytes, count, file:line) and the memory timeline above it.

    malloc captures weigh bytes; fds captures count open descriptors by the stack that opened them,
    threads captures count threads by the stack that created them.  A capture with no stacks to
    draw is an error (exit 2), not an empty page."""
    loaded = load(capture)
    data = flame_data(loaded, view or "gross", by_line, min_fraction)
    if view is not None and view not in data["views"]:
        raise InputError(f"{loaded.path}: a {loaded.tracer.name} capture has no {view} view "
                         f"(its views: {', '.join(data['views'])})")
    if not has_stacks(data):
        if loaded.info.problem is not None:
            # Cut or damaged before its stacks: the damage is the answer (exit 1, as every reader).
            raise InputError(f"{loaded.path}: no flame graph: {loaded.info.problem}", exit_code=1)
        why = "; ".join(f"{v}: {d['missing']}" for v, d in data["views"].items() if d.get("missing"))
        raise InputError(f"{loaded.path}: no flame graph: this {loaded.tracer.name} capture has no stacks to draw"
                         + (f" ({why})" if why else ""))
    save_text(output, flamegraph_page(loaded, data=data, by_line=by_line, min_fraction=min_fraction), "-o")
    click.echo(f"flame graph: {output}", err=True)
    if loaded.info.problem is not None:
        click.echo(f"memtrace: warning: {loaded.path}: {loaded.info.problem}", err=True)
        return 1
    return 0
