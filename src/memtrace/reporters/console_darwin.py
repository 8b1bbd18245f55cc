"""Terminal summaries of the Darwin lines (IOSurface, purgeable), from the same JSON --json prints."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from memtrace.reporters.console import footer, header
from memtrace.ui import human_bytes


def _bytes(v: int | None) -> str:
    return "?" if v is None else human_bytes(v)


def purgeable_summary(console: Console, s: dict[str, Any]) -> None:
    header(console, "purgeable", s)
    matrix = Table(title="transitions (0 NONVOL, 1 VOL, 2 EMPTY)", show_edge=False)
    for col in ("transition", "count", "bytes"):
        matrix.add_column(col, justify="right")
    for k, n in s["transitions"].items():
        matrix.add_row(k, f"{n:,}", _bytes(s["transition_bytes"].get(k)))
    console.print(matrix if s["transitions"] else "[bold]transitions:[/bold] none")
    console.print(f"[bold]SET calls:[/bold] {s['set_calls']:,}  [bold]GET calls:[/bold] {s['get_calls']:,}  "
                  f"[bold]stolen (2→0):[/bold] {s['stolen']['count']:,} ({_bytes(s['stolen']['bytes'])})  "
                  f"[bold]created purgeable:[/bold] {s['created_purgeable']:,} ({_bytes(s['created_bytes'])})")
    if s["by_caller"]:
        t = Table(title="transitions by direct caller", show_edge=False, show_lines=True)
        for col in ("entry", "transition", "count", "bytes", "stack"):
            t.add_column(col, justify="right" if col in ("count", "bytes") else "left")
        for r in s["by_caller"]:
            t.add_row(r["entry"], r["transition"], f"{r['count']:,}", _bytes(r["bytes"]), "\n".join(r["frames"][:4]))
        console.print(t)
    if s["framework_calls"]:
        t = Table(title="framework entries (their transitions are counted underneath)", show_edge=False)
        for col in ("entry", "calls", "callers"):
            t.add_column(col)
        for entry, v in s["framework_calls"].items():
            t.add_row(entry, f"{v['calls']:,}", ", ".join(f"{c['caller']} ×{c['count']}" for c in v["by_caller"]))
        console.print(t)
    if s["madvise_by_caller"]:
        t = Table(title=f"reusable line: madvise ({s['madvise_platform']} advice values; never a transition)",
                  show_edge=False)
        for col in ("entry", "advice", "count", "bytes", "caller"):
            t.add_column(col)
        for r in s["madvise_by_caller"]:
            name = s["madvise_names"].get(str(r["advice"])) if r["entry"] == "madvise" else f"darwin {r['advice']}"
            t.add_row(r["entry"], f"{r['advice']} {name or ''}", f"{r['count']:,}", _bytes(r["bytes"]),
                      str(r["caller"]))
        console.print(t)
    footer(console, s)


def iosurface_summary(console: Console, s: dict[str, Any]) -> None:
    header(console, "iosurface", s)
    console.print(f"[bold]surfaces created:[/bold] {s['surfaces']:,} ({human_bytes(s['bytes'])}, kernel memory "
                  f"outside every malloc zone)")
    if s["by_format"]:
        t = Table(title="by pixel format", show_edge=False)
        for col in ("format", "count", "bytes", "sizes (w×h, row bytes, alloc)"):
            t.add_column(col)
        for f in s["by_format"]:
            t.add_row(f["format"], f"{f['count']:,}", human_bytes(f["bytes"]),
                      "; ".join(f"{w}×{h}, {r}, {human_bytes(a)}" for w, h, r, a in f["sizes"]))
        console.print(t)
    if s["by_stack"]:
        t = Table(title="by creating stack", show_edge=False, show_lines=True)
        for col in ("bytes", "count", "frames"):
            t.add_column(col)
        for r in s["by_stack"]:
            t.add_row(human_bytes(r["bytes"]), f"{r['count']:,}", "\n".join(r["frames"][:6]))
        console.print(t)
    rel, held = s["released"], s["held_at_end"]
    console.print(f"[bold]released:[/bold] {rel['count']:,} ({human_bytes(rel['bytes'])})"
                  + ("" if rel["visible"] else " — no destruction entry visible on this platform"))
    console.print(f"[bold]held at end:[/bold] {held['count']:,} ({human_bytes(held['bytes'])}): {held['meaning']}")
    footer(console, s)
