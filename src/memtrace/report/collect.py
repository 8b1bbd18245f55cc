"""Find what is in a report folder and turn each capture into one compact, JSON-ready entry.

One pass over each capture, through its tracer's analyzer (``memtrace.analyze.<tracer>``); the
analyzer's summary is reduced at once to an entry bounded by the number of distinct stacks (top
stacks, per-family totals), so a folder of large captures never holds events in memory.  A
capture that cannot be read, or whose tracer has no analyzer in this memtrace, becomes a
*skipped* entry with its reason -- never an exception out of the report.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

from memtrace import tracers
from memtrace.analyze.families import FamilyRules
from memtrace.capture import CaptureError, CaptureInfo, Record, RecordType, damage_at, read_records
from memtrace.files import special_kind
from memtrace.report.chapters import TOP, chapter_of
from memtrace.report.processes import process_of

CAPTURE_SUFFIX = ".mtc"


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
    # Named as a capture or document but a FIFO, device, socket or broken link: never opened (a
    # FIFO would block the report for ever), listed as skipped with what it is.
    unreadable: list[tuple[Path, str]] = field(default_factory=list)



def discover(folder: Path) -> Found:
    """Captures (``*.mtc``) and census/jetsam JSON documents under ``folder``, sorted for stable output."""
    found = Found()
    for p in sorted(folder.rglob("*")):
        name = p.name.lower()
        if name.endswith(CAPTURE_SUFFIX):
            kind = found.captures
        elif name.endswith(".json") and name.startswith("census"):
            kind = found.census
        elif name.endswith(".json") and name.startswith("jetsam"):
            kind = found.jetsam
        else:
            continue
        try:
            mode = p.stat().st_mode
        except OSError as e:
            found.unreadable.append((p, f"cannot be read: {e.strerror or e}"))
            continue
        if stat.S_ISREG(mode):
            kind.append(p)
        elif not (stat.S_ISDIR(mode) and not p.is_symlink()):      # a folder named x.mtc: walked into
            what = special_kind(mode) or "not a regular file"
            found.unreadable.append((p, f"not a regular file ({what}); not read"))
    return found


def load_document(path: Path, kind: str) -> tuple[dict[str, Any] | None, str | None]:
    """A census/jetsam JSON document, or the reason it cannot be used."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"not a readable JSON document: {str(e).splitlines()[0]}"
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        return None, f'not a {kind} document (no top-level "kind": "{kind}")'
    from importlib import import_module

    problem = import_module(f"memtrace.analyze.{kind}").document_problem(doc)
    if problem:
        return None, f"not a valid {kind} document: {problem}"
    return doc, None


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def analyze_capture(path: Path, root: Path, rules: FamilyRules, top: int = TOP,
                    on_summary: Callable[[Path, Any, Any], None] | None = None
                    ) -> tuple[dict[str, Any] | None, Skipped | None]:
    """(entry, skipped): an entry when anything could be read; skipped says why not, or that it is partial.

    ``on_summary(path, tracer, summary)`` sees the full summary before it is reduced (report.html's
    flame graphs are made there, so no capture is read twice)."""
    rel = _rel(path, root)
    info = CaptureInfo(path)
    records = read_records(path, info)
    try:
        first = next(records, None)
    except CaptureError as e:
        return None, Skipped(rel, _strip_path(str(e), path))
    if first is None:
        why = (info.problem if info.truncated or info.n_skipped else None) or "empty capture (header only, no records)"
        return None, Skipped(rel, why)
    if first.type != RecordType.META:
        why = f" ({info.problem})" if info.n_skipped else ": not a memtrace capture"
        return None, Skipped(rel, f"first record is {first.type.name}, not META{why}")
    tracer = str(first.body.get("tracer") or "?")
    target = (first.body.get("target") or {}).get("label") or "?"
    tracer_entry = tracers.get(tracer)
    if tracer_entry is None:
        # A capture from a tracer this memtrace does not have: listed with the reason, and the
        # rest of the folder is still reported.
        records.close()
        return _bare_entry(rel, tracer, target, first.body), Skipped(rel, f"tracer {tracer!r} has no analyzer "
                                                                          f"in this memtrace")
    last = [first]
    try:
        summary = tracer_entry.summarize(_chain(first, records, last))
        entry = chapter_of(tracer_entry).entry(summary, rel, rules, top)
        if on_summary is not None:
            on_summary(info.path, tracer_entry, summary)
    except CaptureError as e:       # agent records that do not decode: nothing of it is reported
        return None, Skipped(rel, damage_at(last[0], e))
    problem = info.problem
    # Cut off, damaged, never closed or stopped early: reported with what was read, and said so.
    cut = info.truncated or not info.ended or bool(info.stopped)
    entry.update({"path": rel, "tracer": tracer, "target": entry.get("target") or target,
                  "records": info.records, "truncated": cut})
    if last[0].type == RecordType.END:      # the processes it made (report.processes)
        entry["process"] = process_of(last[0].body)
    if problem is None:
        return entry, None
    if cut:
        entry["truncation"] = problem
    which = "before it" if info.truncated else "read"
    return entry, Skipped(rel, f"{problem}; reported with the {info.records} records {which}", partial=True)


def _chain(first: Record, rest: Iterator[Record], last: list[Record]) -> Iterator[Record]:
    for record in chain((first,), rest):
        last[0] = record            # the record being analyzed, to name it if it is damaged
        yield record


def _strip_path(msg: str, path: Path) -> str:
    # CaptureError messages start with the path; the skipped table already names the file.
    prefix = f"{path}: "
    return msg[len(prefix):] if msg.startswith(prefix) else msg


def _bare_entry(rel: str, tracer: str, target: str, meta: dict[str, Any]) -> dict[str, Any]:
    return {"path": rel, "tracer": tracer, "target": target, "analyzed": False,
            "window_s": (meta.get("options") or {}).get("window")}
