"""One click command per registered tracer, made from its registry entry.

The command's options are the target options, the capture options and the tracer's own, each
declared once (:mod:`memtrace.tracers.options`); the body runs one capture through the capture
loop, summarizes it with the tracer's analyzer and shows it with the tracer's console view
(or prints its JSON).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from memtrace.capture import CaptureInfo, read_records
from memtrace.capture_loop import CAPTURE_OPTIONS, CaptureResult, capture_options, run_capture
from memtrace.target import TARGET_OPTIONS, target_from_values
from memtrace.tracers import Tracer
from memtrace.tracers.options import Option, agent_config, apply
from memtrace.ui import UI, RichUI, SilentUI

OUTPUT_OPTIONS: tuple[Option, ...] = (
    Option("json", bool, False, "Print the summary as JSON on stdout.", is_flag=True, in_plans=False),
    Option("quiet", bool, False, "Print nothing but errors.", is_flag=True, in_plans=False),
)


def make_command(tracer: Tracer) -> click.Command:
    def run(program: tuple[str, ...], **values: Any) -> int:
        return trace(tracer, values, program)

    run.__doc__ = f"{tracer.help}\n\n{tracer.description}\n\nThe target: -- PROGRAM ARGS (spawned here), --app, " \
                  f"--pid or --name (or frida-tools' -f/-N/-p/-n)."
    fn = apply((*tracer.options, *TARGET_OPTIONS, *CAPTURE_OPTIONS, *OUTPUT_OPTIONS), run)
    fn = click.argument("program", nargs=-1, type=click.UNPROCESSED)(fn)
    return click.command(tracer.name, short_help=tracer.help)(fn)


def make_ui(as_json: bool, quiet: bool) -> UI:
    # With --json the target's own stdout goes to stderr so stdout stays one JSON document.
    if quiet:
        return SilentUI(passthrough=True, stdout_to_stderr=as_json)
    return RichUI(stdout_to_stderr=as_json)


def trace(tracer: Tracer, values: dict[str, Any], program: tuple[str, ...] | list[str]) -> int:
    """The whole of a tracer command: capture, summarize, show, exit status."""
    target = target_from_values(values, program)
    options = capture_options(tracer.name, values, agent_config(tracer.options, values))
    options.validate()
    if tracer.before_launch is not None:
        tracer.before_launch(values)
    ui = make_ui(values["json"], values["quiet"])
    host = tracer.host(values, target, options) if tracer.host is not None else None
    try:
        result = run_capture(tracer, target, options, ui, host=host, summarize=tracer.summarize)
    finally:
        if isinstance(ui, RichUI):
            ui.close()
    # Folded while the capture was written; read back only when that failed.
    damage = result.damage
    if result.summary is not None:
        summary = result.summary
    else:
        info = CaptureInfo(result.path)
        summary = tracer.summarize(read_records(result.path, info))
        damage = info.damage
    if damage is not None:
        # Records this memtrace wrote and cannot read back: the summary covers the rest, said.
        sys.stderr.write(f"memtrace: warning: {result.path}: {damage}\n")
    host = {**values, "capture": str(result.path)}
    if values["json"]:
        emit_json(summary.to_json(capture=str(result.path), top=values.get(tracer.json_top_option, 20)))
        if tracer.extra.get("console_always"):
            from rich.console import Console

            tracer.console(Console(stderr=True, quiet=True), summary, {**host, "quiet": True})
    elif not values["quiet"] or tracer.extra.get("console_always"):
        # rich: a --quiet or --json run never imports it
        from rich.console import Console

        tracer.console(Console(quiet=values["quiet"]), summary, host)
    # A summary that can say its tracer did not do its job (the probe could not run) fails the command.
    failed = summary.failure() if callable(getattr(summary, "failure", None)) else None
    if failed and not result.interrupted:
        from memtrace.reporters.console import inert

        sys.stderr.write(f"memtrace: {tracer.name} could not run: {inert(failed)}\n")
        return 1
    return exit_code(result)


def exit_code(result: CaptureResult) -> int:
    if result.signal is not None:
        return 128 + result.signal      # as a shell reports a command a signal ended
    return 130 if result.interrupted else 0


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
    sys.stdout.flush()
