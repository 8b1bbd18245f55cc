"""Find what is in a report folder and turn each capture into one compact, JSON-ready entry.

One pass over each capture, through its tracer's analyzer (``memtrace.analyze.<tracer>``); the
analyzer's summary is reduced at once to an entry bounded by the number of distinct stacks (top
stacks, per-family totals), so a folder of large captures never holds events in memory.  A
capture that cannot be read, or whose tracer has no analyzer in this memtrace, becomes a
*skipped* entry with its reason -- never an exception out of the report.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

from memtrace.analyze.families import FamilyRules
from memtrace.capture import NO_STACK, CaptureError, CaptureInfo, Record, RecordType, read_records

CAPTURE_SUFFIX = ".mtc"
TOP = 10
# Tracer name in META -> analyzer module.  Modules may not exist yet in this memtrace: the
# capture is then listed with the reason, and the rest of the folder is still reported.
ANALYZERS = {"malloc": "memtrace.analyze.malloc", "iosurface": "memtrace.analyze.iosurface",
             "purgeable": "memtrace.analyze.purgeable", "probe": "memtrace.analyze.probe",
             "fds": "memtrace.analyze.fds", "threads": "memtrace.analyze.threads"}
UNSTACKED = "(no stack: below the stack threshold)"


@dataclass
class Skipped:
    path: str
    reason: str
    partial: bool = False        # True: still reported with what was read (a truncated capture)


@dataclass
class Found:
    captures: list[Path] = field(default_factory=list)
    census: list[Path] = field(default_factory=list)
    jetsam: list[Path] = field(default_factory=list)


def discover(folder: Path) -> Found:
    """Captures (``*.mtc``) and census/jetsam JSON documents under ``folder``, sorted for stable output."""
    found = Found()
    for p in sorted(folder.rglob("*")):
        if not p.is_file():
            continue
        name = p.name.lower()
        if name.endswith(CAPTURE_SUFFIX):
            found.captures.append(p)
        elif name.endswith(".json") and name.startswith("census"):
            found.census.append(p)
        elif name.endswith(".json") and name.startswith("jetsam"):
            found.jetsam.append(p)
    return found


def load_document(path: Path, kind: str) -> tuple[dict[str, Any] | None, str | None]:
    """A census/jetsam JSON document, or the reason it cannot be used."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"not a readable JSON document: {str(e).splitlines()[0]}"
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        return None, f'not a {kind} document (no top-level "kind": "{kind}")'
    return doc, None


def _analyzer(tracer: str) -> tuple[Any | None, str | None]:
    name = ANALYZERS.get(tracer)
    if name is None:
        return None, f"tracer {tracer!r} has no analyzer in this memtrace"
    try:
        return importlib.import_module(name), None
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return None, f"tracer {tracer!r}: analyzer {name} is not in this memtrace"


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def analyze_capture(path: Path, root: Path, rules: FamilyRules, top: int = TOP
                    ) -> tuple[dict[str, Any] | None, Skipped | None]:
    """(entry, skipped): an entry when anything could be read; skipped says why not, or that it is partial."""
    rel = _rel(path, root)
    info = CaptureInfo(path)
    records = read_records(path, info)
    try:
        first = next(records, None)
    except CaptureError as e:
        return None, Skipped(rel, _strip_path(str(e), path))
    if first is None:
        why = info.truncation if info.truncated else "empty capture (header only, no records)"
        return None, Skipped(rel, why)
    if first.type != RecordType.META:
        return None, Skipped(rel, f"first record is {first.type.name}, not META: not a memtrace capture")
    tracer = str(first.body.get("tracer") or "?")
    target = (first.body.get("target") or {}).get("label") or "?"
    module, why = _analyzer(tracer)
    if module is None:
        records.close()
        return _bare_entry(rel, tracer, target, first.body), Skipped(rel, why or "no analyzer")
    try:
        summary = module.summarize(_chain(first, records))
        entry = _entry(tracer, summary, rel, rules, top)
    except CaptureError as e:
        return None, Skipped(rel, _strip_path(str(e), path))
    entry.update({"path": rel, "tracer": tracer, "target": entry.get("target") or target,
                  "records": info.records, "truncated": info.truncated})
    if info.truncated:
        entry["truncation"] = info.truncation
        return entry, Skipped(rel, f"{info.truncation}; reported with the {info.records} records before it",
                              partial=True)
    return entry, None


def _chain(first: Record, rest: Iterator[Record]) -> Iterator[Record]:
    return chain((first,), rest)


def _strip_path(msg: str, path: Path) -> str:
    # CaptureError messages start with the path; the skipped table already names the file.
    prefix = f"{path}: "
    return msg[len(prefix):] if msg.startswith(prefix) else msg


def _bare_entry(rel: str, tracer: str, target: str, meta: dict[str, Any]) -> dict[str, Any]:
    return {"path": rel, "tracer": tracer, "target": target, "analyzed": False,
            "window_s": (meta.get("options") or {}).get("window")}


def _entry(tracer: str, summary: Any, rel: str, rules: FamilyRules, top: int) -> dict[str, Any]:
    if tracer == "malloc":
        return malloc_entry(summary, rel, rules, top)
    j = summary.to_json(capture=rel)
    j["analyzed"] = True
    j.pop("surface_list", None)          # one row per surface: not needed, and unbounded
    if tracer == "iosurface":
        # Families of surface stacks too: the IOSurface half of a business fingerprint.
        fam: dict[str, dict[str, int]] = {}
        for row in j.get("by_stack") or []:
            name = rules.classify(row.get("frames") or [])
            f = fam.setdefault(name, {"bytes": 0, "count": 0})
            f["bytes"] += int(row.get("bytes") or 0)
            f["count"] += int(row.get("count") or 0)
            row["family"] = name
        j["families"] = _family_rows(fam)
    elif tracer == "purgeable":
        for row in j.get("by_caller") or []:
            row["family"] = rules.classify(row.get("frames") or [])
    elif tracer == "fds":
        for row in j["open_at_end"]["by_stack"]:
            row["family"] = rules.classify(row.get("frames") or [])
    elif tracer == "threads":
        for row in j["leaked"]["by_stack"] + j["running_at_end"]["by_stack"] + j["created_by_stack"]:
            row["family"] = rules.classify(row.get("frames") or [])
    return j


def _family_rows(fam: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = [{"family": k, **v} for k, v in fam.items()]
    rows.sort(key=lambda r: (-r["bytes"], r["family"]))
    return rows


def malloc_entry(s: Any, rel: str, rules: FamilyRules, top: int) -> dict[str, Any]:
    """The malloc summary plus per-family totals, computed once per distinct stack."""
    j = s.to_json(capture=rel, top=top)
    j["analyzed"] = True
    fam: dict[str, dict[str, Any]] = {}
    for sid, st in s.by_stack.items():
        name = UNSTACKED if sid == NO_STACK else rules.classify(s.stack_frames(sid))
        f = fam.get(name)
        if f is None:
            f = fam[name] = {"bytes": 0, "count": 0, "live_bytes": 0, "live_count": 0, "stacks": 0}
        f["bytes"] += round(st.est_bytes) if sid != NO_STACK else 0
        f["count"] += round(st.est_count) if sid != NO_STACK else 0
        f["live_bytes"] += round(st.live_est_bytes)
        f["live_count"] += st.live_count
        f["stacks"] += 1 if sid != NO_STACK else 0
    # Bytes no stack covers (below the stack threshold, unsampled): their own row, so the family
    # table adds up to the gross bytes instead of silently losing them.
    unstacked = j["gross_bytes"] - j["coverage"]["estimated_bytes_with_sampling"]
    if unstacked > 0 or UNSTACKED in fam:
        f = fam.setdefault(UNSTACKED, {"bytes": 0, "count": 0, "live_bytes": 0, "live_count": 0, "stacks": 0})
        f["bytes"] += max(unstacked, 0)
        f["count"] += max(j["alloc_calls"] - sum(v["count"] for k, v in fam.items() if k != UNSTACKED), 0)
    j["families"] = _family_rows(fam)
    for row in j["top_stacks"] + j["live_by_stack"]:
        if row["stack_id"] == NO_STACK:
            row["frames"] = [UNSTACKED]
            row["family"] = UNSTACKED
        else:
            row["family"] = rules.classify(row["frames"])
    return j
