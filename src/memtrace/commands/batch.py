"""memtrace batch: run a YAML plan of targets x tracers x windows, with retries, into one folder."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from memtrace.batch import RunOutcome, load_plan, run_batch
from memtrace.commands.trace import emit_json
from memtrace.reporters.console import cells, plain
from memtrace.ui import SilentUI
from memtrace.units import fmt_bytes

GOOD = ("completed", "target-exited")


@click.command("batch")
@click.argument("plan", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), metavar="DIR", help="Folder for every run (default: the plan's 'out', else batch-out).")
@click.option("--force", is_flag=True, help="Re-run runs that completed in an earlier run of this plan.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
def batch(plan: Path, out: Path | None, force: bool, as_json: bool, quiet: bool) -> int:
    """Run every target x tracer of PLAN in turn; a failed target never stops the batch."""
    doc, runs = load_plan(plan)
    folder = out or Path(doc.get("out") or "batch-out")
    console = Console(stderr=True)

    def progress(o: RunOutcome) -> None:
        if not quiet and not as_json:
            # A run's note is an error message that can quote the target: inert text.
            console.print(Text.assemble(plain(f"{o.label} · {o.tracer}", "bold"), f": {o.outcome}",
                                        plain(f" ({o.note})" if o.note else "")))

    outcomes = run_batch(runs, folder, force, lambda: SilentUI(passthrough=False), progress)
    if as_json:
        emit_json({"out": str(folder), "runs": [o.to_json() for o in outcomes]})
    elif not quiet:
        table = Table(title=plain(f"batch {plan} → {folder}"))
        for col in ("target", "tracer", "outcome", "attempts", "events", "bytes"):
            table.add_column(col, justify="right" if col in ("events", "bytes", "attempts") else "left")
        for o in outcomes:
            style = "green" if o.outcome in GOOD else "red" if o.outcome == "failed" else "yellow"
            table.add_row(*cells([o.label, o.tracer, Text.assemble((o.outcome, style), " (skipped)" if o.skipped else ""),
                                  len(o.attempts), f"{o.events:,}", fmt_bytes(o.bytes)]))
        Console().print(table)
    stopped = next((o.interrupted for o in outcomes if o.interrupted is not None), None)
    if stopped is not None:
        console.print(Text.assemble(("interrupted", "yellow"), f": {len(runs) - len(outcomes)} run(s) of the plan "
                                                               "not started (batch.json lists them)"))
        return 128 + stopped
    return 0 if all(o.outcome != "failed" for o in outcomes) else 1


command = batch
