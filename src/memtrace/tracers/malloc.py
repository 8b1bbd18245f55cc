"""malloc: how much memory a process allocates, with stacks as evidence."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from memtrace.analyze.leaks import skipped_text
from memtrace.analyze.malloc import MallocSummary
from memtrace.frames import Frame
from memtrace.leakscan import DEFAULT_BUDGET_S, at_window_end
from memtrace.live import CoreStats, Row
from memtrace.report.chapters.malloc import MallocChapter
from memtrace.reporters.console import footer, frames_text, header, line, plain, stack_table
from memtrace.tracers import Tracer
from memtrace.tracers.options import Option, at_least, positive
from memtrace.units import fmt_bytes, fmt_pct, plural


class MallocStats(CoreStats):
    def rows(self) -> list[Row]:
        calls = sum(self.counters[0:16])
        rows = [("calls", f"{calls:,}"), ("bytes", fmt_bytes(self.volume())),
                ("live / stacks", f"{self.live:,} / {self.stacks:,}")]
        if self.tracked is not None:
            rows.append(("tracked live / peak", f"{fmt_bytes(self.tracked)} / {fmt_bytes(self.peak or 0)}"))
        return rows


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
    failed = {k: v for k, v in s["failed"].items() if v}
    if failed:
        line(console, ("failed calls (returned NULL; no bytes counted)",
                       ", ".join(f"{k} {v:,}" for k, v in failed.items())))
        rows = summary.stack_rows(opts.get("top", 10), measure="failed")
        if rows:
            console.print(stack_table("failed calls by stack", [("calls", "right"), ("frames", "left")],
                                      [[f"{round(r.count):,}", frames_text(r.frames) if r.frames
                                        else plain("(no stack)")] for r in rows]))
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
    if s.get("peak"):
        _peak(console, s["peak"])
    if s.get("temporary"):
        _temporary(console, s["temporary"])
    nested = s["nested"]
    if nested["calls"] or nested["allocator_internal"]:
        line(console, ("calls made inside a hook (signal handlers)",
                       f"{nested['calls']:,} counted ({fmt_bytes(nested['bytes'])}), stacks skipped"),
             ("allocator's own, counted once", f"{nested['allocator_internal']:,}"))
        if nested["unreconciled"]:
            line(console, ("nested calls not checked against their entry (may count twice)",
                           f"{nested['unreconciled']:,}"))
    if s.get("leaks"):
        leaks_view(console, s["leaks"])
    dropped = {k: v for k, v in s["dropped"].items() if v}
    line(console, ("dropped", dropped or "nothing"))
    if s["mode"] == "events" and s["dropped"]["dropped_records"]:
        console.print(plain(f"events mode: {s['dropped']['dropped_records']:,} event records dropped "
                            "(the per-event stream is incomplete; the counts and per-stack totals above "
                            "are not affected)"), style="yellow")
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
             plural(scan["threads_stopped"] or 0, "thread") + " stopped" if scan["world_stopped"] else "world NOT stopped"]
    if scan.get("threads_not_stopped"):
        notes.append(f"{scan['threads_not_stopped']} threads could not be stopped")
    skipped = skipped_text(scan.get("skipped") or {}, fmt_bytes)
    if skipped:
        notes.append("not scanned: " + ", ".join(skipped))
    line(console, ("leak scan", "; ".join(notes)))


def _check_backend(values: dict[str, Any]) -> None:
    if values.get("backend") == "logger":
        from memtrace.target import require_platform

        require_platform(values, "darwin", "--backend logger", "malloc_logger exists only in Darwin's libmalloc")


def _peak(console: Console, peak: dict[str, Any]) -> None:
    when = f" at {peak['t']:.3f} s" if peak.get("t") is not None else ""
    exact = "" if peak["exact"] else " (the target ended before its last peak was read: an earlier peak)"
    line(console, ("peak of tracked live bytes", f"{fmt_bytes(peak['bytes'])} in {peak['count']:,} blocks"
                   f"{when}{exact}"))
    rows = peak["by_stack"]
    if rows:
        console.print(stack_table("at the peak, by stack", [("bytes", "right"), ("blocks", "right"), ("frames", "left")],
                                  [[fmt_bytes(r["bytes"]), f"{r['count']:,}",
                                    frames_text(r["frames"]) if r["frames"] else plain("(no stack)")] for r in rows]))


def _temporary(console: Console, temp: dict[str, Any]) -> None:
    line(console, ("temporary allocations (freed before the thread's next allocation)",
                   f"{temp['calls']:,} calls, {fmt_bytes(temp['bytes'])}"))
    rows = temp["by_stack"]
    if rows:
        console.print(stack_table("temporary allocations by stack", [("calls", "right"), ("bytes", "right"),
                                                                     ("frames", "left")],
                                  [[f"{r['calls']:,}", fmt_bytes(r["bytes"]),
                                    frames_text(r["frames"]) if r["frames"] else plain("(no stack)")] for r in rows]))


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
                "kind and size tier, per-stack totals kept in the target, the live set at the end, the peak and "
                "what held it, temporary allocations, a timeline, coverage against the allocator.",
    options=(
        Option("live_threshold", int, 4096, "Allocations at least this large are tracked (live set, peak) even "
               "without a stack.",
               agent_key="liveThreshold", metavar="BYTES", check=at_least(0)),
        Option("stack_threshold", int, 8192, "Allocations at least this large get a call stack (and are tracked).",
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
        Option("events", bool, False, "Also stream one record per tracked allocation and free (short windows, "
               "offline replay); the per-stack totals stay exact even when that stream drops.",
               agent_key="events", is_flag=True),
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
