"""memtrace malloc: how much memory a process allocates, with stacks as evidence."""

from __future__ import annotations

from typing import Any

import click

from memtrace.analyze.malloc import summarize
from memtrace.commands.options import target_options, trace_and_summarize
from memtrace.errors import InputError
from memtrace.reporters.console import malloc_summary


@click.command("malloc", context_settings={"ignore_unknown_options": True})
@click.option("--live-threshold", type=int, default=4096, show_default=True, metavar="BYTES",
              help="Allocations at least this large enter the live set.")
@click.option("--stack-threshold", type=int, default=8192, show_default=True, metavar="BYTES",
              help="Allocations at least this large get a call stack.")
@click.option("--frames", type=click.IntRange(1, 64), default=28, show_default=True,
              help="Return addresses per stack.")
@click.option("--sample-bytes", type=int, default=0, show_default=True, metavar="N",
              help="Byte-weighted Poisson sampling with mean interval N bytes (heapprofd); 0 = off.")
@click.option("--backend", type=click.Choice(["auto", "logger", "symbols"]), default="auto", show_default=True,
              help="Darwin: malloc_logger (every zone) or the public malloc symbols.")
@click.option("--top", type=int, default=10, show_default=True, help="Stacks in the summary.")
@target_options
def malloc(live_threshold: int, stack_threshold: int, frames: int, sample_bytes: int, backend: str,
           top: int, **kw: Any) -> int:
    """Trace the malloc family of a process (launch with -- PROGRAM ARGS, or --app/--pid/--name)."""
    for name, value in (("--live-threshold", live_threshold), ("--stack-threshold", stack_threshold),
                        ("--sample-bytes", sample_bytes)):
        if value < 0:
            raise InputError(f"{name} {value}: must be zero or more")
    config = {"liveThreshold": live_threshold, "stackThreshold": stack_threshold, "frames": frames,
              "sampleBytes": sample_bytes, "backend": backend}
    return trace_and_summarize("malloc", config, summarize, malloc_summary, top, **kw)


command = malloc
