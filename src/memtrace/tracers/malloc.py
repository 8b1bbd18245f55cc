"""malloc: how much memory a process allocates, with stacks as evidence."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from memtrace.capture import calls_total
from memtrace.errors import InputError
from memtrace.layout import MAX_FRAMES
from memtrace.leakscan import DEFAULT_BUDGET_S, at_window_end
from memtrace.live import CoreStats, Row
from memtrace.tracers import Tracer, lazy
from memtrace.tracers.options import Option, at_least, positive
from memtrace.units import fmt_bytes, fmt_pct, plural

if TYPE_CHECKING:
    from rich.console import Console

    from memtrace.analyze.malloc import MallocSummary


class MallocStats(CoreStats):
    def rows(self) -> list[Row]:
        calls = calls_total(self.counters)
        rows = [("calls", f"{calls:,}"), ("bytes", fmt_bytes(self.volume())),
                ("live / stacks", f"{self.live:,} / {self.stacks:,}")]
        if self.tracked is not None:
            rows.append(("tracked live / peak", f"{fmt_bytes(self.tracked)} / {fmt_bytes(self.peak or 0)}"))
        if self.in_use is not None or self.footprint is not None:
            # Beside tracked live: what the allocator holds (small blocks, overhead) and the whole process.
            rows.append(("allocator in use / footprint", f"{fmt_bytes(self.in_use) if self.in_use is not None else '—'}"
                                                         f" / {fmt_bytes(self.footprint) if self.footprint else '—'}"))
        for k, (sid, rate, live) in enumerate(self.growing()):
            rows.append(("growing fastest" if k == 0 else "", f"+{fmt_bytes(rate)}/s ({fmt_bytes(live)} live) "
                                                              f"{self.label(sid)}"))
        return rows


SORTS = ("bytes", "calls", "live")

# The agent core's sizing, overridable by malloc's own options (agent keys of the same name).
# A local target is traced completely: every allocation gets a stack and every block is tracked
# (thresholds 0), 64 frames a stack.  The tables are OS pages reserved up front and resident only
# as they are used (docs/agents.md, "Memory budget"): 4,194,304 stack ids, 16,777,216 live-table
# entries (192 MiB reserved: the table a heap touches is 0.375 bytes per byte of heap, however large
# it is -- a large one only keeps dense parts of the heap from crowding the same buckets), 16,384 threads at once, 8 MiB of stack definitions between drains; a stack or block past
# them is counted and said, never silent.
AGENT_DEFAULTS: dict[str, Any] = {
    "liveThreshold": 0, "stackThreshold": 0, "frames": 64, "sampleBytes": 0, "ringKb": 1024,
    "threadSlots": 1 << 14, "rings": 64, "stackTable": 1 << 22, "liveTable": 1 << 24, "defsKb": 8192,
    "toolchain": "auto", "backend": "auto",
}
# Darwin: the agent's tables live in the app's own footprint and count toward its jetsam limit (app
# extensions are jetsammed in the tens of MB), so the core's tables and rings are sized for that
# (~6 MiB reserved; only what is used becomes resident): 8192 stacks with one aggregate lane each
# (a row's cache line shared by threads), 65536 live blocks -- and the layered capture stays the
# default there: stacks for allocations of 8 KiB and up, blocks of 4 KiB and up tracked (every
# summary says so in its "covers" line).  DEVICE-UNVERIFIED: not measured on a device.
# An option the user sets still wins.
AGENT_SIZING_DARWIN: dict[str, Any] = {
    "liveThreshold": 4096, "stackThreshold": 8192, "frames": 28,
    "ringKb": 256, "rings": 16, "threadSlots": 256, "stackTable": 1 << 13, "liveTable": 1 << 16, "aggLanes": 1,
    "defsKb": 1024,
}


def sorted_stack_rows(summary: MallocSummary, top: int | None, sort: str) -> list[Any]:
    """The stack table ``memtrace show --sort`` asks for: by gross bytes, by calls, or by live bytes."""
    if sort == "live":
        return summary.stack_rows(top, live=True)
    if sort == "calls":
        return summary.stack_rows(top, order=lambda r: (-r.count, -r.est_bytes, min(r.stack_ids)))
    return summary.stack_rows(top)


def sorted_tables(summary: MallocSummary, top: int, sort: str) -> list[tuple[str, list[Any]]]:
    """The two stack tables, the one ``sort`` names first (``live``: the live table only once)."""
    first = {"bytes": "top stacks by bytes", "calls": "top stacks by calls", "live": "live at end, by stack"}[sort]
    tables = [(first, sorted_stack_rows(summary, top, sort))]
    if sort != "live":
        tables.append(("live at end, by stack", summary.stack_rows(top, live=True)))
    return tables


def console_view(console: Console, summary: MallocSummary, opts: dict[str, Any]) -> None:
    from rich.table import Table

    from memtrace.reporters.console import footer, frames_text, header, line, plain, stack_table

    top = opts.get("top", 10)
    header(console, summary)
    line(console, ("covers", summary.covers["text"]))
    calls = Table(title="calls by kind", show_edge=False)
    calls.add_column("kind")
    calls.add_column("calls", justify="right")
    for k, v in summary.calls.items():
        if v:
            calls.add_row(k, f"{v:,}")
    console.print(calls)
    gross = summary.gross_bytes
    line(console, ("gross bytes allocated", f"{fmt_bytes(gross)} ({gross:,} B in {summary.alloc_calls:,} calls)"))
    failed = {k: v for k, v in summary.failed.items() if v}
    if failed:
        line(console, ("failed calls (returned NULL; no bytes counted)",
                       ", ".join(f"{k} {v:,}" for k, v in failed.items())))
        rows = summary.stack_rows(top, measure="failed")
        if rows:
            console.print(stack_table("failed calls by stack", [("calls", "right"), ("frames", "left")],
                                      [[f"{round(r.count):,}", frames_text(r.frames) if r.frames
                                        else plain("(no stack)")] for r in rows]))
    tiers = Table(title="size tiers", show_edge=False)
    for col in ("size", "calls", "bytes"):
        tiers.add_column(col, justify="right")
    prev = 0
    for t in summary.tiers:
        label = f"{prev + 1 if prev else 0}–{t['max_bytes']}" if t["max_bytes"] is not None else f"> {prev}"
        tiers.add_row(label, f"{t['calls']:,}", fmt_bytes(t["bytes"]))
        prev = t["max_bytes"] or prev
    console.print(tiers)
    line(console, ("live at end (tracked blocks)", f"{summary.live_count:,} blocks, {fmt_bytes(summary.live_bytes)}"))
    for title, rows in sorted_tables(summary, top, opts.get("sort") or "bytes"):
        if rows:
            console.print(stack_table(title, [("bytes", "right"), ("count", "right"), ("frames", "left")],
                                      [[fmt_bytes(r.est_bytes), f"{round(r.count):,}",
                                        frames_text(r.frames) if r.frames else plain("(no stack)")] for r in rows]))
    if summary.aggregates and summary.peak is not None:
        _peak(console, summary, top)
    if summary.aggregates:
        _temporary(console, summary, top)
    nested_calls, nested_internal = summary.counter("nested_calls"), summary.counter("nested_internal")
    if nested_calls or nested_internal:
        line(console, ("calls made inside a hook (signal handlers)",
                       f"{nested_calls:,} counted ({fmt_bytes(summary.counter('nested_bytes'))}), stacks skipped"),
             ("allocator's own, counted once", f"{nested_internal:,}"))
        if summary.counter("nested_unreconciled"):
            line(console, ("nested calls not checked against their entry (may count twice)",
                           f"{summary.counter('nested_unreconciled'):,}"))
    leaks = summary.leaks_json(top)      # the scan's own document: what it examined, by category
    if leaks:
        leaks_view(console, leaks)
    dropped = {k: v for k, v in summary.dropped.items() if v}
    line(console, ("dropped", dropped or "nothing"))
    if summary.mode == "events" and summary.dropped["dropped_records"]:
        console.print(plain(f"events mode: {summary.dropped['dropped_records']:,} event records dropped "
                            "(the per-event stream is incomplete; the counts and per-stack totals above "
                            "are not affected)"), style="yellow")
    line(console, ("coverage", "; ".join(_coverage(summary)) or "n/a"))
    footer(console, summary, opts.get("capture"))


def leaks_view(console: Console, leaks: dict[str, Any]) -> None:
    """--leaks: blocks by valgrind's categories and by stack, and what the scan examined and could not see."""
    from memtrace.analyze.leaks import LEAK_GROUPS, examined_text, leak_no_stack, skipped_text
    from memtrace.frames import Frame
    from memtrace.reporters.console import frames_text, line, plain, stack_table

    scan = leaks["scan"]
    for key, title in LEAK_GROUPS:
        g = leaks.get(key)
        if g is None:
            continue
        line(console, (title, f"{g['blocks']:,} blocks, {fmt_bytes(g['bytes'])}"))
        if g["by_stack"] and key != "reachable":
            console.print(stack_table(f"{title} by stack", [("bytes", "right"), ("blocks", "right"),
                                                           ("frames", "left")],
                                      [[fmt_bytes(r["bytes"]), f"{r['blocks']:,}",
                                        frames_text([Frame.from_json(f) for f in r["frames"]]) if r["frames"]
                                        else plain(leak_no_stack(r))] for r in g["by_stack"]]))
    line(console, ("blocks examined", examined_text(scan)))
    notes = [f"at {scan['when']}", "complete" if scan["complete"] else "INCOMPLETE (time budget spent)",
             plural(scan["threads_stopped"] or 0, "thread") + " stopped" if scan["world_stopped"] else "world NOT stopped"]
    if scan.get("threads_not_stopped"):
        notes.append(f"{scan['threads_not_stopped']} threads could not be stopped")
    if scan.get("world_stopped_ms") is not None:
        notes.append(f"world stopped {scan['world_stopped_ms']:,} ms (scanning {scan.get('scan_ms') or 0:,} ms)")
    skipped = skipped_text({k: v for k, v in (scan.get("skipped") or {}).items() if k != "candidates_over_capacity"},
                           fmt_bytes)
    if skipped:
        notes.append("not scanned: " + ", ".join(skipped))
    line(console, ("leak scan", "; ".join(notes)))


def _host_for(values: dict[str, Any], target: Any, options: Any) -> Any:
    """--backend dvt: no agent; Instruments' services on a stock device are the "agent"."""
    if values.get("backend") != "dvt":
        return None
    from memtrace.dvt.host import DvtHost

    return DvtHost(target, options.thresholds.rpc_timeout, tracer=TRACER.name)


def _check_backend(values: dict[str, Any]) -> None:
    if values.get("backend") == "dvt":
        for name in ("events", "sample_bytes"):
            if values.get(name):
                raise InputError(f"--backend dvt: --{name.replace('_', '-')} does not apply (the device's "
                                 "recording sends every event, unsampled)")
        return
    if values.get("backend") == "logger":
        from memtrace.target import require_platform

        require_platform(values, "darwin", "--backend logger", "malloc_logger exists only in Darwin's libmalloc")


def _peak(console: Console, summary: MallocSummary, top: int) -> None:
    from memtrace.reporters.console import frames_text, line, plain, stack_table

    peak = summary.peak
    assert peak is not None
    # Placed by the agent's looks at it (every drain, 100 ms apart): in the middle of the interval.
    when = f" at {peak.t_s:.1f} s" if peak.t_s is not None else ""
    exact = "" if summary.peak_exact else " (the target ended before its last peak was read: an earlier peak)"
    line(console, ("peak of tracked live bytes", f"{fmt_bytes(peak.bytes)} in {peak.count:,} blocks"
                   f"{when}{exact}"))
    rows = summary.stack_rows(top, measure="peak")
    if rows:
        console.print(stack_table("at the peak, by stack", [("bytes", "right"), ("blocks", "right"), ("frames", "left")],
                                  [[fmt_bytes(round(r.est_bytes)), f"{round(r.count):,}",
                                    frames_text(r.frames) if r.frames else plain("(no stack)")] for r in rows]))


def _temporary(console: Console, summary: MallocSummary, top: int) -> None:
    from memtrace.reporters.console import frames_text, line, plain, stack_table

    line(console, ("temporary allocations (freed before the thread's next allocation)",
                   f"{summary.counter('temp_calls'):,} calls, {fmt_bytes(summary.counter('temp_bytes'))}"))
    rows = summary.temporary_rows(top)
    if rows:
        console.print(stack_table("temporary allocations by stack", [("calls", "right"), ("bytes", "right"),
                                                                     ("frames", "left")],
                                  [[f"{round(r.count):,}", fmt_bytes(round(r.est_bytes)),
                                    frames_text(r.frames) if r.frames else plain("(no stack)")] for r in rows]))


def _coverage(summary: MallocSummary) -> list[str]:
    cov = summary.coverage()
    parts = []
    if cov.get("stack_coverage") is not None:
        parts.append(f"stacks cover {fmt_pct(cov['stack_coverage'])} of gross bytes")
    if cov.get("estimated_coverage") is not None and summary.counter("sampled"):
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
        Option("live_threshold", int, None, "Allocations at least this large are tracked (live set, peak) even "
               "without a stack.  Default: 0 on a local target (every block), 4096 on a device.",
               agent_key="liveThreshold", metavar="BYTES", check=at_least(0), show_default=False),
        Option("stack_threshold", int, None, "Allocations at least this large get a call stack (and are tracked).  "
               "Default: 0 on a local target (every allocation), 8192 on a device.",
               agent_key="stackThreshold", metavar="BYTES", check=at_least(0), show_default=False),
        Option("frames", click.IntRange(1, MAX_FRAMES - 1), None, f"Return addresses per stack (at most "
               f"{MAX_FRAMES - 1}; a deeper stack keeps its innermost frames and is marked truncated).  Default: 64 on a local "
               "target, 28 on a device.", agent_key="frames", show_default=False),
        Option("thread_slots", int, None, "Threads alive at once that get a slot of their own (default 16384 on a "
               "local target, 256 on a device).  Past it, calls are still counted exactly; their stacks are "
               "dropped and the summary says how many calls (unslotted_calls).", agent_key="threadSlots",
               metavar="N", check=at_least(1), show_default=False),
        Option("sample_bytes", int, 0, "Byte-weighted Poisson sampling with mean interval N bytes (heapprofd); "
               "0 = off.", agent_key="sampleBytes", metavar="N", check=at_least(0)),
        Option("backend", click.Choice(["auto", "logger", "symbols", "dvt"]), "auto",
               "Darwin: malloc_logger (every zone) or the public malloc symbols; dvt: a stock (not "
               "jailbroken) iPhone through Instruments' Allocations service, nothing injected (--app, a "
               "development-signed app; recording from its launch).", agent_key="backend"),
        Option("leaks", bool, False, "Leak detection: at the window's end (or the target's exit) a conservative "
               "reachability scan in the target sorts every live heap block, as valgrind memcheck does, into "
               "definitely, indirectly and possibly lost and still reachable (tracks every block with its stack: "
               "--live-threshold and --stack-threshold 0).", agent_key="leaks", is_flag=True),
        Option("leaks_budget", float, DEFAULT_BUDGET_S, "Time the leak scan may take; past it the scan stops and "
               "says what it did not read.", agent_key="leaksBudget", metavar="SECONDS", check=positive),
        Option("events", bool, False, "Also stream one record per tracked allocation and free (short windows, "
               "offline replay); the per-stack totals stay exact even when that stream drops.",
               agent_key="events", is_flag=True),
        Option("top", int, 10, "Stacks in the summary.", check=at_least(0)),
    ),
    analyzer="memtrace.analyze.malloc",
    result="memtrace.analyze.leaks:LeakResult",
    summary_type="memtrace.analyze.malloc:MallocSummary",
    console=console_view,
    live=MallocStats,
    chapter=lazy("memtrace.report.chapters.malloc:MallocChapter"),
    window_end=at_window_end,
    before_launch=_check_backend,
    host=_host_for,
    c_sources=("unwind.c", "core.c", "track.c", "drain.c", "malloc.c", "world.c", "leaks.c"),
    agent_defaults=AGENT_DEFAULTS,
    agent_sizing={"darwin": AGENT_SIZING_DARWIN},
    views=("gross", "live", "peak", "leaked", "temporary"),     # MallocSummary.VIEWS
    heap_views=("gross", "live"),
    sorts=SORTS,
    report_order=0,
    doctor_checks=("runtime", "self-test"),
)
