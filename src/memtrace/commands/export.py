"""memtrace export: a capture as JSON lines, for scripts and other tools."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from memtrace.capture import CaptureInfo, read_records, record_to_json


@click.command("export")
@click.argument("capture", type=click.Path(path_type=Path))
@click.option("--jsonl", is_flag=True, default=True, help="One JSON object per line (the default and only format).")
def export(capture: Path, jsonl: bool) -> int:
    """Print every record of CAPTURE (a capture file or folder) as JSON lines.

    Exit status 1 when the capture is truncated (everything before the tear is still printed)."""
    info = CaptureInfo(capture)
    out = sys.stdout
    for record in read_records(capture, info):
        for obj in record_to_json(record):
            out.write(json.dumps(obj, separators=(",", ":")) + "\n")
    if info.truncated:
        # Everything up to the last flush was printed; the status tells scripts the tail is missing.
        out.write(json.dumps({"record": "truncated", "detail": info.truncation}) + "\n")
        click.echo(f"memtrace: warning: {info.path}: {info.truncation}", err=True)
        return 1
    return 0


command = export
