"""The report's "Processes and their children": each traced program with the processes it made
(fork, vfork/posix_spawn + exec, its own exec), how each ended and the capture that traced it
(``--follow-children``), nested as they were made -- as ``memtrace show`` prints them.

A capture's entry carries ``process`` (:func:`process_of`, from its END record); the tree is built
from the entries alone (:func:`trees`), so report.json and REPORT.md say the same.  A child capture's
figures also count under its target (its META names the parent's target label); here it is placed
under the process that made it.
"""

from __future__ import annotations

import posixpath
from typing import Any

from memtrace.reporters.markdown import code, text
from memtrace.units import fmt_bytes

MAX_DEPTH = 16          # a tree deeper than this is cut (a process that keeps exec'ing itself)


def process_of(end: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a capture's END says about its process: pid, the processes it made, the image it exec'd."""
    if not isinstance(end, dict):
        return None
    children = [c for c in end.get("children") or [] if isinstance(c, dict)]
    exec_info = (end.get("evidence") or {}).get("exec") if isinstance(end.get("evidence"), dict) else None
    if isinstance(exec_info, dict) and exec_info.get("followed"):
        children.append({"pid": end.get("pid"), "origin": "exec", "path": exec_info.get("path"),
                         "capture": exec_info["followed"], "ended": "replaced it"})
    origin = end.get("origin") if isinstance(end.get("origin"), dict) else None
    out: dict[str, Any] = {"pid": end.get("pid"), "children": [
        {k: c.get(k) for k in ("pid", "ppid", "origin", "path", "capture", "ended", "reason") if c.get(k) is not None}
        for c in children]}
    if end.get("children_not_listed"):
        out["children_not_listed"] = end["children_not_listed"]
    if origin is not None and origin.get("parent_capture"):
        out["parent_capture"] = origin["parent_capture"]
    return out


def trees(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One tree per capture that no other capture in the folder made, and only for those that
    made processes: {path, target, ended, pid, children: [{pid, origin, path, ended, reason,
    capture (its path in the folder, when that capture was read), figures, children: [...]}]}."""
    by_path = {e["path"]: e for e in entries if isinstance(e.get("path"), str)}

    def node(entry: dict[str, Any], depth: int) -> list[dict[str, Any]]:
        proc = entry.get("process") or {}
        folder = posixpath.dirname(entry["path"])
        made = []
        for c in proc.get("children") or []:
            item = {k: v for k, v in c.items() if k != "capture"}
            rel = posixpath.join(folder, c["capture"]) if c.get("capture") else None
            child = by_path.get(rel) if rel is not None else None
            if child is not None:
                if "ended" not in item and child.get("ended"):
                    item["ended"] = child["ended"]      # still running when the parent's END was written
                item["capture"] = rel
                item["figures"] = _figures(child)
                item["children"] = node(child, depth + 1) if depth < MAX_DEPTH else []
            made.append(item)
        return made

    out = []
    for e in entries:
        proc = e.get("process") or {}
        parent = proc.get("parent_capture")
        if parent and posixpath.join(posixpath.dirname(e["path"]), parent) in by_path:
            continue            # placed under the process that made it
        children = node(e, 0)
        if children:
            out.append({"path": e["path"], "target": e.get("target"), "ended": e.get("ended"),
                        "pid": proc.get("pid"), "children": children,
                        **({"children_not_listed": proc["children_not_listed"]}
                           if proc.get("children_not_listed") else {})})
    return out


def _figures(entry: dict[str, Any]) -> str | None:
    if isinstance(entry.get("gross_bytes"), int) and isinstance(entry.get("alloc_calls"), int):
        return f"{entry['tracer']}: {fmt_bytes(entry['gross_bytes'])} in {entry['alloc_calls']:,} calls"
    return None


def markdown(processes: list[dict[str, Any]]) -> list[str]:
    if not processes:
        return []
    lines = ["## Processes and their children", "",
             "Each traced program with the processes it made, as they were made; a followed one (--follow-children) "
             "links its capture, whose figures also count under the program's target above.", ""]
    for t in processes:
        lines.append(f"- {code(t['path'])} ({text(t.get('target') or '?')}, pid {t.get('pid')}): "
                     f"{text(t.get('ended') or '?')}")
        lines += _children(t["children"], 1)
        if t.get("children_not_listed"):
            lines.append(f"  - … and {t['children_not_listed']:,} more (listed in the capture's WARNING records)")
    return [*lines, ""]


def _children(children: list[dict[str, Any]], depth: int) -> list[str]:
    lines = []
    pad = "  " * depth
    for c in children:
        what = f"pid {c.get('pid')} {text(c.get('origin') or '?')}" + (f" {code(c['path'])}" if c.get("path") else "")
        status = text(c.get("ended") or "not followed (it ran untraced)")
        if c.get("capture"):
            where = f" → {code(c['capture'])}" + (f" ({text(c['figures'])})" if c.get("figures") else "")
        elif c.get("ended"):
            where = " (no capture" + (f": {text(c['reason'])}" if c.get("reason") and c.get("ended") == "not-followed"
                                      else "") + ")"
        else:
            where = ""
        lines.append(f"{pad}- {what}: {status}{where}")
        lines += _children(c.get("children") or [], depth + 1)
    return lines
