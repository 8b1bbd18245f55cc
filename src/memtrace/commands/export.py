"""memtrace export: a capture as JSON lines, for scripts and other tools."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from memtrace.capture import CaptureError, CaptureInfo, damage_at, read_records, record_to_json


@click.command("export")
@click.argument("capture", type=click.Path(path_type=Path))
@click.option("--jsonl", is_flag=True, default=True, help="One JSON object per line (the default and only format).")
def export(capture: Path, jsonl: bool) -> int:
    """Print every record of CAPTURE (a capture file or folder) as JSON lines.

    Exit status 0 when the capture was read in full; 1 when it is incomplete -- cut short,
    damaged (a checksum or a record's shape fails: the byte offset is named), without an END
    record, or stopped early by a full disk -- after printing everything before that point and a
    last {"record": "truncated"} line saying why; 2 when it cannot be read at all."""
    info = CaptureInfo(capture)
    out = sys.stdout
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
        # Everything readable was printed; the last line and the status tell scripts what is missing.
        out.write(json.dumps({"record": "truncated", "detail": problem}) + "\n")
        click.echo(f"memtrace: warning: {info.path}: {problem}", err=True)
        return 1
    return 0


command = export
