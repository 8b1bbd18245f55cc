"""REPORT.md from the report document (the same dict written as report.json), nothing else."""

from __future__ import annotations

import importlib
from typing import Any

from memtrace import tracers
from memtrace.report.chapters import chapter_of, leaks
from memtrace.reporters.markdown import cell, lines, table, text
from memtrace.units import fmt_bytes, fmt_pct, fmt_seconds


def render(doc: dict[str, Any]) -> str:
    lines = [f"# Memory report: {text(doc['folder'])}", ""]
    targets = doc["targets"]
    lines.append(f"{len(targets)} target(s), {len(doc['calibration'])} capture(s) read, "
                 f"{len(doc['skipped'])} skipped. Sizes in binary units (1 MB = 1048576 B).")
    lines.append("")
    lines += _panorama(doc)
    lines += _findings(doc)
    lines += _families(targets)
    lines += leaks.markdown(targets)
    for tracer in tracers.all_tracers().values():
        lines += chapter_of(tracer).markdown(targets)
    for key, module in (("census", "memtrace.analyze.census"), ("jetsam", "memtrace.analyze.jetsam")):
        for d in doc[key]:
            lines.append(importlib.import_module(module).render_markdown(d).rstrip())
            lines.append("")
    lines += _calibration(doc)
    lines += _skipped(doc)
    return "\n".join(lines).rstrip() + "\n"


def _panorama(doc: dict[str, Any]) -> list[str]:
    rows = []
    for r in doc["panorama"]:
        if r.get("not_measurable"):
            malloc = f"not measurable ({r['not_measurable']})"
            net = "—"
        elif "malloc_gross_bytes" in r:
            runs = r.get("malloc_runs") or [r]
            # Several captures of one target: one line each, side by side in the cell.
            malloc = lines(f"{fmt_bytes(x['malloc_gross_bytes'])} / {fmt_seconds(x['captured_s'])} "
                           f"(window {fmt_seconds(x['window_s'])}) · {x['malloc_calls']:,} calls" for x in runs)
            net = lines(f"in-use {fmt_bytes(x['in_use_delta'], signed=True)} · live {fmt_bytes(x['live_bytes'])} "
                        f"· {x['survivors']:,} survivors" for x in runs)
        else:
            malloc, net = "not traced", "—"
        ios = "not traced" if r["iosurface_bytes"] is None else \
            f"{fmt_bytes(r['iosurface_bytes'])} ({r['iosurface_surfaces']:,} surfaces)"
        purg = "not traced" if r["purgeable_held_bytes"] is None else fmt_bytes(r["purgeable_held_bytes"])
        # A run the window cut says so ("window ended after 60 s; the target was killed").
        ended = r["ended"] if r["ended"] == "completed" and not (r["reason"] or "").startswith("window ended") \
            else f"{r['ended']}: {r['reason']}"
        cov = "—" if r.get("stack_coverage") is None else f"stacks {fmt_pct(r['stack_coverage'])}" + (
            f" · live {fmt_pct(r['live_coverage'])}" if r.get("live_coverage") is not None else "")
        rows.append([r["target"], ios, malloc, net, purg, lines(r["families"]) if r["families"] else "—", ended, cov])
    return ["## Panorama: business × memory", "",
            "IOSurface = surfaces created; malloc gross = allocation pressure; in-use Δ (allocator statistics), "
            "live at end and survivors = net holding; purgeable held = VOLATILE/EMPTY bytes not counted in "
            "footprint.", "",
            *table(["target", "IOSurface created", "malloc gross / time · calls", "net change", "purgeable held",
                    "dominant families", "ended", "coverage"], "lrrrrlll", rows)]


def _findings(doc: dict[str, Any]) -> list[str]:
    lines = ["## Structural findings", ""]
    if not doc["findings"]:
        return lines + ["No finding: nothing measurable in this folder.", ""]
    for f in doc["findings"]:
        lines.append(f"**{text(f['title'])}.** {text(f['text'])}")
        lines.append("")
        lines += [f"- {text(i['text'], line_start=True)}" for i in f["items"]]
        lines.append("")
    return lines


def _families(targets: list[dict[str, Any]]) -> list[str]:
    lines = ["## Stack families", "",
             "Each stack belongs to exactly one family, by its first frames outside the allocator and the "
             "runtime; unmatched stacks are named by their top frame.", ""]
    any_rows = False
    for t in targets:
        m, s = t.get("malloc"), t.get("iosurface")
        rows = []
        if m:
            for r in m["runs"]:
                where = "malloc" if m["captures"] == 1 else f"malloc ({r['path']})"
                rows += [[where, f["family"], fmt_bytes(f["bytes"]), f"{f['count']:,}",
                          fmt_bytes(f["live_bytes"]), f"{f['live_count']:,}"] for f in r["families"]]
        if s:
            rows += [["IOSurface", f["family"], fmt_bytes(f["bytes"]), f"{f['count']:,}", "—", "—"]
                     for f in s["families"]]
        if rows:
            any_rows = True
            lines += [f"### {cell(t['target'])}", ""]
            lines += table(["line", "family", "bytes", "count", "live at end", "live blocks"], "llrrrr", rows)
    return lines if any_rows else lines + ["No stacks.", ""]


def _calibration(doc: dict[str, Any]) -> list[str]:
    lines = ["## Calibration and coverage", "",
             "Every capture read: stack coverage = stack-attributed bytes / gross bytes; live coverage = live "
             "bytes at end / allocator in-use Δ.", ""]
    rows = []
    for c in doc["calibration"]:
        tracer = tracers.get(c["tracer"])
        own = chapter_of(tracer).calibration_text(c) if tracer is not None else None
        if own is not None:
            detail = own
        elif not c["analyzed"]:
            detail = "not analyzed (see Captures skipped)"
        else:
            detail = "—"
        notes = []
        if c["truncated"]:
            notes.append("truncated")
        if c["missing"]:
            notes.append("MISSING " + ", ".join(c["missing"]))
        rows.append([c["path"], c["tracer"], c["target"], c["ended"], f"{c['records'] or 0:,}",
                     fmt_seconds(c["captured_s"]), detail, "; ".join(notes) or "—"])
    return lines + table(["capture", "tracer", "target", "ended", "records", "captured", "coverage", "notes"],
                         "llllrrll", rows)


def _skipped(doc: dict[str, Any]) -> list[str]:
    lines = ["## Captures skipped", ""]
    if not doc["skipped"]:
        return lines + ["None: every capture in the folder was read in full.", ""]
    rows = [[s["path"], "partly (reported with what was read)" if s["partial"] else "no", s["reason"]]
            for s in doc["skipped"]]
    return lines + table(["file", "reported", "reason"], "lll", rows)
