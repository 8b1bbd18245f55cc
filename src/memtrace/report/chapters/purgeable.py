"""The purgeable chapter: the transition matrix, callers per transition and stack; the held finding."""

from __future__ import annotations

from typing import Any

from memtrace.report.chapters import TOP, BaseChapter, Column, Lines, Row, add, arrow, frames_cell
from memtrace.reporters.markdown import cell, code, table, text
from memtrace.units import fmt_bytes

MATRIX = ("0->1", "1->0", "0->2", "2->0", "1->2", "2->1", "0->0", "1->1", "2->2")


def _held(r: Row) -> str:
    return "not traced" if r["purgeable_held_bytes"] is None else fmt_bytes(r["purgeable_held_bytes"])


class PurgeableChapter(BaseChapter):
    name = "purgeable"
    stack_tables = ("by_caller",)
    panorama_place = 20
    panorama_columns = (Column("purgeable held", "r", 40, _held),)
    panorama_legend = "purgeable held = VOLATILE/EMPTY bytes not counted in footprint"

    def panorama(self, agg: Any) -> Row:
        return {"purgeable_held_bytes": agg["held_bytes"] if agg else None}

    def aggregate(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"captures": len(entries), "transitions": {}, "transition_bytes": {}, "set_calls": 0,
                               "get_calls": 0, "created_purgeable": 0, "created_bytes": 0, "madvise": {},
                               "madvise_bytes": {}, "madvise_names": {}, "keep_current": 0, "by_caller": [],
                               "created_by": [], "framework_calls": {}, "events_dropped": 0}
        for e in entries:
            for key in ("transitions", "transition_bytes", "madvise", "madvise_bytes"):
                out[key] = add(out[key], e.get(key) or {})
            out["madvise_names"].update(e.get("madvise_names") or {})
            for key in ("set_calls", "get_calls", "created_purgeable", "created_bytes", "keep_current",
                        "events_dropped"):
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
        # phys_footprint, so this is memory the footprint does not show.
        held = tb.get("0->1", 0) + tb.get("0->2", 0) - tb.get("1->0", 0) - tb.get("2->0", 0)
        out["held_bytes"] = max(held, 0)
        out["held_formula"] = (f"0→1 {fmt_bytes(tb.get('0->1', 0))} + 0→2 {fmt_bytes(tb.get('0->2', 0))} − "
                               f"1→0 {fmt_bytes(tb.get('1->0', 0))} − 2→0 {fmt_bytes(tb.get('2->0', 0))}")
        out["by_caller"].sort(key=lambda r: (-int(r.get("count") or 0), str(r.get("caller"))))
        out["by_caller"] = out["by_caller"][:TOP * 2]
        return out

    def findings(self, targets: list[dict[str, Any]], chapters: Lines) -> list[dict[str, Any]]:
        held = []
        for t in targets:
            p = self.own(t)
            if p and p["held_bytes"] > 0:
                held.append({"target": t["target"], "held_bytes": p["held_bytes"], "formula": p["held_formula"],
                             "text": f"{t['target']}: {fmt_bytes(p['held_bytes'])} held VOLATILE/EMPTY at the end "
                                     f"({p['held_formula']})"})
        if not held:
            return []
        held.sort(key=lambda h: (-h["held_bytes"], h["target"]))
        return [{"kind": "purgeable-held", "title": "purgeable = held but not counted",
                 "text": "VOLATILE and EMPTY pages are not counted in phys_footprint: memory a footprint "
                         "reading does not show.", "items": held}]

    def markdown(self, targets: list[dict[str, Any]]) -> list[str]:
        ps = [t for t in targets if self.own(t)]
        if not ps:
            return []
        cols = [k for k in MATRIX if any(self.own(t)["transitions"].get(k) for t in ps)] or ["0->1", "1->0"]
        lines = ["## purgeable", "", "### Transition matrix (SET calls, old → new state: 0 NONVOLATILE, "
                 "1 VOLATILE, 2 EMPTY; 2→0 = stolen by the kernel, found on reacquire)", ""]
        rows = []
        for t in ps:
            p = self.own(t)
            tr, tb = p["transitions"], p["transition_bytes"]
            rows.append([t["target"], *(f"{tr.get(k, 0):,} ({fmt_bytes(tb.get(k, 0))})" for k in cols),
                         f"{p['set_calls']:,}", f"{p['get_calls']:,}",
                         f"{p['stolen']['count']:,} ({fmt_bytes(p['stolen']['bytes'])})",
                         f"{p['created_purgeable']:,} ({fmt_bytes(p['created_bytes'])})", fmt_bytes(p["held_bytes"])])
        lines += table(["target", *map(arrow, cols), "SET", "GET", "stolen 2→0", "created purgeable", "held"],
                       "l" + "r" * (len(cols) + 5), rows)
        for t in ps:
            p = self.own(t)
            if p.get("events_dropped"):
                lines += [f"{cell(t['target'])}: {int(p['events_dropped']):,} streamed calls came faster than the "
                          "agent's flush took them: counted in SET, GET and creation calls, but without an event "
                          "(transition, caller, bytes) below.", ""]
            lines += [f"### {cell(t['target'])}: callers, by transition and stack", ""]
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
                lines += ["Framework entries: " + ", ".join(f"{code(k)} ×{v:,}" for k, v in
                                                           sorted(p["framework_calls"].items())), ""]
            if p["madvise"]:
                mad = ", ".join(f"{text(p['madvise_names'].get(a) or 'advice ' + a)} ({text(a)}) ×{n:,}"
                                + (f" ({fmt_bytes(p['madvise_bytes'].get(a))})" if p["madvise_bytes"].get(a) else "")
                                for a, n in sorted(p["madvise"].items(), key=lambda kv: int(kv[0])))
                lines += [f"madvise (the separate reusable-page line, not purgeable transitions): {mad}.", ""]
        return lines
