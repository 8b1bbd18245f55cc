"""memtrace probe: which entries really drive the purgeable state machine, with ledger evidence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markdown import Markdown

from memtrace.analyze.probe import render_markdown, summarize
from memtrace.capture import read_records
from memtrace.commands.options import emit_json, exit_code, run_capture, target_options
from memtrace.errors import InputError
from memtrace.files import write_text_atomic


@click.command("probe", context_settings={"ignore_unknown_options": True})
@click.option("--markdown", "markdown_path", type=click.Path(path_type=Path), metavar="FILE",
              help="Also write the truth table as Markdown to FILE.")
@target_options
def probe(markdown_path: Path | None, **kw: Any) -> int:
    """Run the routing probe inside the target: madvise 4/5/7/8, SET VOLATILE/NONVOLATILE/EMPTY, reacquire."""
    if markdown_path is not None and markdown_path.exists():
        raise InputError(f"--markdown {markdown_path}: already exists; choose a new file")
    result = run_capture("probe", {}, **kw)
    summary = summarize(read_records(result.path)).to_json(capture=str(result.path))
    text = render_markdown(summary)
    if markdown_path is not None:
        try:
            write_text_atomic(markdown_path, text)
        except OSError as e:
            raise InputError(f"--markdown {markdown_path}: cannot write: {e.strerror}") from None
    if kw["as_json"]:
        emit_json(summary)
    elif not kw["quiet"]:
        Console().print(Markdown(text))
    return exit_code(result)


command = probe
