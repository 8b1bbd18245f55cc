"""Per-capture entries -> per-target aggregates, the panorama and computed findings.

Everything here works on the compact entries from :mod:`memtrace.report.collect`; the result is
the ``report.json`` document, and ``REPORT.md`` is rendered from that document alone, so the two
always carry the same numbers.  Each tracer's chapter (found through the tracer registry)
aggregates its own entries and computes its own findings; this module joins them per target
and builds the panorama across the lines from what each chapter contributes to it
(``report.chapters``: the panorama, families and measurable parts of the protocol).
"""

from __future__ import annotations

import re
from typing import Any

from memtrace import tracers
from memtrace.report import processes
from memtrace.report.chapters import Lines, chapter_of, leaks
from memtrace.report.collect import Skipped

REPORT_VERSION = 1
DEATHS = ("launch-storm", "perpetual-stream", "slow-start", "anti-debug", "starved", "detached", "truncated",
          "memtrace-failed")
NORMAL = ("completed", "target-exited")


def _ended(entries: list[dict[str, Any]]) -> dict[str, Any]:
    deaths = [e for e in entries if e.get("ended") in DEATHS]
    if deaths:
        d = deaths[0]
        return {"ended": d["ended"], "reason": d.get("reason"), "tracer": d.get("tracer")}
    # A target that was killed, crashed or failed (a non-zero exit status) outside the death
    # taxonomy is not "completed".
    for e in entries:
        reason = str(e.get("reason") or "")
        if e.get("ended") == "target-exited" and ("killed" in reason or "crashed" in reason
                                                  or re.search(r"exit status [1-9]", reason)):
            return {"ended": "target-exited", "reason": reason, "tracer": e.get("tracer")}
    if any(e.get("ended") == "interrupted" for e in entries):
        return {"ended": "interrupted", "reason": "stopped by the user (Ctrl-C)", "tracer": None}
    for e in entries:       # the window, not the target, ended it: said so
        if e.get("ended") == "completed" and str(e.get("reason") or "").startswith("window ended"):
            return {"ended": "completed", "reason": e["reason"], "tracer": e.get("tracer")}
    return {"ended": "completed", "reason": None, "tracer": None}


def chapters() -> Lines:
    """Every registered tracer's chapter, in registry order."""
    return Lines([chapter_of(t) for t in tracers.all_tracers().values()])


def build_targets(entries: list[dict[str, Any]], lines: Lines | None = None) -> list[dict[str, Any]]:
    lines = lines or chapters()
    by_target: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_target.setdefault(e["target"], []).append(e)
    targets = []
    for name in sorted(by_target):
        es = by_target[name]
        t: dict[str, Any] = {"target": name, "captures": [e["path"] for e in es],
                             "tracers": sorted({e["tracer"] for e in es}), **_ended(es),
                             "unanalyzed": [{"path": e["path"], "tracer": e["tracer"]}
                                            for e in es if not e.get("analyzed")]}
        ok = [e for e in es if e.get("analyzed")]
        for c in lines.chapters:
            group = [e for e in ok if e["tracer"] == c.name]
            t[c.name] = c.aggregate(group) if group else None
        # A death before a line saw any of its calls leaves nothing to measure.
        t["measurable"] = not (any(c.measured_nothing(agg) for c, agg in lines.traced(t)) and t["ended"] in DEATHS)
        targets.append(t)
    return targets


FAMILIES_PLACE = 50     # the dominant families' place among the panorama's fields and columns


def families_line(t: dict[str, Any], lines: Lines) -> list[str]:
    """The dominant families of each line that has stacks, in registry order; [] when nothing was stacked."""
    return [x for c, agg in lines.traced(t) for x in c.families_line(agg)]


def panorama(targets: list[dict[str, Any]], lines: Lines) -> list[dict[str, Any]]:
    """One row per target: how it ended, each line's figures (its chapter's ``panorama``), the
    dominant families."""
    rows = []
    parts = sorted(lines.chapters, key=lambda c: c.panorama_place)
    for t in targets:
        row: dict[str, Any] = {"target": t["target"], "ended": t["ended"], "reason": t["reason"]}
        for c in parts:
            if "families" not in row and c.panorama_place > FAMILIES_PLACE:
                row["families"] = families_line(t, lines)
            row.update(c.panorama(t.get(c.name)))
        row.setdefault("families", families_line(t, lines))
        if not t["measurable"]:
            row["not_measurable"] = f"{t['ended']}: {t['reason']}"
        rows.append(row)
    return rows


def findings(targets: list[dict[str, Any]], lines: Lines) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for c in lines.chapters:
        out += c.findings(targets, lines)
    return out + leaks.findings(targets, lines)


def calibration_rows(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for e in sorted(entries, key=lambda e: e["path"]):
        row: dict[str, Any] = {"path": e["path"], "tracer": e["tracer"], "target": e["target"],
                               "ended": e.get("ended", "—"), "records": e.get("records"),
                               "truncated": e.get("truncated", False), "missing": e.get("missing") or [],
                               "captured_s": e.get("captured_s"), "window_s": e.get("window_s"),
                               "analyzed": e.get("analyzed", False)}
        tracer = tracers.get(e["tracer"])
        if tracer is not None and e.get("analyzed"):
            row.update(chapter_of(tracer).calibration(e))
        rows.append(row)
    return rows


def build_document(folder_name: str, entries: list[dict[str, Any]], skipped: list[Skipped],
                   census: list[dict[str, Any]], jetsam: list[dict[str, Any]]) -> dict[str, Any]:
    lines = chapters()
    targets = build_targets(entries, lines)
    return {
        "kind": "report", "version": REPORT_VERSION, "folder": folder_name,
        "units": "bytes; KB/MB/GB in REPORT.md are binary (1 MB = 1048576 B)",
        "panorama": panorama(targets, lines),
        "findings": findings(targets, lines),
        "targets": targets,
        "processes": processes.trees(entries),
        "calibration": calibration_rows(entries),
        "census": census,
        "jetsam": jetsam,
        "skipped": [{"path": s.path, "reason": s.reason, "partial": s.partial} for s in skipped],
    }
