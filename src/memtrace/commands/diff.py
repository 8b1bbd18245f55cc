"""memtrace diff: what changed between two captures (or two folders of captures)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from memtrace.reporters.console import frames_text, line, plain, stack_table
from memtrace.units import fmt_bytes
from memtrace.views.diff import diff


def _count(c: dict[str, Any]) -> str:
    d = c["delta"]
    sign = "+" if d > 0 else "−" if d < 0 else "±"
    return f"{c['base']:,} → {c['new']:,} ({sign}{abs(d):,})"


def _bytes(c: dict[str, Any]) -> str:
    return f"{fmt_bytes(c['base'])} → {fmt_bytes(c['new'])}"


def render(console: Console, doc: dict[str, Any]) -> None:
    for pair in doc["pairs"]:
        console.rule(plain(f"memtrace diff · {pair['target']} ({pair['tracer']})"))
        line(console, ("base", pair["base"]), ("new", pair["new"]))
        for view, v in pair["views"].items():
            if "missing" in v:
                line(console, (view, v["missing"]))
                continue
            for side, other in (("base", "new"), ("new", "base")):
                if f"{side}_missing" in v:
                    line(console, (view, f"{fmt_bytes(v['total'][other])} in {other} ({v['count'][other]:,}); "
                                         f"not in {side}: {v[side + '_missing']}"))
                    break
            else:
                line(console, (view, f"{fmt_bytes(v['total']['delta'], signed=True)} ({_bytes(v['total'])}); "
                                     f"count {_count(v['count'])}"))
        if pair["families"]:
            t = Table(title="by family (largest change first)", show_edge=False)
            for col, just in (("change", "right"), ("bytes", "right"), ("count", "right"), ("family", "left")):
                t.add_column(col, justify=just)  # type: ignore[arg-type]
            for f in pair["families"]:
                t.add_row(fmt_bytes(f["bytes"]["delta"], signed=True), _bytes(f["bytes"]), _count(f["count"]),
                          plain(f["family"]))
            console.print(t)
        for view, v in pair["views"].items():
            rows = v.get("rows") or []
            if rows:
                console.print(stack_table(f"{view} by stack (largest change first)",
                                          [("change", "right"), ("bytes", "right"), ("count", "right"),
                                           ("frames", "left")],
                                          [[fmt_bytes(r["bytes"]["delta"], signed=True), _bytes(r["bytes"]),
                                            _count(r["count"]), frames_text(r["frames"])] for r in rows]))
    for u in doc["unpaired"]:
        line(console, (f"only in {u['side']}", f"{u['target']} ({u['tracer']}): {u['path']}"))


@click.command("diff")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="The comparison as one JSON document.")
@click.option("--top", type=click.IntRange(1), default=10, show_default=True, help="Rows per table.")
@click.option("--families", type=click.Path(path_type=Path), default=None,
              help="Extra stack-family rules (YAML), as for memtrace report.")
def command(base: Path, new: Path, as_json: bool, top: int, families: Path | None) -> int:
    """Compare BASE and NEW (captures, capture folders, or folders of captures paired by target
    and tracer): by family and by stack, for gross, live, leaked and peak bytes, largest
    change first; + grew in NEW, − shrank."""
    doc = diff(base, new, top=top, families=families)
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    else:
        render(Console(), doc)
    for c in doc["incomplete"]:
        click.echo(f"memtrace: warning: {c['path']}: {c['problem']}", err=True)
    return 1 if doc["incomplete"] else 0
