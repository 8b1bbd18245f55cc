"""memtrace export: a capture as JSON lines (every record), or for other tools (memtrace.exports)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO

import click

from memtrace import tracers
from memtrace.capture import CaptureError, CaptureInfo, damage_at, read_records, record_to_json
from memtrace.errors import MemtraceError
from memtrace.exports import BINARY, FORMATS, folded
from memtrace.files import open_text_atomic, save_bytes
from memtrace.views import load


@click.command("export")
@click.argument("capture", type=click.Path(path_type=Path))
@click.option("--jsonl", is_flag=True, default=False, help="Same as --format jsonl.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", *FORMATS]), default="jsonl", show_default=True,
              help="jsonl: every record; collapsed: folded stacks (flamegraph.pl); speedscope: speedscope's JSON; "
                   "pprof: gzipped profile.proto (a Go heap profile for malloc's gross and live); chrome-trace: "
                   "trace events for the Perfetto UI; parquet: a row per stack and view with its frames and the "
                   "capture's identity (needs pyarrow: pip install 'memtrace[parquet]').")
@click.option("--view", type=click.Choice(tracers.all_views()), default="gross", show_default=True,
              help="Which bytes the stack formats weigh (malloc).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write to this file (atomically) instead of standard output.")
@click.option("--lines", "with_lines", is_flag=True,
              help="collapsed: each frame with its file:line (function (module) file.c:42).")
def export(capture: Path, jsonl: bool, fmt: str, view: str, output: Path | None, with_lines: bool) -> int:
    """Print every record of CAPTURE (a capture file or folder) as JSON lines, or export it for
    another tool with --format.

    Exit status 0 when the capture was read in full; 1 when it is incomplete -- cut short,
    damaged (a checksum or a record's shape fails: the byte offset is named), without an END
    record, or stopped early by a full disk -- after printing everything before that point and a
    last {"record": "truncated"} line saying why; 2 when it cannot be read at all."""
    if with_lines and fmt != "collapsed":
        raise click.UsageError("--lines applies to --format collapsed")
    if fmt != "jsonl" and not jsonl:
        return export_for_tool(capture, fmt, view, output, with_lines)
    info = CaptureInfo(capture)
    if output is None:
        problem = write_jsonl(capture, info, sys.stdout)
    else:
        with open_text_atomic(output, "-o") as out:
            problem = write_jsonl(capture, info, out)
    if problem is not None:
        click.echo(f"memtrace: warning: {info.path}: {problem}", err=True)
        return 1
    return 0


def write_jsonl(capture: Path, info: CaptureInfo, out: IO[str]) -> str | None:
    """Every record as JSON lines; what made the capture incomplete, or None."""
    damaged = None
    for record in read_records(capture, info):
        try:
            for obj in record_to_json(record):
                out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        except CaptureError as e:       # agent records that do not decode (a crafted or buggy BATCH)
            damaged = damage_at(record, e)
            break
    problem = damaged or info.problem
    if problem is not None:
        # Everything readable was written; the last line and the status tell scripts what is missing.
        out.write(json.dumps({"record": "truncated", "detail": problem}) + "\n")
    return problem


def export_for_tool(capture: Path, fmt: str, view: str, output: Path | None, with_lines: bool = False) -> int:
    loaded = load(capture)
    try:
        data = folded.export(loaded, view, with_line=True) if with_lines else FORMATS[fmt](loaded, view)
    except MemtraceError as e:
        if loaded.info.problem is None:
            raise
        # A view missing because its records were skipped: the one line says both.
        raise MemtraceError(f"{e} ({loaded.info.problem})", e.exit_code) from None
    if output is not None:
        save_bytes(output, data, "-o")
    elif fmt in BINARY and sys.stdout.isatty():
        raise click.UsageError(f"--format {fmt} is binary: give -o FILE or redirect standard output")
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    for note in loaded.notes:       # a value the format cannot hold, clamped
        click.echo(f"memtrace: warning: {loaded.path}: {note}", err=True)
    if loaded.info.problem is not None:
        click.echo(f"memtrace: warning: {loaded.path}: {loaded.info.problem}", err=True)
        return 1
    return 1 if loaded.notes else 0


command = export
