"""memtrace flamegraph: one capture as a self-contained HTML flame graph."""

from __future__ import annotations

from pathlib import Path

import click

from memtrace.files import save_text
from memtrace.reporters.html import flamegraph_page
from memtrace.views import load
from memtrace.views.profile import VIEWS


@click.command("flamegraph")
@click.argument("capture", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="The HTML file to write.")
@click.option("--view", type=click.Choice(VIEWS), default="gross", show_default=True,
              help="The view the page opens on (every view the capture has is in the page).")
def command(capture: Path, output: Path, view: str) -> int:
    """Write CAPTURE's flame graph to an HTML file: one file, no network, with zoom, search,
    tooltips (bytes, count, file:line) and the memory timeline above it."""
    loaded = load(capture)
    save_text(output, flamegraph_page(loaded, view), "-o")
    click.echo(f"flame graph: {output}", err=True)
    if loaded.info.problem is not None:
        click.echo(f"memtrace: warning: {loaded.path}: {loaded.info.problem}", err=True)
        return 1
    return 0
