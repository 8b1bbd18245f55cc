"""Two captures (or two folders of captures) compared: by family and by stack, for each view.

Captures of two folders are paired by target and tracer.  Every change is NEW minus BASE;
rows come largest change first (by magnitude), and a stack or family present on one side only
is compared with zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace.analyze.families import FamilyRules, load_rules
from memtrace.capture import FILE_NAME
from memtrace.errors import InputError
from memtrace.frames import Frame
from memtrace.report.chapters import chapter_of
from memtrace.views import Loaded, load
from memtrace.views.profile import profile

CAPTURE_SUFFIX = ".mtc"


def captures_in(path: Path) -> list[Path]:
    """A capture file, a capture folder, or a folder of captures (a report folder)."""
    if path.is_file():
        return [path]
    if (path / FILE_NAME).is_file():
        return [path / FILE_NAME]
    if path.is_dir():
        found = sorted(p for p in path.rglob(f"*{CAPTURE_SUFFIX}") if not p.is_dir())
        # A FIFO or device named as a capture is said, never dropped unsaid (nor opened: it blocks).
        for p in [path / FILE_NAME, *found]:
            if (p.exists() or p.is_symlink()) and not p.is_file():
                raise InputError(f"{p}: not a regular file (a capture is a file, not a FIFO, device or socket)")
        if not found:
            raise InputError(f"{path}: no capture in this folder")
        return found
    if path.exists():
        raise InputError(f"{path}: not a regular file (a capture is a file, not a FIFO, device or socket)")
    raise InputError(f"{path}: no such capture or folder")


@dataclass
class Side:
    loaded: Loaded
    entry: dict[str, Any]

    @property
    def key(self) -> tuple[str, str]:
        return (self.entry.get("target") or "?", self.loaded.tracer.name)


def _side(path: Path, rules: FamilyRules) -> Side:
    loaded = load(path)
    entry = chapter_of(loaded.tracer).entry(loaded.summary, str(loaded.path), rules, 10)
    return Side(loaded, entry)


def _change(base: float, new: float) -> dict[str, Any]:
    return {"base": round(base), "new": round(new), "delta": round(new - base)}


def _families(a: Side, b: Side) -> list[dict[str, Any]]:
    fa = {f["family"]: f for f in a.entry.get("families") or []}
    fb = {f["family"]: f for f in b.entry.get("families") or []}
    rows = []
    for name in fa.keys() | fb.keys():
        x, y = fa.get(name, {}), fb.get(name, {})
        row = {"family": name, "bytes": _change(x.get("bytes", 0), y.get("bytes", 0)),
               "count": _change(x.get("count", 0), y.get("count", 0))}
        if "live_bytes" in x or "live_bytes" in y:
            row["live_bytes"] = _change(x.get("live_bytes", 0), y.get("live_bytes", 0))
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r["bytes"]["delta"]), -abs(r.get("live_bytes", {}).get("delta", 0)), r["family"]))
    return rows


def diff_key(f: Frame) -> tuple[Any, ...]:
    """Two captures match a frame by its function (lines and code offsets move between builds and
    between symbolizations); an unnamed frame by its module."""
    if f.function:
        return (f.short_function(), f.inlined)
    return ("?", f.module)


def _stacks(a: Side, b: Side, view: str, top: int | None) -> dict[str, Any]:
    pa, pb = profile(a.loaded, view), profile(b.loaded, view)
    if pa.missing and pb.missing:
        return {"missing": pa.missing}
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    # Against a side that lacks the view every stack would read as new or gone: no rows, the totals
    # and which side lacks it (its reason) only.
    for side, p in (("base", pa), ("new", pb)) if not (pa.missing or pb.missing) else ():
        for s in p.samples:
            key = tuple(diff_key(f) for f in s.frames)
            row = merged.get(key)
            if row is None:
                row = merged[key] = {"frames": s.frames, "base": 0, "new": 0, "base_count": 0, "new_count": 0}
            row[side] += s.bytes
            row[f"{side}_count"] += s.count
    rows: list[dict[str, Any]] = [{"bytes": _change(r["base"], r["new"]), "count": _change(r["base_count"], r["new_count"]),
             "frames": [f.to_json() for f in r["frames"]]} for r in merged.values()]
    rows = [r for r in rows if r["bytes"]["delta"] or r["count"]["delta"]]
    rows.sort(key=lambda r: (-abs(r["bytes"]["delta"]), -abs(r["count"]["delta"])))
    out: dict[str, Any] = {"total": _change(pa.total_bytes, pb.total_bytes),
                           "count": _change(pa.total_count, pb.total_count),
                           "rows": rows if top is None else rows[:top]}
    for side, p in (("base", pa), ("new", pb)):
        if p.missing:
            out[f"{side}_missing"] = p.missing
    return out


def compare(a: Side, b: Side, top: int | None = 10) -> dict[str, Any]:
    views = a.loaded.tracer.views
    return {"target": a.key[0] if a.key[0] == b.key[0] else f"{a.key[0]} → {b.key[0]}", "tracer": a.key[1],
            "base": str(a.loaded.path), "new": str(b.loaded.path),
            "families": _families(a, b)[:top] if top is not None else _families(a, b),
            "views": {v: _stacks(a, b, v, top) for v in views}}


def diff(base: Path, new: Path, top: int | None = 10, families: Path | None = None) -> dict[str, Any]:
    rules = load_rules(families)
    a_paths, b_paths = captures_in(base), captures_in(new)
    if len(a_paths) == 1 and len(b_paths) == 1:
        a, b = _side(a_paths[0], rules), _side(b_paths[0], rules)
        if a.key[1] != b.key[1]:
            raise InputError(f"{new}: a {b.key[1]} capture cannot be compared with {base}, a {a.key[1]} capture")
        return {"kind": "diff", "base": str(base), "new": str(new), "pairs": [compare(a, b, top)], "unpaired": [],
                "incomplete": _incomplete([a, b])}
    sa: dict[Any, Side] = {}
    for p in a_paths:
        s = _side(p, rules)
        sa.setdefault(s.key, s)
    sb: dict[Any, Side] = {}
    for p in b_paths:
        s = _side(p, rules)
        sb.setdefault(s.key, s)
    pairs = [compare(sa[k], sb[k], top) for k in sorted(sa.keys() & sb.keys())]
    unpaired = [{"side": "base", "target": k[0], "tracer": k[1], "path": str(sa[k].loaded.path)}
                for k in sorted(sa.keys() - sb.keys())]
    unpaired += [{"side": "new", "target": k[0], "tracer": k[1], "path": str(sb[k].loaded.path)}
                 for k in sorted(sb.keys() - sa.keys())]
    if not pairs:
        raise InputError(f"{base} and {new}: no target was captured by the same tracer in both")
    return {"kind": "diff", "base": str(base), "new": str(new), "pairs": pairs, "unpaired": unpaired,
            "incomplete": _incomplete([*sa.values(), *sb.values()])}


def _incomplete(sides: list[Side]) -> list[dict[str, str]]:
    """Captures read only in part (cut short, damaged, never closed): the diff covers what was read."""
    return [{"path": str(s.loaded.path), "problem": s.loaded.info.problem} for s in sides
            if s.loaded.info.problem is not None]


def frames_of(row: dict[str, Any]) -> list[Frame]:
    return [Frame.from_json(f) for f in row["frames"]]
