"""memtrace report: every capture under a folder -> REPORT.md, report.json and report.html."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from memtrace.report import build_report
from memtrace.reporters.console import inert


@click.command("report")
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False))
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="Write REPORT.md, report.json and report.html here (default: into FOLDER).")
@click.option("--families", "families", type=click.Path(path_type=Path, dir_okay=False), metavar="RULES.yaml",
              help="Stack family rules added to (and overriding) the built-in ones.")
@click.option("--json", "as_json", is_flag=True, help="Also print report.json on stdout.")
@click.option("--jobs", "-j", type=click.IntRange(1), default=None,
              help="Captures analyzed at once, one per process (default: one per core, fewer when the "
                   "largest capture would not leave room in 600 MB).")
@click.option("--progress/--no-progress", default=None,
              help="A line on standard error as each capture is done (default: when standard error is a terminal).")
def report(folder: Path, out: Path | None, families: Path | None, as_json: bool, jobs: int | None,
           progress: bool | None) -> int:
    """Aggregate every capture under FOLDER (any tracers, targets and runs) into REPORT.md, report.json
    and report.html (the same chapters), with one flame graph page per capture in report-flames/.
    Captures are analyzed in parallel, one line on standard error as each is done.

    Exit status 0 when every capture was read in full, 1 when any file was skipped or only partly
    read (listed in the report's "Captures skipped" section), 2 on a usage error.
    """
    def show(done: int, total: int, path: str, seconds: float, status: str) -> None:
        click.echo(f"report: [{done}/{total}] {inert(path)}: {status} ({seconds:.1f} s)", err=True)

    if progress is None:
        progress = sys.stderr.isatty()
    result = build_report(folder, out=out, families=families, jobs=jobs, progress=show if progress else None)
    if as_json:
        sys.stdout.write(json.dumps(result.document, indent=1, ensure_ascii=False) + "\n")
    for s in result.skipped:
        click.echo(f"memtrace: skipped{' (partly read)' if s.partial else ''}: {inert(s.path)}: {inert(s.reason)}",
                   err=True)
    for p in result.paths:
        click.echo(f"wrote {inert(p)}", err=True)
    return result.exit_code


command = report
