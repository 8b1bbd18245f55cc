"""End-of-run summaries on a terminal (rich), from the same JSON the --json flag prints."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from memtrace.ui import human_bytes

ENDED_STYLE = {"completed": "green", "target-exited": "green", "interrupted": "yellow"}


def header(console: Console, tracer: str, s: dict[str, Any]) -> None:
    """What every tracer's summary opens with: the rule and how the capture ended."""
    console.rule(f"memtrace {tracer} · {s.get('target') or ''}")
    style = ENDED_STYLE.get(s["ended"], "red")
    console.print(f"[bold]ended:[/bold] [{style}]{s['ended']}[/{style}] — {s['reason']}")


def footer(console: Console, s: dict[str, Any]) -> None:
    """...and closes with: the hook symbols the target lacked, and where the capture is."""
    if s["missing"]:
        console.print(f"[yellow]MISSING hook symbols:[/yellow] {', '.join(s['missing'])}")
    console.print(f"[bold]capture:[/bold] {s['capture']}")


def malloc_summary(console: Console, s: dict[str, Any]) -> None:
    header(console, "malloc", s)
    calls = Table(title="calls by kind", show_edge=False)
    calls.add_column("kind")
    calls.add_column("calls", justify="right")
    for k, v in s["calls"].items():
        if v:
            calls.add_row(k, f"{v:,}")
    console.print(calls)
    console.print(f"[bold]gross bytes allocated:[/bold] {human_bytes(s['gross_bytes'])} "
                  f"({s['gross_bytes']:,} B in {s['alloc_calls']:,} calls)")
    tiers = Table(title="size tiers", show_edge=False)
    for col in ("size", "calls", "bytes"):
        tiers.add_column(col, justify="right")
    prev = 0
    for t in s["tiers"]:
        label = f"{prev + 1 if prev else 0}–{t['max_bytes']}" if t["max_bytes"] is not None else f"> {prev}"
        tiers.add_row(label, f"{t['calls']:,}", human_bytes(t["bytes"]))
        prev = t["max_bytes"] or prev
    console.print(tiers)
    live = s["live"]
    console.print(f"[bold]live at end[/bold] (tracked blocks): {live['count']:,} blocks, {human_bytes(live['bytes'])}")
    if s["top_stacks"]:
        top = Table(title="top stacks by bytes", show_edge=False, show_lines=True)
        top.add_column("bytes", justify="right")
        top.add_column("count", justify="right")
        top.add_column("frames")
        for st in s["top_stacks"]:
            top.add_row(human_bytes(st["bytes"]), f"{st['count']:,}", "\n".join(st["frames"][:8]))
        console.print(top)
    dropped = {k: v for k, v in s["dropped"].items() if v}
    console.print(f"[bold]dropped:[/bold] {dropped or 'nothing'}")
    cov = s["coverage"]
    parts = []
    if cov.get("stack_coverage") is not None:
        parts.append(f"stacks cover {cov['stack_coverage']:.1%} of gross bytes")
    if cov.get("estimated_coverage") is not None and s.get("sampled"):
        parts.append(f"{cov['estimated_coverage']:.1%} with sampling")
    if "allocator" in cov:
        a = cov["allocator"]
        parts.append(f"allocator in-use Δ {human_bytes(a['in_use_delta'])} ({a['source']})")
    if cov.get("live_coverage") is not None:
        parts.append(f"live tracked = {cov['live_coverage']:.1%} of in-use Δ")
    if "footprint" in cov:
        parts.append(f"footprint Δ {human_bytes(cov['footprint']['delta'])}")
    console.print(f"[bold]coverage:[/bold] {'; '.join(parts) or 'n/a'}")
    footer(console, s)


def fds_summary(console: Console, s: dict[str, Any]) -> None:
    header(console, "fds", s)
    calls = Table(title="creating calls (descriptors created: {:,})".format(s["opened"]), show_edge=False)
    calls.add_column("call")
    calls.add_column("calls", justify="right")
    for k, v in s["calls"].items():
        calls.add_row(k, f"{v:,}")
    console.print(calls if s["calls"] else "[bold]creating calls:[/bold] none")
    closed = ", ".join(f"{k} {v:,}" for k, v in s["closed"].items()) or "none"
    console.print(f"[bold]released:[/bold] {closed}  [bold]dup onto open:[/bold] {s['replaced']:,}  "
                  f"[bold]releases of unknown fds:[/bold] {s['closes_of_unknown_fds']:,}")
    console.print(f"[bold]baseline:[/bold] {s['baseline']['count']:,} open before the window "
                  f"({s['baseline']['closed_in_window']:,} closed in it)  "
                  f"[bold]peak open:[/bold] {s['peak']['count']:,}")
    at_end = s["open_at_end"]
    console.print(f"[bold]opened in the window and still open:[/bold] {at_end['count']:,} "
                  f"{at_end['by_kind'] or ''}")
    if at_end["by_stack"]:
        t = Table(title="still open, by opening stack", show_edge=False, show_lines=True)
        for col in ("count", "calls", "paths", "frames"):
            t.add_column(col, justify="right" if col == "count" else "left")
        for r in at_end["by_stack"]:
            calls_txt = ", ".join(f"{k} ×{v}" for k, v in r["calls"].items())
            paths = "\n".join(r["paths"][:3]) + ("\n…" if len(r["paths"]) > 3 else "")
            t.add_row(f"{r['count']:,}", calls_txt, paths, "\n".join(r["frames"][:6]))
        console.print(t)
    if s["failures_by_stack"]:
        t = Table(title="failed creations", show_edge=False)
        for col in ("call", "error", "count", "caller"):
            t.add_column(col, justify="right" if col == "count" else "left")
        for r in s["failures_by_stack"]:
            t.add_row(r["call"], r["error"], f"{r['count']:,}", str(r["caller"]))
        console.print(t)
    for c in s["censuses"]:
        console.print(f"[bold]census[/bold] ({c['trigger']}, t={c['t']} ms): {c['count']:,} open {c['by_kind']}")
    rec = s["reconciliation"]
    if rec and rec["opened_out_of_sight"]:
        console.print("[yellow]opened out of sight[/yellow] (no hooked entry saw them): "
                      + ", ".join(f"{r['fd']} {r['path']}" for r in rec["opened_out_of_sight"][:10]))
    footer(console, s)


def threads_summary(console: Console, s: dict[str, Any]) -> None:
    header(console, "threads", s)
    console.print(f"[bold]created:[/bold] {s['created']:,} ({s['created_detached']:,} detached at creation)  "
                  f"[bold]joined:[/bold] {s['joined']:,}  [bold]detached:[/bold] {s['detached']:,}  "
                  f"[bold]exited:[/bold] {s['exited']:,}")
    console.print(f"[bold]threads alive:[/bold] {s['existing_at_start']:,} at start, peak {s['peak']['count']:,}; "
                  f"[bold]running at end:[/bold] {s['running_at_end']['count']:,} created in the window "
                  f"({s['running_at_end']['joinable']:,} joinable)")
    leaked = s["leaked"]
    style = "red" if leaked["count"] else "green"
    console.print(f"[bold]leaked[/bold] (exited, never joined or detached): [{style}]{leaked['count']:,}[/{style}]"
                  f" holding {human_bytes(leaked['stack_bytes'])} of stack")
    for title, rows in (("leaked threads, by creating stack", leaked["by_stack"]),
                        ("still running at the end, by creating stack", s["running_at_end"]["by_stack"])):
        if rows:
            t = Table(title=title, show_edge=False, show_lines=True)
            for col in ("count", "routine", "stack", "frames"):
                t.add_column(col, justify="right" if col in ("count", "stack") else "left")
            for r in rows:
                t.add_row(f"{r['count']:,}", str(r["routine"]), human_bytes(r["stack_bytes"]),
                          "\n".join(r["frames"][:6]))
            console.print(t)
    if s["failures_by_stack"]:
        t = Table(title="failed pthread_create", show_edge=False)
        for col in ("error", "count", "routine", "caller"):
            t.add_column(col)
        for r in s["failures_by_stack"]:
            t.add_row(r["error"], f"{r['count']:,}", str(r["routine"]), str(r["caller"]))
        console.print(t)
    footer(console, s)
