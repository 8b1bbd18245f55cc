"""The IOSurface chapter: surfaces by stack and by format; the IOSurface-vs-malloc finding."""

from __future__ import annotations

from typing import Any

from memtrace.analyze.families import FamilyRules
from memtrace.report.chapters import (
    TOP,
    BaseChapter,
    Cell,
    Column,
    Lines,
    Row,
    add,
    family_rows,
    frames_cell,
    merge_families,
)
from memtrace.reporters.markdown import cell, table
from memtrace.units import fmt_bytes


def _created(r: Row) -> str:
    return "not traced" if r["iosurface_bytes"] is None else \
        f"{fmt_bytes(r['iosurface_bytes'])} ({r['iosurface_surfaces']:,} surfaces)"


class IOSurfaceChapter(BaseChapter):
    name = "iosurface"
    panorama_place = 10
    panorama_columns = (Column("IOSurface created", "r", 10, _created),)
    panorama_legend = "IOSurface = surfaces created"

    def panorama(self, agg: Any) -> Row:
        return {"iosurface_bytes": agg["bytes"] if agg else None,
                "iosurface_surfaces": agg["surfaces"] if agg else None}

    def families_line(self, agg: Any) -> list[str]:
        if not agg or not agg["families"]:
            return []
        return ["IOSurface: " + " · ".join(f"{f['family']} {fmt_bytes(f['bytes'])}"
                                           for f in agg["families"][:3] if f.get("bytes"))]

    def family_rows(self, agg: Any) -> list[list[Cell]]:
        return [["IOSurface", f["family"], fmt_bytes(f["bytes"]), f"{f['count']:,}", "—", "—"]
                for f in agg["families"]] if agg else []

    def entry(self, summary: Any, rel: str, rules: FamilyRules, top: int) -> dict[str, Any]:
        j: dict[str, Any] = summary.to_json(capture=rel, top=top)
        j["analyzed"] = True
        j.pop("surface_list", None)          # one row per surface: not needed, and unbounded
        # Families of surface stacks too: the IOSurface half of a business fingerprint.
        fam: dict[str, dict[str, int]] = {}
        for row in j.get("by_stack") or []:
            name = rules.classify(row.get("frames") or [])
            f = fam.setdefault(name, {"bytes": 0, "count": 0})
            f["bytes"] += int(row.get("bytes") or 0)
            f["count"] += int(row.get("count") or 0)
            row["family"] = name
        j["families"] = family_rows(fam)
        return j

    def aggregate(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
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
                out["held_at_end"] = held if out["held_at_end"] is None else add(out["held_at_end"], held)
            merge_families(fam, e.get("families") or [])
        out["by_stack"].sort(key=lambda r: -int(r.get("bytes") or 0))
        out["by_stack"] = out["by_stack"][:TOP]
        out["families"] = family_rows(fam)
        return out

    def findings(self, targets: list[dict[str, Any]], chapters: Lines) -> list[dict[str, Any]]:
        two = []
        for t in targets:
            s, m = self.own(t), chapters.heap(t)
            if s and s["bytes"] and m:
                two.append({"target": t["target"], "iosurface_bytes": s["bytes"], "surfaces": s["surfaces"],
                            "malloc_live_bytes": m["live_bytes"], "malloc_gross_bytes": m["gross_bytes"],
                            "text": f"{t['target']}: {s['surfaces']:,} surfaces, {fmt_bytes(s['bytes'])} of "
                                    f"IOSurface memory vs {fmt_bytes(m['live_bytes'])} malloc live at end "
                                    f"({fmt_bytes(m['gross_bytes'])} gross)"})
        if not two:
            return []
        return [{"kind": "iosurface-vs-malloc", "title": "IOSurface and malloc are two worlds",
                 "text": "Kernel (IOKit) surfaces are large and persistent; malloc is small, frequent, "
                         "churn-dominated.", "items": two}]

    def markdown(self, targets: list[dict[str, Any]]) -> list[str]:
        ss = [t for t in targets if self.own(t)]
        if not ss:
            return []
        lines = ["## IOSurface", ""]
        for t in ss:
            s = self.own(t)
            lines += [f"### {cell(t['target'])}", "", f"{s['surfaces']:,} surfaces created, {fmt_bytes(s['bytes'])}."
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
