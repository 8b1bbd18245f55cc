"""``memtrace doctor [target options]``: the first command to run on a new host or device.

Checks the host (frida, ptrace, the CModule compiler), the device (OS, model, jailbreak,
developer mode, lockdown, frida-server's version) and, inside a harmless program or the named
target, every tracer's hook points, the CModule build, a self-test and the purgeable probe.
Exit status 0 when every tracer can work, 1 when one cannot, 2 on a usage error.
"""

from __future__ import annotations

from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from memtrace import doctor
from memtrace.commands.trace import emit_json
from memtrace.reporters.console import plain
from memtrace.target import TARGET_OPTIONS, target_from_values
from memtrace.tracers.options import apply

STYLE = {doctor.OK: "green", doctor.WARN: "yellow", doctor.FAIL: "bold red", doctor.SKIP: "dim"}


def render(report: doctor.Report, console: Console) -> None:
    table = Table(title="memtrace doctor", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("", "check", "status", "detail"):
        table.add_column(col, overflow="fold", no_wrap=col in ("", "status"))
    section = None
    for c in report.checks:
        table.add_row(c.section if c.section != section else "", plain(c.name), Text(c.status, style=STYLE[c.status]),
                      plain(c.detail))
        section = c.section
    console.print(table)
    failed = [c for c in report.checks if c.status == doctor.FAIL]
    if failed:
        console.print(Text.assemble(("not ready: ", "bold red"),
                                    plain("; ".join(f"{c.name}: {c.detail}" for c in failed[:3]))))
    else:
        console.print(Text("ready: every tracer that applies here can work", style="green"))


def run(program: tuple[str, ...], **values: Any) -> int:
    as_json = values.pop("as_json")
    given = any(values.get(k) for k in ("app", "pid", "name", "file", "attach_identifier")) or program
    target = target_from_values(values, program) if given else None
    report = doctor.run(target, target.device if target is not None else _device(values))
    if as_json:
        emit_json(report.to_json())
    else:
        render(report, Console())
    return 0 if report.ok else 1


def _device(values: dict[str, Any]) -> str:
    from memtrace import devices

    return devices.spec_from_frida_flags(values.get("device"), bool(values.get("usb")), bool(values.get("remote")),
                                         values.get("device_id"), values.get("host"))


run.__doc__ = __doc__.split("\n\n", 1)[1] if __doc__ else None
command = click.command("doctor", short_help="Check that memtrace can work here: host, device, hook points, "
                                             "a self-test.")(
    click.argument("program", nargs=-1, type=click.UNPROCESSED)(
        click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON on stdout.")(
            apply([o for o in TARGET_OPTIONS if o.name != "launch"], run))))
