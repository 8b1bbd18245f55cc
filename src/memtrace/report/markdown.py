"""REPORT.md from the report document (the same dict written as report.json), nothing else."""

from __future__ import annotations

import importlib
from typing import Any

from memtrace import tracers
from memtrace.report import processes
from memtrace.report.aggregate import FAMILIES_PLACE, chapters
from memtrace.report.chapters import Column, Lines, chapter_of, leaks
from memtrace.reporters.markdown import cell, lines, table, text
from memtrace.units import fmt_seconds


def render(doc: dict[str, Any]) -> str:
    report = chapters()
    lines = [f"# Memory report: {text(doc['folder'])}", ""]
    targets = doc["targets"]
    lines.append(f"{len(targets)} target(s), {len(doc['calibration'])} capture(s) read, "
                 f"{len(doc['skipped'])} skipped. Sizes in binary units (1 MB = 1048576 B).")
    lines.append("")
    lines += _panorama(doc, report)
    lines += _findings(doc)
    lines += processes.markdown(doc.get("processes") or [])
    lines += _families(targets, report)
    lines += leaks.markdown(targets, report)
    for chapter in report.chapters:
        lines += chapter.markdown(targets)
    for key, module in (("census", "memtrace.analyze.census"), ("jetsam", "memtrace.analyze.jetsam")):
        for d in doc[key]:
            lines.append(importlib.import_module(module).render_markdown(d).rstrip())
            lines.append("")
    lines += _calibration(doc)
    lines += _skipped(doc)
    return "\n".join(lines).rstrip() + "\n"


def _ended(r: dict[str, Any]) -> str:
    # A run the window cut says so ("window ended after 60 s; the target was killed").
    return r["ended"] if r["ended"] == "completed" and not (r["reason"] or "").startswith("window ended") \
        else f"{r['ended']}: {r['reason']}"


# The panorama's own columns; each chapter adds its own (``panorama_columns``), all in place order.
OWN_COLUMNS = (Column("target", "l", 0, lambda r: r["target"]),
               Column("dominant families", "l", FAMILIES_PLACE,
                      lambda r: lines(r["families"]) if r["families"] else "—"),
               Column("ended", "l", 60, _ended))


def _panorama(doc: dict[str, Any], report: Lines) -> list[str]:
    columns = sorted([*OWN_COLUMNS, *(col for c in report.chapters for col in c.panorama_columns)],
                     key=lambda col: col.place)
    rows = [[col.cell(r) for col in columns] for r in doc["panorama"]]
    legend = "; ".join(c.panorama_legend for c in sorted(report.chapters, key=lambda c: min(
        (col.place for col in c.panorama_columns), default=0)) if c.panorama_legend)
    return ["## Panorama: business × memory", "", f"{legend}.", "",
            *table([col.heading for col in columns], "".join(col.align for col in columns), rows)]


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


def _families(targets: list[dict[str, Any]], report: Lines) -> list[str]:
    lines = ["## Stack families", "",
             "Each stack belongs to exactly one family, by its first frames outside the allocator and the "
             "runtime; unmatched stacks are named by their top frame.", ""]
    any_rows = False
    for t in targets:
        rows = [row for c, agg in report.traced(t) for row in c.family_rows(agg)]
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
