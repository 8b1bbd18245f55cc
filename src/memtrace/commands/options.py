"""Options every tracer shares, and the one way a tracer command runs a capture."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from memtrace.capture import Record, read_records
from memtrace.deaths import DeathThresholds
from memtrace.launchers import LAUNCHERS
from memtrace.session import CaptureOptions, CaptureResult, CaptureSession, TargetSpec
from memtrace.ui import UI, RichUI, SilentUI


def target_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--device/--app/--pid/--name/-- PROGRAM, timing, output and verbosity."""
    decorators = [
        click.option("--device", default="auto", show_default=True, metavar="auto|local|usb|id:UDID|remote:HOST[:PORT]",
                     help="Where the target runs: auto = the USB iOS device if attached, else this machine."),
        click.option("--app", metavar="BUNDLE_ID", help="Launch this app on the device and trace it."),
        click.option("--pid", type=int, help="Attach to this running process."),
        click.option("--name", "proc_name", metavar="NAME", help="Attach to the running process with this name."),
        click.option("--launch", type=click.Choice(LAUNCHERS), default="auto",
                     show_default=True,
                     help="How the target starts: Frida spawn, pymobiledevice3 (DVT), or none (attach to a running one)."),
        click.option("--attach-delay", type=float, default=0.0, show_default=True, metavar="SECONDS",
                     help="Wait this long after launch before attaching (0 = instrument before the first instruction)."),
        click.option("--window", type=float, default=60.0, show_default=True, metavar="SECONDS",
                     help="Capture window; the capture also ends when the target exits."),
        click.option("--out", type=click.Path(path_type=Path), metavar="DIR",
                     help="Capture folder (default: a new folder under ./captures/)."),
        click.option("--keep-running", is_flag=True, help="Leave a program memtrace launched running after the window."),
        click.option("--rpc-timeout", type=float, default=20.0, show_default=True, metavar="SECONDS",
                     help="An agent that does not answer within this is reported as anti-debug."),
        click.option("--storm-seconds", type=float, default=DeathThresholds.storm_seconds, show_default=True,
                     help="Death classification: a kill this soon after instrumentation can be a launch storm..."),
        click.option("--storm-rate", type=float, default=DeathThresholds.storm_rate, show_default=True,
                     help="...if allocation calls per second reached this."),
        click.option("--stream-rate", type=float, default=DeathThresholds.stream_rate, show_default=True,
                     help="A later kill under at least this rate that never settled is a perpetual stream."),
        click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout."),
        click.option("--quiet", is_flag=True, help="Print nothing but errors."),
        click.argument("program", nargs=-1, type=click.UNPROCESSED),
    ]
    for d in reversed(decorators):
        fn = d(fn)
    return fn


def make_ui(as_json: bool, quiet: bool) -> UI:
    # With --json the target's own stdout goes to stderr so stdout stays one JSON document.
    if quiet:
        return SilentUI(passthrough=True, stdout_to_stderr=as_json)
    return RichUI(stdout_to_stderr=as_json)


def run_capture(tracer: str, agent_config: dict[str, Any], **kw: Any) -> CaptureResult:
    target = TargetSpec(device=kw["device"], app=kw["app"], pid=kw["pid"], name=kw["proc_name"],
                        argv=list(kw["program"]), launch=kw["launch"])
    options = CaptureOptions(
        tracer=tracer, window=kw["window"], attach_delay=kw["attach_delay"], out=kw["out"],
        agent_config=agent_config, keep_running=kw["keep_running"],
        thresholds=DeathThresholds(rpc_timeout=kw["rpc_timeout"], storm_seconds=kw["storm_seconds"],
                                   storm_rate=kw["storm_rate"], stream_rate=kw["stream_rate"]),
    )
    ui = make_ui(kw["as_json"], kw["quiet"])
    try:
        return CaptureSession(target, options, ui).run()
    finally:
        if isinstance(ui, RichUI):
            ui.close()


def trace_and_summarize(tracer: str, agent_config: dict[str, Any], summarize: Callable[[Iterable[Record]], Any],
                        render: Callable[[Console, dict[str, Any]], None], top: int, **kw: Any) -> int:
    """The whole of a tracer command after its own options: capture, summarize, show, exit status."""
    result = run_capture(tracer, agent_config, **kw)
    summary = summarize(read_records(result.path)).to_json(capture=str(result.path), top=top)
    if kw["as_json"]:
        emit_json(summary)
    elif not kw["quiet"]:
        render(Console(), summary)
    return exit_code(result)


def exit_code(result: CaptureResult) -> int:
    return 130 if result.interrupted else 0


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
    sys.stdout.flush()

