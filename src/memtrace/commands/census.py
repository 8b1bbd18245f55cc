"""``memtrace census``: every process's footprint, limit and jetsam band, with nothing injected into them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich import box

from memtrace import devices
from memtrace.analyze import census as analysis
from memtrace.errors import first_line as _first_line
from memtrace.files import save_json
from memtrace.reporters.console import cells, plain

SOURCES = ("auto", "frida", "dvt")


def collect(device_spec: str, host_process: str, source: str = "auto") -> dict[str, Any]:
    """The census document: /proc locally; on an iPhone frida-server's census agent (jailbroken:
    bands and limits too) or Instruments' Sysmontap (a stock device: footprints, no bands).
    ``auto`` tries Frida first and falls back to Sysmontap when no frida-server answers."""
    from memtrace import census
    from memtrace.errors import InputError, MemtraceError

    spec = devices.parse_device_spec(device_spec)
    if source == "dvt":
        if spec.kind in ("local", "remote"):
            raise InputError(f"--source dvt: --device {device_spec}: Instruments' services are reached over USB")
        from memtrace.dvt.census import census_stock

        return census_stock(spec.udid)
    if spec.kind == "local":
        return census.census_linux()
    device = devices.resolve(spec)
    if devices.is_local(device):
        return census.census_linux()
    if source == "frida":
        return census.census_device(device, host_process)
    try:
        return census.census_device(device, host_process)
    except Exception as frida_error:  # noqa: BLE001 -- no frida-server (a stock device): try Instruments
        if spec.kind == "remote":
            raise
        from memtrace.dvt.census import census_stock

        try:
            doc = census_stock(spec.udid or getattr(device, "id", None))
        except MemtraceError as dvt_error:
            raise MemtraceError(f"census: frida-server did not answer ({_first_line(frida_error)}) and neither "
                                f"did Instruments ({dvt_error})") from None
        doc["notes"].append(f"frida-server did not answer ({_first_line(frida_error)}): measured through "
                            "Instruments' Sysmontap instead")
        return doc


# Columns by how much they matter: a narrow terminal drops the last ones (named below the table)
# instead of folding every cell into an unreadable column of fragments.
BASE_COLUMNS = (("pid", "pid"), ("name", "process"), ("footprint", "footprint"))
EXTRA_COLUMNS = {
    "darwin": (("lifetime_max", "max"), ("band", "band"), ("limit", "limit"), ("status", "status"),
               ("purgeable_volatile", "purg vol"), ("purgeable_nonvolatile", "purg nonvol"),
               ("reusable", "reusable"), ("graphics", "graphics")),
    "linux": (("lifetime_max", "max"), ("band", "band"), ("limit", "limit"), ("status", "status"),
              ("pss", "pss"), ("swap", "swap"), ("reusable", "lazyfree")),
    # A stock iPhone (Sysmontap): no bands or limits, compressed and resident instead.
    "darwin-stock": (("purgeable_volatile", "purgeable"), ("compressed", "compressed"), ("rss", "resident"),
                     ("status", "status")),
}
TEXT_COLUMNS = ("name", "band", "status")
NAME_WIDTH = (8, 24)        # the process column folds long names within these bounds
GAP = 3                     # between two columns: padding on each side and the divider


def fit_columns(platform: str, rows: list[dict[str, Any]], width: int) -> tuple[list[tuple[str, str]], list[str]]:
    """The columns whose widest cell fits in ``width`` characters, and the headers of those left out."""
    def need(key: str, header: str) -> int:
        widest = max([len(header), *(len(str(_cell(r, key))) for r in rows)])
        return min(max(widest, NAME_WIDTH[0]), NAME_WIDTH[1]) if key == "name" else widest

    cols = list(BASE_COLUMNS)
    used = sum(need(*c) for c in cols) + GAP * (len(cols) - 1)
    dropped: list[str] = []
    for col in EXTRA_COLUMNS[platform if platform in EXTRA_COLUMNS else "linux"]:
        extra = need(*col) + GAP
        if not dropped and used + extra <= width:
            cols.append(col)
            used += extra
        else:
            dropped.append(col[1])
    return cols, dropped


def _cell(r: dict[str, Any], key: str) -> Any:
    if key == "pid":
        return str(r.get("pid"))
    if key == "name":
        return r.get("name") or "?"
    if key == "band":
        band = r.get("band") or ""
        return f"{band} ({r['priority']})" if r.get("priority") is not None else band
    if key == "status":
        return r.get("status", "")
    return analysis.format_bytes(r.get(key))


def _render_rich(doc: dict[str, Any], rows: list[dict[str, Any]], limit: int | None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    fb = analysis.format_bytes
    darwin = doc["platform"] == "darwin"
    console = Console()
    shown = rows if limit is None else rows[:limit]
    stock = darwin and doc["device"].get("source") == "sysmontap"
    cols, dropped = fit_columns("darwin-stock" if stock else doc["platform"], shown, console.width)
    table = Table(title=plain(f"census of {doc['device']['name']} ({doc['platform']}, {doc['time']})"),
                  title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1))
    for key, header in cols:
        table.add_column(header, justify="left" if key in TEXT_COLUMNS else "right",
                         overflow="fold" if key == "name" else "ellipsis", no_wrap=key != "name",
                         max_width=NAME_WIDTH[1] if key == "name" else None)
    for r in shown:
        status = r.get("status", "")
        table.add_row(*cells(_cell(r, key) for key, _ in cols), style=None if status == "ok" else "dim")
    console.print(table)
    t = doc["totals"]
    extra = f", {len(rows) - len(shown)} more not shown (--all)" if len(shown) < len(rows) else ""
    console.print(Text.assemble(
        ("total", "bold"),
        f": {t['processes']} processes ({t['measured']} measured, {t['vanished']} vanished, "
        f"{t['denied']} denied{extra}); footprint {fb(t['footprint'])}"
        + (f", purgeable {fb(t['purgeable_volatile'])} volatile / {fb(t['purgeable_nonvolatile'])} nonvolatile"
           if darwin else "")
        + (f", reusable {fb(t['reusable'])}" if t.get("reusable") else "")))
    if dropped:
        console.print(f"(not shown at {console.width} columns: {', '.join(dropped)}; widen the terminal or "
                      f"use --json)", style="dim", markup=False)
    if stock:
        for note in doc.get("notes", [])[:1]:
            console.print(note, style="dim", markup=False)
    for source, message in doc.get("errors", {}).items():
        console.print(Text.assemble(("warning", "yellow"), ": ", plain(source), ": ", plain(message)))


@click.command("census")
@click.option("--device", "device", default="auto", show_default=True,
              help="auto|local|usb|id:UDID|remote:HOST[:PORT] (auto: a USB device if any, else local).")
@click.option("--host-process", default="0", show_default=True,
              help="iOS: pid or name of the one process the census agent runs in (0 = frida-server's "
                   "system session; e.g. launchd or SpringBoard).")
@click.option("--source", type=click.Choice(SOURCES), default="auto", show_default=True,
              help="iPhone: frida (a jailbroken device's frida-server: bands and limits too), dvt (a stock "
                   "device through Instruments' Sysmontap), auto (frida, else dvt).")
@click.option("--sort", "sort_key", type=click.Choice(analysis.SORT_KEYS), default="footprint", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the census document as JSON on stdout.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False),
              help="Also save the census JSON here (e.g. into a report folder as census-1.json).")
@click.option("--top", type=click.IntRange(min=1), default=40, show_default=True, help="Rows in the table.")
@click.option("--all", "show_all", is_flag=True, help="Show every process in the table.")
@click.option("--quiet", "-q", is_flag=True, help="No table (useful with --out).")
def census(device: str, host_process: str, source: str, sort_key: str, as_json: bool, out_file: str | None, top: int,
           show_all: bool, quiet: bool) -> int:
    """List every process with its footprint, lifetime max, purgeable/reusable memory, band and limit."""
    doc = collect(device, host_process, source)
    doc["rows"] = analysis.sort_rows(doc["rows"], sort_key)
    if out_file:
        save_json(Path(out_file), doc, "--out")
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    elif not quiet:
        _render_rich(doc, doc["rows"], None if show_all else top)
    return 0


command = census
