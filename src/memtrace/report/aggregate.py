"""Per-capture entries -> per-target aggregates, the panorama and computed findings.

Everything here works on the compact entries from :mod:`memtrace.report.collect`; the result is
the ``report.json`` document, and ``REPORT.md`` is rendered from that document alone, so the two
always carry the same numbers.  Finding texts are built here, with the numbers they rest on.
"""

from __future__ import annotations

from typing import Any

from memtrace.report.collect import UNSTACKED, Skipped

REPORT_VERSION = 1
DEATHS = ("launch-storm", "perpetual-stream", "slow-start", "anti-debug", "detached", "truncated")
NORMAL = ("completed", "target-exited")
TIER_LABELS = ("≤ 256 B", "257 B–1 KB", "1–4 KB", "4–8 KB", "8–64 KB", "> 64 KB")
TOP = 10


def fmt_bytes(n: float | int | None, signed: bool = False) -> str:
    """Binary units written as KB/MB/GB, as everywhere else in memtrace (1 MB = 1048576 B)."""
    if n is None:
        return "—"
    sign = ("+" if n > 0 else "−" if n < 0 else "±") if signed else ("−" if n < 0 else "")
    v = abs(float(n))
    for unit in ("B", "KB", "MB", "GB"):
        if v < 1024 or unit == "GB":
            return f"{sign}{v:,.0f} B" if unit == "B" else f"{sign}{v:,.1f} {unit}"
        v /= 1024
    return f"{sign}{v:.1f} GB"


def pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.1f} %"


def _merge_families(dst: dict[str, dict[str, int]], rows: list[dict[str, Any]]) -> None:
    for r in rows:
        f = dst.setdefault(r["family"], {})
        for k, v in r.items():
            if k != "family" and isinstance(v, int | float):
                f[k] = f.get(k, 0) + v


def _sorted_families(fam: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    rows = [{"family": k, **v} for k, v in fam.items()]
    rows.sort(key=lambda r: (-r.get("bytes", 0), r["family"]))
    return rows


def _malloc_target(entries: list[dict[str, Any]]) -> dict[str, Any]:
    m: dict[str, Any] = {"captures": len(entries), "gross_bytes": 0, "alloc_calls": 0, "captured_s": 0.0,
                         "window_s": 0.0, "live_bytes": 0, "live_count": 0, "stacked_bytes": 0,
                         "estimated_bytes": 0, "in_use_delta": None, "footprint_delta": None,
                         "tiers": [{"calls": 0, "bytes": 0} for _ in TIER_LABELS]}
    fam: dict[str, dict[str, int]] = {}
    top: list[dict[str, Any]] = []
    live: list[dict[str, Any]] = []
    for e in entries:
        m["gross_bytes"] += e["gross_bytes"]
        m["alloc_calls"] += e["alloc_calls"]
        m["captured_s"] += e.get("captured_s") or 0.0
        m["window_s"] += e.get("window_s") or 0.0
        m["live_bytes"] += e["live"]["bytes"]
        m["live_count"] += e["live"]["count"]
        cov = e["coverage"]
        m["stacked_bytes"] += cov["stacked_bytes"]
        m["estimated_bytes"] += cov["estimated_bytes_with_sampling"]
        if "allocator" in cov:
            m["in_use_delta"] = (m["in_use_delta"] or 0) + cov["allocator"]["in_use_delta"]
        if "footprint" in cov:
            m["footprint_delta"] = (m["footprint_delta"] or 0) + cov["footprint"]["delta"]
        for i, t in enumerate(e["tiers"][:len(TIER_LABELS)]):
            m["tiers"][i]["calls"] += t["calls"]
            m["tiers"][i]["bytes"] += t["bytes"]
        _merge_families(fam, e["families"])
        top += e["top_stacks"]
        live += e["live_by_stack"]
    m["captured_s"] = round(m["captured_s"], 3)
    g, d = m["gross_bytes"], m["in_use_delta"]
    m["stack_coverage"] = round(m["estimated_bytes"] / g, 4) if g else None
    m["live_coverage"] = round(m["live_bytes"] / d, 4) if d and d > 0 else None
    # Churn: gross allocation over net holding.  No ratio when in-use did not grow (it is
    # "all churn"), so a shrinking heap never reads as a tiny or negative ratio.
    m["churn_ratio"] = round(g / d, 1) if d and d > 0 else None
    m["families"] = _sorted_families(fam)
    m["top_stacks"] = _merge_stacks(top)
    m["live_by_stack"] = _merge_stacks(live)
    return m


def _merge_stacks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same frames from several captures (runs) of one target are one row."""
    merged: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in rows:
        key = tuple(r["frames"])
        m = merged.get(key)
        if m is None:
            merged[key] = {"bytes": r["bytes"], "count": r["count"], "exact_bytes": r.get("exact_bytes", 0),
                           "family": r.get("family"), "frames": r["frames"]}
        else:
            m["bytes"] += r["bytes"]
            m["count"] += r["count"]
            m["exact_bytes"] += r.get("exact_bytes", 0)
    return sorted(merged.values(), key=lambda r: (-r["bytes"], r["frames"]))[:TOP]


def _iosurface_target(entries: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"captures": len(entries), "surfaces": 0, "bytes": 0, "by_stack": [], "by_format": [],
                           "held_at_end": None}
    fam: dict[str, dict[str, int]] = {}
    for e in entries:
        out["surfaces"] += int(e.get("surfaces") or 0)
        out["bytes"] += int(e.get("bytes") or 0)
        out["by_stack"] += e.get("by_stack") or []
        out["by_format"] += e.get("by_format") or []
        held = e.get("held_at_end")
        if held is not None:
            out["held_at_end"] = held if out["held_at_end"] is None else _add(out["held_at_end"], held)
        _merge_families(fam, e.get("families") or [])
    out["by_stack"].sort(key=lambda r: -int(r.get("bytes") or 0))
    out["by_stack"] = out["by_stack"][:TOP]
    out["families"] = _sorted_families(fam)
    return out


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _add(a.get(k, 0), b.get(k, 0)) for k in {**a, **b}}
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a + b
    return a


def _purgeable_target(entries: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"captures": len(entries), "transitions": {}, "transition_bytes": {}, "set_calls": 0,
                           "get_calls": 0, "created_purgeable": 0, "created_bytes": 0, "madvise": {},
                           "madvise_bytes": {}, "madvise_names": {}, "keep_current": 0, "by_caller": [],
                           "created_by": [], "framework_calls": {}}
    for e in entries:
        for key in ("transitions", "transition_bytes", "madvise", "madvise_bytes"):
            out[key] = _add(out[key], e.get(key) or {})
        out["madvise_names"].update(e.get("madvise_names") or {})
        for key in ("set_calls", "get_calls", "created_purgeable", "created_bytes", "keep_current"):
            out[key] += int(e.get(key) or 0)
        out["by_caller"] += e.get("by_caller") or []
        out["created_by"] += e.get("created_by") or []
        for name, fc in (e.get("framework_calls") or {}).items():
            out["framework_calls"][name] = out["framework_calls"].get(name, 0) + int(fc.get("calls") or 0)
    out["transitions"] = dict(sorted(out["transitions"].items()))
    out["transition_bytes"] = dict(sorted(out["transition_bytes"].items()))
    tb = out["transition_bytes"]
    out["stolen"] = {"count": out["transitions"].get("2->0", 0), "bytes": tb.get("2->0", 0)}
    # Held but not counted: bytes the traced transitions moved out of NONVOLATILE and did not
    # bring back (0->1 + 0->2 - 1->0 - 2->0).  VOLATILE and EMPTY pages are outside
    # phys_footprint (xnu vm_purgeable.c), so this is memory the footprint does not show.
    held = tb.get("0->1", 0) + tb.get("0->2", 0) - tb.get("1->0", 0) - tb.get("2->0", 0)
    out["held_bytes"] = max(held, 0)
    out["held_formula"] = (f"0→1 {fmt_bytes(tb.get('0->1', 0))} + 0→2 {fmt_bytes(tb.get('0->2', 0))} − "
                           f"1→0 {fmt_bytes(tb.get('1->0', 0))} − 2→0 {fmt_bytes(tb.get('2->0', 0))}")
    out["by_caller"].sort(key=lambda r: (-int(r.get("count") or 0), str(r.get("caller"))))
    out["by_caller"] = out["by_caller"][:TOP * 2]
    return out


def _ended(entries: list[dict[str, Any]]) -> dict[str, Any]:
    deaths = [e for e in entries if e.get("ended") in DEATHS]
    if deaths:
        d = deaths[0]
        return {"ended": d["ended"], "reason": d.get("reason"), "tracer": d.get("tracer")}
    # A target that was killed or crashed outside the death taxonomy is not "completed".
    for e in entries:
        reason = str(e.get("reason") or "")
        if e.get("ended") == "target-exited" and ("killed" in reason or "crashed" in reason):
            return {"ended": "target-exited", "reason": reason, "tracer": e.get("tracer")}
    if any(e.get("ended") == "interrupted" for e in entries):
        return {"ended": "interrupted", "reason": "stopped by the user (Ctrl-C)", "tracer": None}
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
        for tracer, fn in (("malloc", _malloc_target), ("iosurface", _iosurface_target),
                           ("purgeable", _purgeable_target)):
            group = [e for e in ok if e["tracer"] == tracer]
            t[tracer] = fn(group) if group else None
        t["probe"] = [e for e in ok if e["tracer"] == "probe"]
        t["fds"] = [e for e in ok if e["tracer"] == "fds"]
        t["threads"] = [e for e in ok if e["tracer"] == "threads"]
        m = t["malloc"]
        t["measurable"] = not (m is not None and m["alloc_calls"] == 0 and t["ended"] in DEATHS)
        targets.append(t)
    return targets


def families_line(t: dict[str, Any], n: int = 3) -> str:
    parts = []
    m = t.get("malloc")
    if m:
        parts += [f"{f['family']} {fmt_bytes(f['bytes'])}" for f in m["families"]
                  if f["family"] != UNSTACKED and f["bytes"] > 0][:n]
    s = t.get("iosurface")
    if s and s["families"]:
        parts.append("IOSurface: " + " · ".join(f"{f['family']} {fmt_bytes(f['bytes'])}"
                                                for f in s["families"][:n] if f.get("bytes")))
    return " · ".join(parts) if parts else "—"


def panorama(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for t in targets:
        m, s, p = t["malloc"], t["iosurface"], t["purgeable"]
        row: dict[str, Any] = {"target": t["target"], "ended": t["ended"], "reason": t["reason"],
                               "iosurface_bytes": s["bytes"] if s else None,
                               "iosurface_surfaces": s["surfaces"] if s else None,
                               "purgeable_held_bytes": p["held_bytes"] if p else None,
                               "families": families_line(t)}
        if m:
            row.update({"malloc_gross_bytes": m["gross_bytes"], "malloc_calls": m["alloc_calls"],
                        "captured_s": m["captured_s"], "window_s": m["window_s"],
                        "in_use_delta": m["in_use_delta"], "live_bytes": m["live_bytes"],
                        "survivors": m["live_count"], "stack_coverage": m["stack_coverage"],
                        "live_coverage": m["live_coverage"]})
        if not t["measurable"]:
            row["not_measurable"] = f"{t['ended']}: {t['reason']}"
        rows.append(row)
    return rows


def findings(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    churn = [t for t in targets if t["malloc"] and t["malloc"]["gross_bytes"] > 0 and t["measurable"]]
    if churn:
        ranked = sorted(churn, key=lambda t: (-(t["malloc"]["churn_ratio"] or float("inf")), t["target"]))
        # Targets whose heap did not grow at all are the purest churn: they rank first.
        items = []
        for t in ranked:
            m = t["malloc"]
            ratio = f"churn {m['churn_ratio']:,.1f}×" if m["churn_ratio"] else "no net growth: all churn"
            items.append({"target": t["target"], "gross_bytes": m["gross_bytes"], "alloc_calls": m["alloc_calls"],
                          "in_use_delta": m["in_use_delta"], "live_bytes": m["live_bytes"],
                          "survivors": m["live_count"], "churn_ratio": m["churn_ratio"],
                          "text": f"{t['target']}: {fmt_bytes(m['gross_bytes'])} gross in {m['alloc_calls']:,} calls "
                                  f"vs allocator in-use {fmt_bytes(m['in_use_delta'], signed=True)}, "
                                  f"{fmt_bytes(m['live_bytes'])} live at end in {m['live_count']:,} blocks "
                                  f"({ratio})"})
        top = items[0]
        out.append({"kind": "churn", "title": "malloc churn ≫ net growth",
                    "text": f"Allocation pressure and real holding are two measures: the largest churn is "
                            f"{top['text']}.", "items": items})
    dom = []
    for t in targets:
        m = t["malloc"]
        if not m:
            continue
        fams = [f for f in m["families"] if f["family"] != UNSTACKED and f["bytes"] > 0]
        attributed = sum(f["bytes"] for f in fams)
        if not fams or not attributed:
            continue
        f = fams[0]
        share = f["bytes"] / attributed
        dom.append({"target": t["target"], "family": f["family"], "bytes": f["bytes"], "attributed_bytes": attributed,
                    "share": round(share, 4),
                    "text": f"{t['target']}: {f['family']} — {fmt_bytes(f['bytes'])} of {fmt_bytes(attributed)} "
                            f"stack-attributed gross bytes ({pct(share)})"})
    if dom:
        out.append({"kind": "dominant-family", "title": "stack signature = business fingerprint",
                    "text": "The family with the most stack-attributed malloc bytes, per target.", "items": dom})
    held = []
    for t in targets:
        p = t["purgeable"]
        if p and p["held_bytes"] > 0:
            held.append({"target": t["target"], "held_bytes": p["held_bytes"], "formula": p["held_formula"],
                         "text": f"{t['target']}: {fmt_bytes(p['held_bytes'])} held VOLATILE/EMPTY at the end "
                                 f"({p['held_formula']})"})
    if held:
        held.sort(key=lambda h: (-h["held_bytes"], h["target"]))
        out.append({"kind": "purgeable-held", "title": "purgeable = held but not counted",
                    "text": "VOLATILE and EMPTY pages are not counted in phys_footprint: memory a footprint "
                            "reading does not show.", "items": held})
    two = []
    for t in targets:
        s, m = t["iosurface"], t["malloc"]
        if s and s["bytes"] and m:
            two.append({"target": t["target"], "iosurface_bytes": s["bytes"], "surfaces": s["surfaces"],
                        "malloc_live_bytes": m["live_bytes"], "malloc_gross_bytes": m["gross_bytes"],
                        "text": f"{t['target']}: {s['surfaces']:,} surfaces, {fmt_bytes(s['bytes'])} of IOSurface "
                                f"memory vs {fmt_bytes(m['live_bytes'])} malloc live at end "
                                f"({fmt_bytes(m['gross_bytes'])} gross)"})
    if two:
        out.append({"kind": "iosurface-vs-malloc", "title": "IOSurface and malloc are two worlds",
                    "text": "Kernel (IOKit) surfaces are large and persistent; malloc is small, frequent, "
                            "churn-dominated.", "items": two})
    return out


def calibration_rows(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for e in sorted(entries, key=lambda e: e["path"]):
        row: dict[str, Any] = {"path": e["path"], "tracer": e["tracer"], "target": e["target"],
                               "ended": e.get("ended", "—"), "records": e.get("records"),
                               "truncated": e.get("truncated", False), "missing": e.get("missing") or [],
                               "captured_s": e.get("captured_s"), "window_s": e.get("window_s"),
                               "analyzed": e.get("analyzed", False)}
        cov = e.get("coverage")
        if e["tracer"] == "malloc" and cov:
            a, f = cov.get("allocator") or {}, cov.get("footprint") or {}
            row.update({"gross_bytes": e["gross_bytes"], "stacked_bytes": cov["stacked_bytes"],
                        "stack_coverage": cov["stack_coverage"], "estimated_coverage": cov["estimated_coverage"],
                        "in_use_before": a.get("in_use_before"), "in_use_after": a.get("in_use_after"),
                        "in_use_delta": a.get("in_use_delta"), "allocator_source": a.get("source"),
                        "live_bytes": e["live"]["bytes"], "live_coverage": cov.get("live_coverage"),
                        "footprint_delta": f.get("delta"), "footprint_source": f.get("source"),
                        "dropped": {k: v for k, v in (e.get("dropped") or {}).items() if v}})
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
