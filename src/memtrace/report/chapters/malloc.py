"""The malloc chapter: churn vs net, size tiers, the peak and what held it, temporary allocations,
live and top stacks; the churn and family findings."""

from __future__ import annotations

from typing import Any

from memtrace.analyze.families import FamilyRules
from memtrace.analyze.leaks import examined_text, leak_no_stack, skipped_text
from memtrace.capture import NO_STACK
from memtrace.layout import PSEUDO_STACKS
from memtrace.report.chapters import (
    TOP,
    UNSTACKED,
    BaseChapter,
    Cell,
    Column,
    Lines,
    Row,
    family_rows,
    frames_cell,
    frames_key,
    merge_families,
    where,
)
from memtrace.reporters.markdown import cell, table
from memtrace.reporters.markdown import lines as cell_lines
from memtrace.units import fmt_bytes, fmt_pct, fmt_seconds, plural

TIER_LABELS = ("≤ 256 B", "257 B–1 KB", "1–4 KB", "4–8 KB", "8–64 KB", "> 64 KB")
LEAKS_SHOWN = 5          # leaked stacks listed per capture in the Leaks chapter


# ---- the panorama's malloc columns, from the fields MallocChapter.panorama puts in a row ----------

def _gross(r: Row) -> Cell:
    if r.get("not_measurable"):
        return f"not measurable ({r['not_measurable']})"
    if "malloc_gross_bytes" not in r:
        return "not traced"
    # Several captures of one target: one line each, side by side in the cell.
    return cell_lines(f"{fmt_bytes(x['malloc_gross_bytes'])} / {fmt_seconds(x['captured_s'])} "
                 f"(window {fmt_seconds(x['window_s'])}) · {x['malloc_calls']:,} calls"
                 for x in r.get("malloc_runs") or [r])


def _net(r: Row) -> Cell:
    if r.get("not_measurable") or "malloc_gross_bytes" not in r:
        return "—"
    return cell_lines(f"in-use {fmt_bytes(x['in_use_delta'], signed=True)} · live {fmt_bytes(x['live_bytes'])} "
                 f"· {x['survivors']:,} survivors" for x in r.get("malloc_runs") or [r])


def _coverage(r: Row) -> Cell:
    return "—" if r.get("stack_coverage") is None else f"stacks {fmt_pct(r['stack_coverage'])}" + (
        f" · live {fmt_pct(r['live_coverage'])}" if r.get("live_coverage") is not None else "")


class MallocChapter(BaseChapter):
    name = "malloc"
    panorama_place = 60              # after the dominant families, as report.json has always had them
    panorama_columns = (Column("malloc gross / time · calls", "r", 20, _gross), Column("net change", "r", 30, _net),
                        Column("coverage", "l", 70, _coverage))
    panorama_legend = ("malloc gross = allocation pressure; in-use Δ (allocator statistics), live at end and "
                       "survivors = net holding")
    leak_headings = ("malloc leaked", "malloc still reachable")
    leak_legend = ("malloc: the --leaks scan (a conservative reachability scan in the target, as valgrind "
                   "memcheck's and LeakSanitizer's): leaked = definitely lost (no pointer from live memory -- "
                   "threads' stacks and registers, modules' data, TLS, mappings that are not the allocator's "
                   "heap -- nor from any other block) + indirectly lost (pointed at only from lost blocks), "
                   "cycles included; what valgrind --leak-check=full counts as lost.")

    # ---- the report's shared sections --------------------------------------------------------

    def panorama(self, agg: Any) -> Row:
        if not agg:
            return {}
        # One entry per capture, side by side; the row's own figures are the last capture's.
        runs = [{"path": r["path"], "malloc_gross_bytes": r["gross_bytes"], "malloc_calls": r["alloc_calls"],
                 "captured_s": r["captured_s"], "window_s": r["window_s"],
                 "in_use_delta": r["in_use_delta"], "live_bytes": r["live_bytes"],
                 "survivors": r["live_count"], "stack_coverage": r["stack_coverage"],
                 "live_coverage": r["live_coverage"]} for r in agg["runs"]]
        return {**{k: v for k, v in runs[-1].items() if k != "path"}, f"{self.name}_runs": runs}

    def families_line(self, agg: Any) -> list[str]:
        """The dominant families, one line per capture (captures are compared, never added up)."""
        if not agg:
            return []
        runs = [" · ".join([f"{f['family']} {fmt_bytes(f['bytes'])}" for f in r["families"]
                            if f["family"] != UNSTACKED and f["bytes"] > 0][:3]) for r in agg["runs"]]
        return [r or "—" for r in runs] if any(runs) else []

    def family_rows(self, agg: Any) -> list[list[Cell]]:
        rows: list[list[Cell]] = []
        for r in agg["runs"] if agg else []:
            line = self.name if agg["captures"] == 1 else f"{self.name} ({r['path']})"
            rows += [[line, f["family"], fmt_bytes(f["bytes"]), f"{f['count']:,}",
                      fmt_bytes(f["live_bytes"]), f"{f['live_count']:,}"] for f in r["families"]]
        return rows

    def measured_nothing(self, agg: Any) -> bool:
        return all(r["alloc_calls"] == 0 for r in agg["runs"])

    def heap(self, agg: Any) -> Row | None:
        return {"live_bytes": agg["live_bytes"], "gross_bytes": agg["gross_bytes"]}

    def _scans(self, t: Row, agg: Any) -> list[tuple[str, Row]]:
        """(label, leak scan) for every capture of the target that ran one (--leaks)."""
        if not agg:
            return []
        return [(t["target"] if agg["captures"] == 1 else f"{t['target']} ({r['path']})", r["leaks"])
                for r in agg["runs"] if r.get("leaks")]

    def leak_cells(self, agg: Any) -> tuple[list[Cell], bool]:
        scans = [lk for _, lk in self._scans({"target": ""}, agg)]
        leaked = cell_lines(f"{lk['leaked']['blocks']:,} blocks, {fmt_bytes(lk['leaked']['bytes'])}"
                       + ("" if lk["scan"]["complete"] else " (scan incomplete)") for lk in scans) or (
            "not scanned (no --leaks)" if agg else "not traced")
        reach = cell_lines(f"{lk['reachable']['blocks']:,} blocks, {fmt_bytes(lk['reachable']['bytes'])}"
                      for lk in scans) or "—"
        return [leaked, reach], bool(scans)

    def leak_items(self, t: Row, agg: Any) -> list[Row]:
        items = []
        for label, lk in self._scans(t, agg):
            g = lk["leaked"]
            if not g["blocks"]:
                continue
            top = g["by_stack"][0] if g["by_stack"] else None
            at = f", most at {where(top['frames'])} ({top['blocks']:,} blocks, {fmt_bytes(top['bytes'])})" if top else ""
            items.append({"target": label, "line": self.name, "count": g["blocks"], "bytes": g["bytes"],
                          "text": f"{label}: malloc leaked {g['blocks']:,} blocks, {fmt_bytes(g['bytes'])}{at}"})
        return items

    def leak_details(self, t: Row, agg: Any) -> list[str]:
        out: list[str] = []
        for label, lk in self._scans(t, agg):
            if lk["leaked"]["by_stack"]:
                out += [f"### {cell(label)}: leaked malloc blocks, by allocating stack", ""]
                out += table(["bytes", "blocks", "frames (innermost first)"], "rrl",
                             [[fmt_bytes(r["bytes"]), f"{r['blocks']:,}",
                               frames_cell(r["frames"]) if r["frames"] else leak_no_stack(r)]
                              for r in lk["leaked"]["by_stack"][:LEAKS_SHOWN]])
            if lk.get("definitely_lost") is not None:
                out += [f"{cell(label)}: definitely lost {lk['definitely_lost']['blocks']:,} blocks "
                        f"({fmt_bytes(lk['definitely_lost']['bytes'])}), indirectly lost "
                        f"{lk['indirectly_lost']['blocks']:,} ({fmt_bytes(lk['indirectly_lost']['bytes'])}), "
                        f"possibly lost {lk['possibly_lost']['blocks']:,} "
                        f"({fmt_bytes(lk['possibly_lost']['bytes'])}, not counted as leaked). "
                        f"Examined: {examined_text(lk['scan'])}.", ""]
            scan = lk["scan"]
            skipped = skipped_text({k: v for k, v in (scan.get("skipped") or {}).items()
                                    if k != "candidates_over_capacity"}, fmt_bytes)
            note = (f"Scan at {scan['when']}: {plural(scan['threads_stopped'] or 0, 'thread')} stopped"
                    + (f", {scan['threads_not_stopped']} could not be" if scan.get("threads_not_stopped") else "")
                    + f"; {fmt_bytes(scan['root_bytes'])} of roots and {fmt_bytes(scan['block_bytes'])} of blocks read"
                    + (f"; world stopped {scan['world_stopped_ms']:,} ms, scanning {scan.get('scan_ms') or 0:,} ms"
                       if scan.get("world_stopped_ms") is not None else "")
                    + ("" if scan["complete"] else "; INCOMPLETE: the time budget ran out, leaked means possibly leaked")
                    + ("; not read: " + ", ".join(skipped) if skipped else "") + ".")
            out += [f"{cell(label)}: {note}", ""]
        return out

    # ---- its own chapter -----------------------------------------------------------------------

    def entry(self, summary: Any, rel: str, rules: FamilyRules, top: int) -> dict[str, Any]:
        """The summary plus per-family totals, computed once per distinct stack."""
        s = summary
        j: dict[str, Any] = s.to_json(capture=rel, top=top)
        j["analyzed"] = True
        fam: dict[str, dict[str, Any]] = {}
        # The aggregate core counts blocks without a stack (nested calls, a full stack table) outside
        # the stacked bytes: they belong to the unstacked row, as blocks below the threshold do.
        stackless = set(PSEUDO_STACKS) if s.aggregates else {NO_STACK}
        for sid, st in s.stack_stats.items():
            stacked = sid not in stackless
            name = rules.classify(s.stack_frames(sid)) if stacked else UNSTACKED
            f = fam.get(name)
            if f is None:
                f = fam[name] = {"bytes": 0, "count": 0, "live_bytes": 0, "live_count": 0, "stacks": 0}
            f["bytes"] += round(st.est_bytes) if stacked else 0
            f["count"] += round(st.est_count) if stacked else 0
            f["live_bytes"] += round(st.live_est_bytes)
            f["live_count"] += st.live_count
            f["stacks"] += 1 if stacked else 0
        # Bytes no stack covers (below the stack threshold, unsampled): their own row, so the family
        # table adds up to the gross bytes instead of silently losing them.
        unstacked = j["gross_bytes"] - j["coverage"]["estimated_bytes_with_sampling"]
        if unstacked > 0 or UNSTACKED in fam:
            f = fam.setdefault(UNSTACKED, {"bytes": 0, "count": 0, "live_bytes": 0, "live_count": 0, "stacks": 0})
            f["bytes"] += max(unstacked, 0)
            f["count"] += max(j["alloc_calls"] - sum(v["count"] for k, v in fam.items() if k != UNSTACKED), 0)
        j["families"] = family_rows(fam)
        extra = [*((j.get("peak") or {}).get("by_stack") or []), *((j.get("temporary") or {}).get("by_stack") or [])]
        for row in j["top_stacks"] + j["live_by_stack"] + extra:
            if row["stack_id"] == NO_STACK:
                row["unstacked"] = True
                row["family"] = UNSTACKED
            else:
                row["family"] = rules.classify(row["frames"])
        return j

    def aggregate(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """One run per capture, side by side: several captures of a target are compared, never
        added up (a 60 s window and another 60 s window are not one 120 s window).  The top
        level repeats the last run (by path) for readers of a single capture; ``runs`` has all."""
        runs = []
        for e in sorted(entries, key=lambda e: e.get("path") or ""):
            run = self._run(e)
            run["path"] = e.get("path")
            run["leaks"] = e.get("leaks")
            runs.append(run)
        return {**runs[-1], "captures": len(runs), "runs": runs}

    def _run(self, e: dict[str, Any]) -> dict[str, Any]:
        entries = [e]
        m: dict[str, Any] = {"gross_bytes": 0, "alloc_calls": 0, "captured_s": 0.0,
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
            merge_families(fam, e["families"])
            top += e["top_stacks"]
            live += e["live_by_stack"]
        m["captured_s"] = round(m["captured_s"], 3)
        g, d = m["gross_bytes"], m["in_use_delta"]
        m["stack_coverage"] = round(m["estimated_bytes"] / g, 4) if g else None
        m["live_coverage"] = round(m["live_bytes"] / d, 4) if d and d > 0 else None
        # Churn: gross allocation over net holding.  No ratio when in-use did not grow (it is
        # "all churn"), so a shrinking heap never reads as a tiny or negative ratio.
        m["churn_ratio"] = round(g / d, 1) if d and d > 0 else None
        m["families"] = family_rows(fam)
        m["top_stacks"] = merge_stacks(top)
        m["live_by_stack"] = merge_stacks(live)
        # The run's peak (one instant) and its temporaries, as the capture has them.
        m["peak"] = e.get("peak")
        temp = e.get("temporary")
        m["temporary"] = None if not temp else {
            "calls": temp["calls"], "bytes": temp["bytes"],
            "by_stack": merge_stacks([{**r, "count": r["calls"]} for r in temp["by_stack"]])}
        return m

    def findings(self, targets: list[dict[str, Any]], chapters: Lines) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        churn = [(self.label(t, m), m) for t, m in self.runs_of(targets) if t["measurable"] and m["gross_bytes"] > 0]
        if churn:
            ranked = sorted(churn, key=lambda tm: (-(tm[1]["churn_ratio"] or float("inf")), tm[0]))
            # Targets whose heap did not grow at all are the purest churn: they rank first.
            items = []
            for label, m in ranked:
                ratio = f"churn {m['churn_ratio']:,.1f}×" if m["churn_ratio"] else "no net growth: all churn"
                items.append({"target": label, "gross_bytes": m["gross_bytes"], "alloc_calls": m["alloc_calls"],
                              "in_use_delta": m["in_use_delta"], "live_bytes": m["live_bytes"],
                              "survivors": m["live_count"], "churn_ratio": m["churn_ratio"],
                              "text": f"{label}: {fmt_bytes(m['gross_bytes'])} gross in {m['alloc_calls']:,} "
                                      f"calls vs allocator in-use {fmt_bytes(m['in_use_delta'], signed=True)}, "
                                      f"{fmt_bytes(m['live_bytes'])} live at end in {m['live_count']:,} blocks "
                                      f"({ratio})"})
            out.append({"kind": "churn", "title": "malloc churn ≫ net growth",
                        "text": f"Allocation pressure and real holding are two measures: the largest churn is "
                                f"{items[0]['text']}.", "items": items})
        dom = []
        for t, m in self.runs_of(targets):
            label = self.label(t, m)
            fams = [f for f in m["families"] if f["family"] != UNSTACKED and f["bytes"] > 0]
            attributed = sum(f["bytes"] for f in fams)
            if not fams or not attributed:
                continue
            f = fams[0]
            share = f["bytes"] / attributed
            dom.append({"target": label, "family": f["family"], "bytes": f["bytes"],
                        "attributed_bytes": attributed, "share": round(share, 4),
                        "text": f"{label}: {f['family']} — {fmt_bytes(f['bytes'])} of {fmt_bytes(attributed)} "
                                f"stack-attributed gross bytes ({fmt_pct(share)})"})
        if dom:
            out.append({"kind": "dominant-family", "title": "stack signature = business fingerprint",
                        "text": "The family with the most stack-attributed malloc bytes, per target.", "items": dom})
        return out

    def markdown(self, targets: list[dict[str, Any]]) -> list[str]:
        runs = self.runs_of(targets)
        if not runs:
            return []
        lines = ["## malloc", "", "One row per capture: several captures of one target are shown side by side, "
                 "never added up.", "", "### Churn vs net", ""]
        rows = []
        for t, m in runs:
            label = self.label(t, m)
            if not t["measurable"]:
                rows.append([label, f"not measurable ({t['ended']})", *["—"] * 7])
                continue
            rows.append([label, fmt_bytes(m["gross_bytes"]), f"{m['alloc_calls']:,}",
                         f"{fmt_seconds(m['captured_s'])} (window {fmt_seconds(m['window_s'])})",
                         fmt_bytes(m["in_use_delta"], signed=True), fmt_bytes(m["live_bytes"]),
                         f"{m['live_count']:,}", "—" if m["churn_ratio"] is None else f"{m['churn_ratio']:,.1f}×",
                         fmt_bytes(m["footprint_delta"], signed=True)])
        lines += table(["target", "gross", "calls", "captured", "in-use Δ", "live at end", "survivors",
                        "churn (gross / in-use Δ)", "footprint Δ"], "lrrrrrrrr", rows)
        lines += ["### Size tiers (calls / bytes)", ""]
        rows = [[self.label(t, m), *(f"{x['calls']:,} / {fmt_bytes(x['bytes'])}" for x in m["tiers"])]
                for t, m in runs if t["measurable"]]
        lines += table(["target", *TIER_LABELS], "l" + "r" * len(TIER_LABELS), rows)
        lines += self._peak_and_temporary(runs)
        for title, key in (("Live by stack at window end", "live_by_stack"),
                           ("Top stacks by gross bytes", "top_stacks")):
            lines += [f"### {title}", ""]
            for t, m in runs:
                rows = [[fmt_bytes(r["bytes"]), f"{r['count']:,}", r["family"],
                         UNSTACKED if r.get("unstacked") else frames_cell(r["frames"])]
                        for r in m[key]]
                if rows:
                    lines += [f"**{cell(self.label(t, m))}**", ""]
                    lines += table(["bytes", "count", "family", "frames (innermost first)"], "rrll", rows)
        return lines

    def _peak_and_temporary(self, runs: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
        """Sections only captures from the aggregate core have (older ones carry neither figure)."""
        lines: list[str] = []
        peaks = [(self.label(t, m), m) for t, m in runs if t["measurable"] and m.get("peak")]
        if peaks:
            lines += ["### Peak of tracked live bytes", "",
                      "The high-water mark of the bytes in tracked blocks (at least the live threshold, or with a "
                      "stack) and which stacks held them at that instant.", ""]
            rows = [[label, fmt_bytes(p["bytes"]), f"{p['count']:,}",
                     "—" if p.get("t") is None else f"{p['t']:.3f} s", "yes" if p.get("exact", True) else "no"]
                    for label, m in peaks for p in [m["peak"]]]
            lines += table(["target", "peak", "blocks", "at", "exact"], "lrrrl", rows)
            for label, m in peaks:
                rows = [[fmt_bytes(r["bytes"]), f"{r['count']:,}", r.get("family", ""),
                         UNSTACKED if r.get("unstacked") else frames_cell(r["frames"])]
                        for r in m["peak"]["by_stack"]]
                if rows:
                    lines += [f"**{cell(label)}** at its peak", ""]
                    lines += table(["bytes", "blocks", "family", "frames (innermost first)"], "rrll", rows)
        temps = [(self.label(t, m), m) for t, m in runs if t["measurable"] and m.get("temporary")]
        if temps:
            lines += ["### Temporary allocations", "",
                      "Freed by the thread that made them before its next allocation (heaptrack's definition): "
                      "pure churn, candidates for reuse or the stack.", ""]
            rows = [[label, f"{tm['calls']:,}", fmt_bytes(tm["bytes"]),
                     fmt_pct(tm["calls"] / m["alloc_calls"]) if m["alloc_calls"] else "—"]
                    for label, m in temps for tm in [m["temporary"]]]
            lines += table(["target", "temporary calls", "bytes", "of allocation calls"], "lrrr", rows)
            for label, m in temps:
                rows = [[f"{r['count']:,}", fmt_bytes(r["bytes"]), r.get("family", ""),
                         UNSTACKED if r.get("unstacked") else frames_cell(r["frames"])]
                        for r in m["temporary"]["by_stack"]]
                if rows:
                    lines += [f"**{cell(label)}** temporaries by stack", ""]
                    lines += table(["calls", "bytes", "family", "frames (innermost first)"], "rrll", rows)
        return lines

    def runs_of(self, targets: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(target, run) for every malloc capture of every target, in order."""
        return [(t, m) for t in targets if self.own(t) for m in self.own(t)["runs"]]

    def label(self, t: dict[str, Any], m: dict[str, Any]) -> str:
        """The target's name, and the capture's path when the target has several."""
        return t["target"] if self.own(t)["captures"] == 1 else f"{t['target']} ({m['path']})"

    def calibration(self, e: dict[str, Any]) -> dict[str, Any]:
        cov = e.get("coverage")
        if not cov:
            return {}
        a, f = cov.get("allocator") or {}, cov.get("footprint") or {}
        return {"gross_bytes": e["gross_bytes"], "stacked_bytes": cov["stacked_bytes"],
                "stack_coverage": cov["stack_coverage"], "estimated_coverage": cov["estimated_coverage"],
                "in_use_before": a.get("in_use_before"), "in_use_after": a.get("in_use_after"),
                "in_use_delta": a.get("in_use_delta"), "allocator_source": a.get("source"),
                "live_bytes": e["live"]["bytes"], "live_coverage": cov.get("live_coverage"),
                "footprint_delta": f.get("delta"), "footprint_source": f.get("source"),
                "dropped": {k: v for k, v in (e.get("dropped") or {}).items() if v}}

    def calibration_text(self, c: dict[str, Any]) -> str | None:
        if c.get("gross_bytes") == 0:
            return "no allocation captured"
        if "gross_bytes" not in c:
            return None
        detail = (f"stacks {fmt_bytes(c['stacked_bytes'])} of {fmt_bytes(c['gross_bytes'])} = "
                  f"{fmt_pct(c['stack_coverage'])}; in-use {fmt_bytes(c['in_use_before'])} → "
                  f"{fmt_bytes(c['in_use_after'])} ({c['allocator_source'] or '—'}); live "
                  f"{fmt_bytes(c['live_bytes'])} = {fmt_pct(c['live_coverage'])} of in-use Δ; footprint Δ "
                  f"{fmt_bytes(c['footprint_delta'], signed=True)} ({c['footprint_source'] or '—'})")
        if c["dropped"]:
            detail += "; dropped " + ", ".join(f"{k} {v:,}" for k, v in c["dropped"].items())
        return detail


def merge_stacks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same symbolized stack from several captures (runs) of one target is one row."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = ("unstacked",) if r.get("unstacked") else frames_key(r["frames"])
        m = merged.get(key)
        if m is None:
            merged[key] = {"bytes": r["bytes"], "count": r["count"], "exact_bytes": r.get("exact_bytes", 0),
                           "family": r.get("family"), "frames": r["frames"],
                           **({"unstacked": True} if r.get("unstacked") else {})}
        else:
            m["bytes"] += r["bytes"]
            m["count"] += r["count"]
            m["exact_bytes"] += r.get("exact_bytes", 0)
    return sorted(merged.values(), key=lambda r: (-r["bytes"], str(frames_key(r["frames"]))))[:TOP]

