"""REPORT.md from the report document (the same dict written as report.json), nothing else."""

from __future__ import annotations

import importlib
from typing import Any

from memtrace.report.aggregate import TIER_LABELS, fmt_bytes, pct
from memtrace.reporters.markdown import cell, table

FRAMES_SHOWN = 6


def arrow(key: str) -> str:
    return key.replace("->", "→")


def frames_cell(frames: list[str]) -> str:
    shown = [cell(f) for f in frames[:FRAMES_SHOWN]]
    more = f" ← … (+{len(frames) - FRAMES_SHOWN})" if len(frames) > FRAMES_SHOWN else ""
    return "`" + "` ← `".join(shown) + "`" + more if shown else "—"


def _seconds(x: float | None) -> str:
    return "—" if x is None else f"{x:g} s"


def render(doc: dict[str, Any]) -> str:
    lines = [f"# Memory report: {doc['folder']}", ""]
    targets = doc["targets"]
    lines.append(f"{len(targets)} target(s), {len(doc['calibration'])} capture(s) read, "
                 f"{len(doc['skipped'])} skipped. Sizes in binary units (1 MB = 1048576 B).")
    lines.append("")
    lines += _panorama(doc)
    lines += _findings(doc)
    lines += _families(targets)
    lines += _malloc(targets)
    lines += _iosurface(targets)
    lines += _purgeable(targets)
    lines += _probe(targets)
    lines += _fds(targets)
    lines += _threads(targets)
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
            malloc = (f"{fmt_bytes(r['malloc_gross_bytes'])} / {_seconds(r['captured_s'])} "
                      f"(window {_seconds(r['window_s'])}) · {r['malloc_calls']:,} calls")
            net = (f"in-use {fmt_bytes(r['in_use_delta'], signed=True)} · live {fmt_bytes(r['live_bytes'])} "
                   f"· {r['survivors']:,} survivors")
        else:
            malloc, net = "not traced", "—"
        ios = "not traced" if r["iosurface_bytes"] is None else \
            f"{fmt_bytes(r['iosurface_bytes'])} ({r['iosurface_surfaces']:,} surfaces)"
        purg = "not traced" if r["purgeable_held_bytes"] is None else fmt_bytes(r["purgeable_held_bytes"])
        ended = r["ended"] if r["ended"] == "completed" else f"{r['ended']}: {r['reason']}"
        cov = "—" if r.get("stack_coverage") is None else f"stacks {pct(r['stack_coverage'])}" + (
            f" · live {pct(r['live_coverage'])}" if r.get("live_coverage") is not None else "")
        rows.append([r["target"], ios, malloc, net, purg, r["families"], ended, cov])
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
        lines.append(f"**{f['title']}.** {f['text']}")
        lines.append("")
        lines += [f"- {i['text']}" for i in f["items"]]
        lines.append("")
    return lines


def _families(targets: list[dict[str, Any]]) -> list[str]:
    lines = ["## Stack families", "",
             "Each stack belongs to exactly one family, by its first frames outside the allocator and the "
             "runtime; unmatched stacks are named by their top frame.", ""]
    any_rows = False
    for t in targets:
        m, s = t["malloc"], t["iosurface"]
        rows = []
        if m:
            rows += [["malloc", f["family"], fmt_bytes(f["bytes"]), f"{f['count']:,}",
                      fmt_bytes(f["live_bytes"]), f"{f['live_count']:,}"] for f in m["families"]]
        if s:
            rows += [["IOSurface", f["family"], fmt_bytes(f["bytes"]), f"{f['count']:,}", "—", "—"]
                     for f in s["families"]]
        if rows:
            any_rows = True
            lines += [f"### {t['target']}", ""]
            lines += table(["line", "family", "bytes", "count", "live at end", "live blocks"], "llrrrr", rows)
    return lines if any_rows else lines + ["No stacks.", ""]


def _malloc(targets: list[dict[str, Any]]) -> list[str]:
    ms = [t for t in targets if t["malloc"]]
    if not ms:
        return []
    lines = ["## malloc", "", "### Churn vs net", ""]
    rows = []
    for t in ms:
        m = t["malloc"]
        if not t["measurable"]:
            rows.append([t["target"], f"not measurable ({t['ended']})", *["—"] * 6])
            continue
        rows.append([t["target"], fmt_bytes(m["gross_bytes"]), f"{m['alloc_calls']:,}",
                     fmt_bytes(m["in_use_delta"], signed=True), fmt_bytes(m["live_bytes"]), f"{m['live_count']:,}",
                     "—" if m["churn_ratio"] is None else f"{m['churn_ratio']:,.1f}×",
                     fmt_bytes(m["footprint_delta"], signed=True)])
    lines += table(["target", "gross", "calls", "in-use Δ", "live at end", "survivors", "churn (gross / in-use Δ)",
                    "footprint Δ"], "lrrrrrrr", rows)
    lines += ["### Size tiers (calls / bytes)", ""]
    rows = [[t["target"], *(f"{x['calls']:,} / {fmt_bytes(x['bytes'])}" for x in t["malloc"]["tiers"])]
            for t in ms if t["measurable"]]
    lines += table(["target", *TIER_LABELS], "l" + "r" * len(TIER_LABELS), rows)
    for title, key in (("Live by stack at window end", "live_by_stack"), ("Top stacks by gross bytes", "top_stacks")):
        lines += [f"### {title}", ""]
        for t in ms:
            rows = [[fmt_bytes(r["bytes"]), f"{r['count']:,}", r["family"], frames_cell(r["frames"])]
                    for r in t["malloc"][key]]
            if rows:
                lines += [f"**{t['target']}**", ""]
                lines += table(["bytes", "count", "family", "frames (innermost first)"], "rrll", rows)
    return lines


def _iosurface(targets: list[dict[str, Any]]) -> list[str]:
    ss = [t for t in targets if t["iosurface"]]
    if not ss:
        return []
    lines = ["## IOSurface", ""]
    for t in ss:
        s = t["iosurface"]
        lines += [f"### {t['target']}", "", f"{s['surfaces']:,} surfaces created, {fmt_bytes(s['bytes'])}."
                  + (f" Held at end: {_held(s['held_at_end'])}." if s["held_at_end"] is not None else ""), ""]
        rows = [[fmt_bytes(r.get("bytes")), f"{int(r.get('count') or 0):,}", r.get("family", "—"),
                 frames_cell(r.get("frames") or [])] for r in s["by_stack"]]
        if rows:
            lines += ["By stack:", ""] + table(["bytes", "surfaces", "family", "frames"], "rrll", rows)
        if s["by_format"]:
            rows = [[r.get("format", "—"), f"{int(r.get('count') or 0):,}", fmt_bytes(r.get("bytes")),
                     ", ".join(_size(z) for z in r.get("sizes") or [])] for r in s["by_format"]]
            lines += ["By pixel format and size:", ""]
            lines += table(["format", "surfaces", "bytes", "sizes (w×h, bytes per row, alloc size)"], "lrrl", rows)
    return lines


def _size(z: Any) -> str:
    if isinstance(z, list | tuple) and len(z) == 4:
        w, h, bpr, alloc = z
        return f"{w}×{h} ({bpr} B/row, {fmt_bytes(alloc)})"
    return str(z)


def _held(h: Any) -> str:
    if isinstance(h, dict):
        return f"{int(h.get('count') or 0):,} surfaces, {fmt_bytes(h.get('bytes'))}"
    return fmt_bytes(h) if isinstance(h, int) else str(h)


MATRIX = ("0->1", "1->0", "0->2", "2->0", "1->2", "2->1", "0->0", "1->1", "2->2")


def _purgeable(targets: list[dict[str, Any]]) -> list[str]:
    ps = [t for t in targets if t["purgeable"]]
    if not ps:
        return []
    cols = [k for k in MATRIX if any(t["purgeable"]["transitions"].get(k) for t in ps)] or ["0->1", "1->0"]
    lines = ["## purgeable", "", "### Transition matrix (SET calls, old → new state: 0 NONVOLATILE, 1 VOLATILE, "
             "2 EMPTY; 2→0 = stolen by the kernel, found on reacquire)", ""]
    rows = []
    for t in ps:
        p = t["purgeable"]
        tr, tb = p["transitions"], p["transition_bytes"]
        rows.append([t["target"], *(f"{tr.get(k, 0):,} ({fmt_bytes(tb.get(k, 0))})" for k in cols),
                     f"{p['set_calls']:,}", f"{p['get_calls']:,}",
                     f"{p['stolen']['count']:,} ({fmt_bytes(p['stolen']['bytes'])})",
                     f"{p['created_purgeable']:,} ({fmt_bytes(p['created_bytes'])})", fmt_bytes(p["held_bytes"])])
    lines += table(["target", *map(arrow, cols), "SET", "GET", "stolen 2→0", "created purgeable", "held"],
                   "l" + "r" * (len(cols) + 5), rows)
    for t in ps:
        p = t["purgeable"]
        lines += [f"### {t['target']}: direct callers", ""]
        rows = [[r.get("entry", "—"), arrow(str(r.get("transition", "—"))), f"{int(r.get('count') or 0):,}",
                 fmt_bytes(r.get("bytes")), r.get("family", "—"), frames_cell(r.get("frames") or [])]
                for r in p["by_caller"]]
        lines += table(["entry", "transition", "count", "bytes", "family", "frames"], "llrrll", rows) if rows \
            else ["No SET calls.", ""]
        if p["created_by"]:
            rows = [[r.get("entry", "—"), f"{int(r.get('count') or 0):,}", fmt_bytes(r.get("bytes")),
                     frames_cell(r.get("frames") or [])] for r in p["created_by"]]
            lines += ["Creation events (purgeable objects created NONVOLATILE):", ""]
            lines += table(["entry", "count", "bytes", "frames"], "lrrl", rows)
        if p["framework_calls"]:
            lines += ["Framework entries: " + ", ".join(f"`{k}` ×{v:,}" for k, v in
                                                       sorted(p["framework_calls"].items())), ""]
        if p["madvise"]:
            mad = ", ".join(f"{p['madvise_names'].get(a) or 'advice ' + a} ({a}) ×{n:,}"
                            + (f" ({fmt_bytes(p['madvise_bytes'].get(a))})" if p["madvise_bytes"].get(a) else "")
                            for a, n in sorted(p["madvise"].items(), key=lambda kv: int(kv[0])))
            lines += [f"madvise (the separate reusable-page line, not purgeable transitions): {mad}.", ""]
    return lines


def _probe(targets: list[dict[str, Any]]) -> list[str]:
    probes = [(t["target"], e) for t in targets for e in t["probe"]]
    if not probes:
        return []
    lines = ["## Probe truth tables", ""]
    try:
        render_probe = importlib.import_module("memtrace.analyze.probe").render_markdown
    except (ModuleNotFoundError, AttributeError):
        render_probe = None
    for target, e in probes:
        lines += [f"### {target} ({e['path']})", ""]
        if render_probe is not None:
            lines += [render_probe(e).rstrip(), ""]
        else:
            rows = e.get("rows") or []
            keys = list(rows[0]) if rows else []
            lines += table(keys, "l" * len(keys), [[r.get(k) for k in keys] for r in rows]) if rows else ["No rows.", ""]
    return lines


def _fds(targets: list[dict[str, Any]]) -> list[str]:
    runs = [(t["target"], e) for t in targets for e in t.get("fds") or []]
    if not runs:
        return []
    lines = ["## File descriptors", "",
             "Descriptors created in the window and never released are leaks in the making: each holds a "
             "kernel object until the process dies, and past the descriptor limit every open fails (EMFILE).",
             ""]
    rows = []
    for target, e in runs:
        failed = ", ".join(f"{call} {err} ×{n:,}" for call, errs in e["failed"].items() for err, n in errs.items())
        rec = e.get("reconciliation") or {}
        rows.append([target, e["path"], f"{e['opened']:,}", f"{sum(e['closed'].values()):,}",
                     f"{e['baseline']['count']:,}", f"{e['peak']['count']:,}", f"{e['open_at_end']['count']:,}",
                     f"{len(rec.get('opened_out_of_sight') or []):,}" if rec else "—", failed or "—"])
    lines += table(["target", "capture", "created", "released", "open before", "peak open", "still open",
                    "opened out of sight", "failed"], "llrrrrrrl", rows)
    for target, e in runs:
        by_stack = e["open_at_end"]["by_stack"]
        if not by_stack:
            continue
        lines += [f"### {target}: still open at the end, by opening stack", ""]
        lines += table(["count", "calls", "caller", "family", "paths", "frames"], "rlllll",
                       [[f"{r['count']:,}", ", ".join(f"{k} ×{v:,}" for k, v in r["calls"].items()),
                         r["caller"] or "—", r.get("family", "—"),
                         "<br>".join(r["paths"][:3]) + (" …" if len(r["paths"]) > 3 else "") or "—",
                         frames_cell(r["frames"])] for r in by_stack])
    return lines


def _threads(targets: list[dict[str, Any]]) -> list[str]:
    runs = [(t["target"], e) for t in targets for e in t.get("threads") or []]
    if not runs:
        return []
    lines = ["## Threads", "",
             "A joinable thread that exits without being joined or detached is leaked: its stack and thread "
             "descriptor stay reserved until the process dies, and enough of them make pthread_create fail "
             "(EAGAIN).", ""]
    rows = []
    for target, e in runs:
        failed = ", ".join(f"{err} ×{n:,}" for err, n in e["failed"].items())
        rows.append([target, e["path"], f"{e['created']:,}", f"{e['joined']:,}",
                     f"{e['detached']:,} + {e['created_detached']:,} at creation", f"{e['peak']['count']:,}",
                     f"{e['leaked']['count']:,}", f"{e['running_at_end']['count']:,}", failed or "—"])
    lines += table(["target", "capture", "created", "joined", "detached", "peak alive", "leaked",
                    "running at end", "failed"], "llrrrrrrl", rows)
    for target, e in runs:
        for title, key in (("leaked threads", "leaked"), ("threads still running at the end", "running_at_end")):
            by_stack = e[key]["by_stack"]
            if by_stack:
                lines += [f"### {target}: {title}, by creating stack", ""]
                lines += table(["count", "routine", "caller", "stack reserved", "family", "frames"], "rllrll",
                               [[f"{r['count']:,}", r["routine"] or "—", r["caller"] or "—",
                                 fmt_bytes(r["stack_bytes"]), r.get("family", "—"), frames_cell(r["frames"])]
                                for r in by_stack])
    return lines


def _calibration(doc: dict[str, Any]) -> list[str]:
    lines = ["## Calibration and coverage", "",
             "Every capture read: stack coverage = stack-attributed bytes / gross bytes; live coverage = live "
             "bytes at end / allocator in-use Δ.", ""]
    rows = []
    for c in doc["calibration"]:
        if c["tracer"] == "malloc" and c.get("gross_bytes") == 0:
            detail = "no allocation captured"
        elif c["tracer"] == "malloc" and "gross_bytes" in c:
            detail = (f"stacks {fmt_bytes(c['stacked_bytes'])} of {fmt_bytes(c['gross_bytes'])} = "
                      f"{pct(c['stack_coverage'])}; in-use {fmt_bytes(c['in_use_before'])} → "
                      f"{fmt_bytes(c['in_use_after'])} ({c['allocator_source'] or '—'}); live "
                      f"{fmt_bytes(c['live_bytes'])} = {pct(c['live_coverage'])} of in-use Δ; footprint Δ "
                      f"{fmt_bytes(c['footprint_delta'], signed=True)} ({c['footprint_source'] or '—'})")
            if c["dropped"]:
                detail += "; dropped " + ", ".join(f"{k} {v:,}" for k, v in c["dropped"].items())
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
                     _seconds(c["captured_s"]), detail, "; ".join(notes) or "—"])
    return lines + table(["capture", "tracer", "target", "ended", "records", "captured", "coverage", "notes"],
                         "llllrrll", rows)


def _skipped(doc: dict[str, Any]) -> list[str]:
    lines = ["## Captures skipped", ""]
    if not doc["skipped"]:
        return lines + ["None: every capture in the folder was read in full.", ""]
    rows = [[s["path"], "partly (reported with what was read)" if s["partial"] else "no", s["reason"]]
            for s in doc["skipped"]]
    return lines + table(["file", "reported", "reason"], "lll", rows)
