"""Per-capture entries -> per-target aggregates, the panorama and computed findings.

Everything here works on the compact entries from :mod:`memtrace.report.collect`; the result is
the ``report.json`` document, and ``REPORT.md`` is rendered from that document alone, so the two
always carry the same numbers.  Each tracer's chapter (found through the tracer registry)
aggregates its own entries and computes its own findings; this module joins them per target
and builds the panorama across the lines.
"""

from __future__ import annotations

import re
from typing import Any

from memtrace import tracers
from memtrace.report.chapters import UNSTACKED, chapter_of, leaks
from memtrace.report.collect import Skipped
from memtrace.units import fmt_bytes

REPORT_VERSION = 1
DEATHS = ("launch-storm", "perpetual-stream", "slow-start", "anti-debug", "detached", "truncated")
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


def build_targets(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
        for name, tracer in tracers.all_tracers().items():
            group = [e for e in ok if e["tracer"] == name]
            t[name] = chapter_of(tracer).aggregate(group) if group else None
        m = t.get("malloc")
        t["measurable"] = not (m is not None and all(r["alloc_calls"] == 0 for r in m["runs"])
                               and t["ended"] in DEATHS)
        targets.append(t)
    return targets


def families_line(t: dict[str, Any], n: int = 3) -> list[str]:
    """The dominant families, one line per malloc capture (captures are compared, never added
    up), then IOSurface's; [] when nothing was stacked."""
    out = []
    m = t.get("malloc")
    if m:
        runs = [" · ".join([f"{f['family']} {fmt_bytes(f['bytes'])}" for f in r["families"]
                            if f["family"] != UNSTACKED and f["bytes"] > 0][:n]) for r in m["runs"]]
        if any(runs):
            out += [r or "—" for r in runs]
    s = t.get("iosurface")
    if s and s["families"]:
        out.append("IOSurface: " + " · ".join(f"{f['family']} {fmt_bytes(f['bytes'])}"
                                              for f in s["families"][:n] if f.get("bytes")))
    return out


def panorama(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for t in targets:
        m, s, p = t.get("malloc"), t.get("iosurface"), t.get("purgeable")
        row: dict[str, Any] = {"target": t["target"], "ended": t["ended"], "reason": t["reason"],
                               "iosurface_bytes": s["bytes"] if s else None,
                               "iosurface_surfaces": s["surfaces"] if s else None,
                               "purgeable_held_bytes": p["held_bytes"] if p else None,
                               "families": families_line(t)}
        if m:
            # One entry per capture, side by side; the row's own figures are the last capture's.
            runs = [{"path": r["path"], "malloc_gross_bytes": r["gross_bytes"], "malloc_calls": r["alloc_calls"],
                     "captured_s": r["captured_s"], "window_s": r["window_s"],
                     "in_use_delta": r["in_use_delta"], "live_bytes": r["live_bytes"],
                     "survivors": r["live_count"], "stack_coverage": r["stack_coverage"],
                     "live_coverage": r["live_coverage"]} for r in m["runs"]]
            row.update({k: v for k, v in runs[-1].items() if k != "path"})
            row["malloc_runs"] = runs
        if not t["measurable"]:
            row["not_measurable"] = f"{t['ended']}: {t['reason']}"
        rows.append(row)
    return rows


def findings(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tracer in tracers.all_tracers().values():
        out += chapter_of(tracer).findings(targets)
    return out + leaks.findings(targets)


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
    targets = build_targets(entries)
    return {
        "kind": "report", "version": REPORT_VERSION, "folder": folder_name,
        "units": "bytes; KB/MB/GB in REPORT.md are binary (1 MB = 1048576 B)",
        "panorama": panorama(targets),
        "findings": findings(targets),
        "targets": targets,
        "calibration": calibration_rows(entries),
        "census": census,
        "jetsam": jetsam,
        "skipped": [{"path": s.path, "reason": s.reason, "partial": s.partial} for s in skipped],
    }
