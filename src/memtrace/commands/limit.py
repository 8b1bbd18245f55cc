"""``memtrace limit``: a process's footprint, the memory still available to it, and its limit."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from memtrace import devices
from memtrace.analyze.census import format_bytes as fb
from memtrace.errors import InputError, is_frida_error
from memtrace.limit import IOSLimitProbe, limit_document, linux_sample, watch_series
from memtrace.reporters.console import cells, plain


def _local_pid_by_name(name: str) -> int:
    from memtrace.census import LinuxScanner

    scanner = LinuxScanner()
    matches = []
    for pid in scanner.pids():
        row = scanner.row(pid)
        if row is not None and row.get("name") == name:
            matches.append(pid)
    if not matches:
        raise InputError(f"no process named {name!r}")
    if len(matches) > 1:
        raise InputError(f"{len(matches)} processes named {name!r} ({', '.join(map(str, matches[:8]))}); use --pid")
    return matches[0]


def _render(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    # The process name and the bounds' details come from the target: inert text, not markup.
    console.print(Text.assemble(plain(doc.get("name") or "?", "bold"), f" (pid {doc['pid']}, {doc['platform']}): "
                                "footprint ", (fb(doc.get("footprint")), "bold"), f", available "
                                f"{fb(doc.get('available'))}, limit ", (fb(doc.get("limit")), "bold"),
                                plain(f" (binding: {doc['binding']})" if doc.get("binding") else ""),
                                plain(f" (from {doc['limit_source']})" if doc.get("limit_source") else "")))
    if doc.get("bounds"):
        table = Table(title="bounds", title_justify="left")
        for col in ("bound", "limit", "used", "available", "how"):
            table.add_column(col, justify="left" if col in ("bound", "how") else "right")
        for b in doc["bounds"]:
            mark = " ◀" if b["name"] == doc.get("binding") else ""
            table.add_row(*cells([b["name"] + mark, fb(b["limit"]), fb(b["used"]), fb(b["available"]), b["detail"]]))
        console.print(table)
    if doc.get("memlimit"):
        m = doc["memlimit"]
        console.print(f"memorystatus limits: active {fb(m.get('active'))}{' (fatal)' if m.get('active_fatal') else ''}"
                      f", inactive {fb(m.get('inactive'))}{' (fatal)' if m.get('inactive_fatal') else ''}")
    for source, message in (doc.get("errors") or {}).items():
        console.print(Text.assemble(("warning", "yellow"), ": ", plain(source), ": ", plain(message)))
    if "series" in doc:
        table = Table(title="footprint over time", title_justify="left")
        for col in ("t (s)", "footprint", "available", "limit"):
            table.add_column(col, justify="right")
        for s in doc["series"]:
            table.add_row(f"{s['t']:.1f}", fb(s["footprint"]), fb(s["available"]), fb(s["limit"]))
        console.print(table)
        if doc.get("stopped"):
            console.print(Text.assemble(("stopped early", "yellow"), ": ", plain(doc["stopped"])))
    for e in doc.get("pressure_events", []):
        share = ""
        if isinstance(e.get("footprint"), int) and isinstance(e.get("available"), int) and e["footprint"] + e["available"]:
            share = f" = {100 * e['footprint'] / (e['footprint'] + e['available']):.0f}% of the limit"
        console.print(Text.assemble(("memory pressure", "red"), plain(f" {e.get('event')} via {e.get('via')} at "
                                                                       f"footprint {fb(e.get('footprint'))}{share}")))


@click.command("limit")
@click.option("--pid", type=int, help="Target process id.")
@click.option("--name", help="Target process name (must be unique).")
@click.option("--device", "device", default="auto", show_default=True,
              help="auto|local|usb|id:UDID|remote:HOST[:PORT]")
@click.option("--watch", "watch", type=click.FloatRange(min=0), default=None,
              help="Sample for this many seconds (a footprint-over-time series; iOS: also memory warnings).")
@click.option("--interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="Seconds between samples with --watch.")
@click.option("--source", type=click.Choice(("auto", "frida", "dvt")), default="auto", show_default=True,
              help="iPhone: frida (agents in the process and in frida-server: the memorystatus limit), dvt (a "
                   "stock device: Sysmontap footprints, the live log's pressure messages, the limit from "
                   "JetsamEvent history), auto (frida, else dvt).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No output but errors (with --json: JSON only).")
def limit(pid: int | None, name: str | None, device: str, watch: float | None, interval: float, source: str,
          as_json: bool, quiet: bool) -> int:
    """Footprint, memory still available, and the limit that binds (no injection on Linux)."""
    if (pid is None) == (name is None):
        raise InputError("give exactly one of --pid or --name")
    spec = devices.parse_device_spec(device)
    if source == "dvt" and spec.kind in ("local", "remote"):
        raise InputError(f"--source dvt: --device {device}: Instruments' services are reached over USB")
    frida_device = None if spec.kind == "local" or source == "dvt" else devices.resolve(spec)
    events: list[dict[str, Any]] = []
    probe: Any
    if source == "dvt" or (frida_device is not None and not devices.is_local(frida_device) and source == "auto"
                           and _stock(frida_device)):
        from memtrace.dvt.limit import StockLimitProbe

        udid = spec.udid or getattr(frida_device, "id", None)
        target = pid if pid is not None else _stock_pid_by_name(udid, name or "")
        probe = StockLimitProbe(udid, target)
        platform = "darwin"
        sample = probe.sample
    elif frida_device is None or devices.is_local(frida_device):
        target = pid if pid is not None else _local_pid_by_name(name or "")
        first = linux_sample(target)
        platform = "linux"

        def sample() -> dict[str, Any]:
            return linux_sample(target)

        probe = None
    else:
        target = pid if pid is not None else devices.find_pid(frida_device, name or "")
        probe = IOSLimitProbe(frida_device, target)
        platform = "darwin"
        sample = probe.sample
    try:
        if probe is not None and watch is not None:
            probe.watch()
        first = sample()
        series, stopped = watch_series(sample, watch, interval) if watch is not None else (None, None)
        if probe is not None:
            events = probe.events
            stopped = stopped or (f"detached: {probe.detached}" if probe.detached else None)
    finally:
        if probe is not None:
            probe.close()
    doc = limit_document(platform, first, series, events, stopped)
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    elif not quiet:
        _render(doc)
    return 0


def _stock_pid_by_name(udid: str | None, name: str) -> int:
    from memtrace.dvt.census import census_stock

    matches = [r["pid"] for r in census_stock(udid)["rows"] if r.get("name") == name]
    if len(matches) != 1:
        raise InputError(f"{len(matches) or 'no'} process(es) named {name!r} on the device; use --pid")
    return int(matches[0])


def _stock(frida_device: Any) -> bool:
    """No frida-server answers on this device (a stock iPhone): Instruments it is."""
    try:
        frida_device.query_system_parameters()
    except Exception as e:  # noqa: BLE001 -- Frida's own errors: no frida-server to reach
        return is_frida_error(e)
    return False


command = limit
