"""``memtrace census``: every process's footprint, limit and jetsam band, with nothing injected into them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from memtrace import devices
from memtrace.analyze import census as analysis
from memtrace.files import write_json_atomic


def collect(device_spec: str, host_process: str) -> dict[str, Any]:
    from memtrace import census

    spec = devices.parse_device_spec(device_spec)
    if spec.kind == "local":
        return census.census_linux()
    device = devices.resolve(spec)
    if devices.is_local(device):
        return census.census_linux()
    return census.census_device(device, host_process)


def _render_rich(doc: dict[str, Any], rows: list[dict[str, Any]], limit: int | None) -> None:
    from rich.console import Console
    from rich.table import Table

    fb = analysis.format_bytes
    darwin = doc["platform"] == "darwin"
    table = Table(title=f"census of {doc['device']['name']} ({doc['platform']}, {doc['time']})",
                  title_justify="left")
    cols = ["pid", "process", "footprint", "lifetime max"]
    cols += ["purg vol", "purg nonvol", "reusable", "graphics"] if darwin else ["pss", "swap", "lazyfree"]
    cols += ["band", "limit", "status"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("process", "band", "status") else "right",
                         overflow="fold" if col == "process" else "ellipsis")
    shown = rows if limit is None else rows[:limit]
    for r in shown:
        band = r.get("band") or ""
        if r.get("priority") is not None:
            band = f"{band} ({r['priority']})"
        cells = [str(r["pid"]), r.get("name") or "?", fb(r.get("footprint")), fb(r.get("lifetime_max"))]
        if darwin:
            cells += [fb(r.get("purgeable_volatile")), fb(r.get("purgeable_nonvolatile")), fb(r.get("reusable")),
                      fb(r.get("graphics"))]
        else:
            cells += [fb(r.get("pss")), fb(r.get("swap")), fb(r.get("reusable"))]
        status = r.get("status", "")
        cells += [band, fb(r.get("limit")), status]
        table.add_row(*cells, style=None if status == "ok" else "dim")
    console = Console()
    console.print(table)
    t = doc["totals"]
    extra = f", {len(rows) - len(shown)} more not shown (--all)" if len(shown) < len(rows) else ""
    console.print(
        f"[bold]total[/]: {t['processes']} processes ({t['measured']} measured, {t['vanished']} vanished, "
        f"{t['denied']} denied{extra}); footprint {fb(t['footprint'])}"
        + (f", purgeable {fb(t['purgeable_volatile'])} volatile / {fb(t['purgeable_nonvolatile'])} nonvolatile"
           if darwin else "")
        + (f", reusable {fb(t['reusable'])}" if t.get("reusable") else ""))
    for source, message in doc.get("errors", {}).items():
        console.print(f"[yellow]warning[/]: {source}: {message}")


@click.command("census")
@click.option("--device", "device", default="auto", show_default=True,
              help="auto|local|usb|id:UDID|remote:HOST[:PORT] (auto: a USB device if any, else local).")
@click.option("--host-process", default="0", show_default=True,
              help="iOS: pid or name of the one process the census agent runs in (0 = frida-server's "
                   "system session; e.g. launchd or SpringBoard).")
@click.option("--sort", "sort_key", type=click.Choice(analysis.SORT_KEYS), default="footprint", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the census document as JSON on stdout.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False),
              help="Also save the census JSON here (e.g. into a report folder as census-1.json).")
@click.option("--top", type=click.IntRange(min=1), default=40, show_default=True, help="Rows in the table.")
@click.option("--all", "show_all", is_flag=True, help="Show every process in the table.")
@click.option("--quiet", "-q", is_flag=True, help="No table (useful with --out).")
def census(device: str, host_process: str, sort_key: str, as_json: bool, out_file: str | None, top: int,
           show_all: bool, quiet: bool) -> int:
    """List every process with its footprint, lifetime max, purgeable/reusable memory, band and limit."""
    doc = collect(device, host_process)
    doc["rows"] = analysis.sort_rows(doc["rows"], sort_key)
    if out_file:
        write_json_atomic(Path(out_file), doc)
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    elif not quiet:
        _render_rich(doc, doc["rows"], None if show_all else top)
    return 0


command = census
