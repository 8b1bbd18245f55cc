"""malloc: how much memory a process allocates, with stacks as evidence."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from memtrace.analyze.malloc import MallocSummary
from memtrace.frames import Frame
from memtrace.leakscan import DEFAULT_BUDGET_S, at_window_end
from memtrace.live import CoreStats, Row
from memtrace.report.chapters.malloc import MallocChapter
from memtrace.reporters.console import footer, frames_text, header, line, plain, stack_table
from memtrace.tracers import Tracer
from memtrace.tracers.options import Option, at_least, positive
from memtrace.units import fmt_bytes, fmt_pct


class MallocStats(CoreStats):
    def rows(self) -> list[Row]:
        calls = sum(self.counters[0:16])
        return [("calls", f"{calls:,}"), ("bytes", fmt_bytes(self.volume())),
                ("live / stacks", f"{self.live:,} / {self.stacks:,}")]


def console_view(console: Console, summary: MallocSummary, opts: dict[str, Any]) -> None:
    s = summary.to_json(capture=opts.get("capture"), top=opts.get("top", 10))
    header(console, "malloc", s)
    calls = Table(title="calls by kind", show_edge=False)
    calls.add_column("kind")
    calls.add_column("calls", justify="right")
    for k, v in s["calls"].items():
        if v:
            calls.add_row(k, f"{v:,}")
    console.print(calls)
    line(console, ("gross bytes allocated",
                   f"{fmt_bytes(s['gross_bytes'])} ({s['gross_bytes']:,} B in {s['alloc_calls']:,} calls)"))
    tiers = Table(title="size tiers", show_edge=False)
    for col in ("size", "calls", "bytes"):
        tiers.add_column(col, justify="right")
    prev = 0
    for t in s["tiers"]:
        label = f"{prev + 1 if prev else 0}–{t['max_bytes']}" if t["max_bytes"] is not None else f"> {prev}"
        tiers.add_row(label, f"{t['calls']:,}", fmt_bytes(t["bytes"]))
        prev = t["max_bytes"] or prev
    console.print(tiers)
    live = s["live"]
    line(console, ("live at end (tracked blocks)", f"{live['count']:,} blocks, {fmt_bytes(live['bytes'])}"))
    for title, rows in (("top stacks by bytes", summary.stack_rows(opts.get("top", 10))),
                        ("live at end, by stack", summary.stack_rows(opts.get("top", 10), live=True))):
        if rows:
            console.print(stack_table(title, [("bytes", "right"), ("count", "right"), ("frames", "left")],
                                      [[fmt_bytes(r.est_bytes), f"{round(r.count):,}",
                                        frames_text(r.frames) if r.frames else plain("(no stack)")] for r in rows]))
    if s.get("leaks"):
        leaks_view(console, s["leaks"])
    dropped = {k: v for k, v in s["dropped"].items() if v}
    line(console, ("dropped", dropped or "nothing"))
    line(console, ("coverage", "; ".join(_coverage(s)) or "n/a"))
    footer(console, s)


def leaks_view(console: Console, leaks: dict[str, Any]) -> None:
    """--leaks: leaked and still reachable blocks by stack, and what the scan could not see."""
    scan = leaks["scan"]
    for key, title in (("leaked", "LEAKED (unreachable, cycles included)"), ("reachable", "still reachable")):
        g = leaks[key]
        line(console, (title, f"{g['blocks']:,} blocks, {fmt_bytes(g['bytes'])}"))
        if g["by_stack"]:
            console.print(stack_table(f"{key} by stack", [("bytes", "right"), ("blocks", "right"), ("frames", "left")],
                                      [[fmt_bytes(r["bytes"]), f"{r['blocks']:,}",
                                        frames_text([Frame.from_json(f) for f in r["frames"]]) if r["frames"]
                                        else plain("(no stack)")] for r in g["by_stack"]]))
    notes = [f"at {scan['when']}", "complete" if scan["complete"] else "INCOMPLETE (time budget spent)",
             f"{scan['threads_stopped']} threads stopped" if scan["world_stopped"] else "world NOT stopped"]
    if scan.get("threads_not_stopped"):
        notes.append(f"{scan['threads_not_stopped']} threads could not be stopped")
    skipped = {k: v for k, v in (scan.get("skipped") or {}).items() if v}
    if skipped:
        notes.append("not scanned: " + ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" if k != "candidates_over_capacity"
                                                  else f"{v:,} blocks over capacity" for k, v in skipped.items()))
    line(console, ("leak scan", "; ".join(notes)))


def _check_backend(values: dict[str, Any]) -> None:
    if values.get("backend") == "logger":
        from memtrace.target import require_platform

        require_platform(values, "darwin", "--backend logger", "malloc_logger exists only in Darwin's libmalloc")


def _coverage(s: dict[str, Any]) -> list[str]:
    cov = s["coverage"]
    parts = []
    if cov.get("stack_coverage") is not None:
        parts.append(f"stacks cover {fmt_pct(cov['stack_coverage'])} of gross bytes")
    if cov.get("estimated_coverage") is not None and s.get("sampled"):
        parts.append(f"{fmt_pct(cov['estimated_coverage'])} with sampling")
    if "allocator" in cov:
        a = cov["allocator"]
        parts.append(f"allocator in-use Δ {fmt_bytes(a['in_use_delta'], signed=True)} ({a['source']})")
    if cov.get("live_coverage") is not None:
        parts.append(f"live tracked = {fmt_pct(cov['live_coverage'])} of in-use Δ")
    if "footprint" in cov:
        parts.append(f"footprint Δ {fmt_bytes(cov['footprint']['delta'], signed=True)}")
    return parts


TRACER = Tracer(
    name="malloc",
    help="Trace the malloc family of a process (launch with -- PROGRAM ARGS, or --app/--pid/--name).",
    description="How much memory a process allocates, with stacks as evidence: every call counted exactly by "
                "kind and size tier, the live set at the end, the top stacks, coverage against the allocator.",
    options=(
        Option("live_threshold", int, 4096, "Allocations at least this large enter the live set.",
               agent_key="liveThreshold", metavar="BYTES", check=at_least(0)),
        Option("stack_threshold", int, 8192, "Allocations at least this large get a call stack.",
               agent_key="stackThreshold", metavar="BYTES", check=at_least(0)),
        Option("frames", click.IntRange(1, 64), 28, "Return addresses per stack.", agent_key="frames"),
        Option("sample_bytes", int, 0, "Byte-weighted Poisson sampling with mean interval N bytes (heapprofd); "
               "0 = off.", agent_key="sampleBytes", metavar="N", check=at_least(0)),
        Option("backend", click.Choice(["auto", "logger", "symbols"]), "auto",
               "Darwin: malloc_logger (every zone) or the public malloc symbols.", agent_key="backend"),
        Option("leaks", bool, False, "Leak detection: at the window's end (or the target's exit) a conservative "
               "reachability scan in the target sorts the tracked live blocks into leaked and still reachable "
               "(implies --stack-threshold <= --live-threshold).", agent_key="leaks", is_flag=True),
        Option("leaks_budget", float, DEFAULT_BUDGET_S, "Time the leak scan may take; past it the scan stops and "
               "says what it did not read.", agent_key="leaksBudget", metavar="SECONDS", check=positive),
        Option("top", int, 10, "Stacks in the summary.", check=at_least(0)),
    ),
    analyzer="memtrace.analyze.malloc",
    summary_type=MallocSummary,
    console=console_view,
    live=MallocStats,
    chapter=MallocChapter,
    window_end=at_window_end,
    before_launch=_check_backend,
)
