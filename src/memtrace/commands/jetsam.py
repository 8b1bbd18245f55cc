"""``memtrace jetsam``: read JetsamEvent reports (files, folders, or pulled from a device).

Exit status: 0 when every report was read, 1 when at least one was skipped as unreadable
(each skip is reported on stderr with the file and the reason), 2 on errors.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import click

from memtrace.analyze import jetsam as analysis
from memtrace.devices import parse_device_spec
from memtrace.errors import InputError
from memtrace.files import save_json
from memtrace.reporters.console import cells, inert, plain

# Cap what we read: the largest real JetsamEvent reports are a few MB.
MAX_REPORT_BYTES = 64 * 1024 * 1024


def collect_paths(paths: tuple[str, ...]) -> list[Path]:
    """Files as given; folders searched recursively for ``JetsamEvent*.ips``."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            # Every match but a folder: a FIFO or device among them is skipped with what it is.
            found.extend(sorted(q for q in p.rglob("JetsamEvent*.ips") if not q.is_dir()))
        elif p.is_file():
            found.append(p)
        elif p.exists():        # a FIFO would block the read forever
            raise InputError(f"{raw}: not a regular file (a report is a file, not a FIFO, device or socket)")
        else:
            raise InputError(f"{raw}: no such file or folder")
    return found


def read_reports(paths: list[Path]) -> tuple[list[analysis.JetsamReport], list[tuple[str, str]]]:
    reports: list[analysis.JetsamReport] = []
    skipped: list[tuple[str, str]] = []
    for path in paths:
        try:
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):            # a FIFO would block the read for ever
                raise analysis.JetsamParseError(f"{path}: not a regular file (a FIFO, device or socket); not read")
            size = st.st_size
            if size > MAX_REPORT_BYTES:
                raise analysis.JetsamParseError(f"{path}: {size} bytes is too large for a JetsamEvent")
            text = path.read_bytes().decode("utf-8", errors="replace")
            reports.append(analysis.parse_report(text, str(path)))
        except analysis.JetsamParseError as e:
            skipped.append((str(path), str(e)))
        except OSError as e:
            skipped.append((str(path), f"{path}: {e.strerror or e}"))
    return reports, skipped


def _render_rich(agg: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    fb = analysis.format_bytes
    t = agg["totals"]
    console.print(f"[bold]{t['reports']}[/] report(s), [bold]{t['kills']}[/] kill(s), "
                  f"{t['skipped']} skipped")
    # Every value below comes from a report file: inert text (a process name can hold escape
    # sequences or rich markup), never a markup string.
    for r in agg["reports"]:
        table = Table(title=plain(f"{Path(r['source']).name}: {r['product'] or '?'}, {r['os_version'] or '?'}, "
                                  f"{r['timestamp'] or '?'}"), title_justify="left")
        for col in ("pid", "process", "footprint", "lifetime max", "reason", "killDelta", "priority"):
            table.add_column(col, justify="right" if col not in ("process", "reason") else "left")
        killed_pids = {k["pid"] for k in r["killed"]}
        rows = r["killed"] + [p for p in r["top_processes"] if p["pid"] not in killed_pids]
        for p in rows:
            style = "bold red" if p["reason"] else None
            table.add_row(*cells([p["pid"], p["name"], fb(p["footprint"]), fb(p["lifetime_max"]),
                                  p["reason"] or "", "" if p["kill_delta"] is None else p["kill_delta"],
                                  "" if p["priority"] is None else p["priority"]]), style=style)
        console.print(table)
        mp = r["memory_pages"]
        if mp:
            console.print(plain("  pages: " + ", ".join(f"{k} {v} ({fb(v * r['page_size'])})" for k, v in mp.items())
                                + f"; largest process: {r['largest_process'] or '?'}"))
    if len(agg["reports"]) > 1:
        if agg["kills_by_reason"]:
            table = Table(title="Kills by reason", title_justify="left")
            table.add_column("reason")
            table.add_column("kills", justify="right")
            for reason, n in agg["kills_by_reason"].items():
                table.add_row(*cells([reason, n]))
            console.print(table)
        if agg["kills_by_process"]:
            table = Table(title="Kills by process", title_justify="left")
            for col in ("process", "kills", "reasons", "max footprint"):
                table.add_column(col, justify="right" if col in ("kills", "max footprint") else "left")
            for e in agg["kills_by_process"]:
                table.add_row(*cells([e["name"], e["kills"], ", ".join(f"{k} ×{v}" for k, v in e["reasons"].items()),
                                      fb(e["max_footprint"])]))
            console.print(table)
    if agg["limit_by_model"]:
        table = Table(title="Memory limit per device model (footprint at per-process-limit kill)",
                      title_justify="left")
        for col in ("model", "OS", "kills", "min", "median", "max"):
            table.add_column(col, justify="left" if col in ("model", "OS") else "right")
        for e in agg["limit_by_model"]:
            table.add_row(*cells([e["product"], ", ".join(e["os_versions"]), e["kills"], fb(e["footprint_min"]),
                                  fb(e["footprint_median"]), fb(e["footprint_max"])]))
        console.print(table)


@click.command("jetsam")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--pull", is_flag=True, help="Copy JetsamEvent reports from the device first (pymobiledevice3).")
@click.option("--device", "device", default="auto", show_default=True,
              help="auto|usb|id:UDID|remote:HOST[:PORT] (lockdown TCP port, default 62078) for --pull.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="jetsam-reports", show_default=True,
              help="Folder --pull copies the reports into.")
@click.option("--json", "as_json", is_flag=True, help="Print the aggregate as JSON on stdout.")
@click.option("--out-json", type=click.Path(dir_okay=False), help="Also save the JSON aggregate to this file.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Processes per report in the top-by-footprint list.")
@click.option("--quiet", "-q", is_flag=True, help="No table; only errors and skipped reports.")
def jetsam(paths: tuple[str, ...], pull: bool, device: str, out_dir: str, as_json: bool,
           out_json: str | None, top: int, quiet: bool) -> int:
    """Parse JetsamEvent .ips reports: who was killed, why, at what footprint, per device model."""
    files = collect_paths(paths)
    if pull:
        from memtrace.ios import DeviceTarget, pull_jetsam_reports

        spec = parse_device_spec(device)
        if spec.kind == "local":
            raise InputError("--pull needs an iOS device (--device auto|usb|id:UDID|remote:HOST)")
        target = DeviceTarget(udid=spec.udid, host=spec.host, port=spec.port)
        pulled = pull_jetsam_reports(target, Path(out_dir))
        if not quiet:
            click.echo(f"pulled {len(pulled)} JetsamEvent report(s) into {inert(out_dir)}", err=True)
        files.extend(pulled)
    if not files:
        if paths:
            raise InputError(f"no JetsamEvent reports (JetsamEvent*.ips) in {', '.join(paths)}")
        raise InputError("no JetsamEvent reports given (pass files or folders, or --pull)")

    reports, skipped = read_reports(files)
    for _source, reason in skipped:
        click.echo(f"memtrace: skipped {inert(reason)}", err=True)
    agg = analysis.aggregate(reports, skipped, top=top)
    if out_json:
        save_json(Path(out_json), agg, "--out-json")
    if as_json:
        sys.stdout.write(json.dumps(agg, indent=2, ensure_ascii=False) + "\n")
    elif not quiet:
        _render_rich(agg)
    return 1 if skipped else 0


command = jetsam
