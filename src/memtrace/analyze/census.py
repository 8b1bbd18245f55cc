"""Census analysis: pure functions from collected rows to sorted rows, totals, band names, Markdown.

The census document (``memtrace census --json`` / ``--out FILE.json``; a report folder
recognises it by ``"kind": "census"``)::

    {
      "kind": "census", "version": 1,
      "platform": "linux" | "darwin",
      "device": {"id": str, "name": str, "type": str},
      "time": ISO-8601 UTC, "host_pid": int | null,
      "rows": [row, ...],
      "totals": {"processes", "measured", "vanished", "denied", "footprint", "purgeable_volatile",
                 "purgeable_nonvolatile", "reusable", "graphics"},
      "errors": {source: message}, "notes": [str, ...]
    }

A row (bytes unless said otherwise; ``null`` when the platform or the process's permissions
do not expose the figure)::

    pid, name, status ("ok" | "partial" | "denied" | "vanished" | "errno N"),
    footprint, lifetime_max, purgeable_volatile, purgeable_nonvolatile, reusable,
    graphics (IOSurface / graphics-tagged memory), rss, pss, swap,
    priority (jetsam priority, or oom_score_adj on Linux), band (its name), limit, limit_source
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memtrace import schema
from memtrace.reporters.markdown import cell, table, text
from memtrace.schema import UNSET, Maybe, Shape
from memtrace.units import fmt_bytes

FORMAT_VERSION = 1
SORT_KEYS = ("footprint", "purgeable", "lifetime_max", "name", "pid", "priority")

# xnu bsd/sys/kern_memorystatus.h JETSAM_PRIORITY_* (-1 is an alias for the default band), two scales:
# up to xnu-8019 (iOS 15) ...
DARWIN_BANDS_LEGACY = {
    -1: "DEFAULT", 0: "IDLE", 1: "AGING_BAND1", 2: "AGING_BAND2", 3: "BACKGROUND", 4: "MAIL", 5: "PHONE",
    8: "UI_SUPPORT", 9: "FOREGROUND_SUPPORT", 10: "FOREGROUND", 12: "AUDIO_AND_ACCESSORY",
    13: "CONDUCTOR", 15: "DRIVER_APPLE", 16: "HOME", 17: "EXECUTIVE", 18: "IMPORTANT", 19: "CRITICAL", 21: "MAX",
}
# ... and since xnu-8792 (iOS 16), ten times larger, with FREEZER between, bands 1-9 for entitled
# processes (JETSAM_PRIORITY_ENTITLED_MAX), 15 for system processes stuck in aging, and INTERNAL
# (launchd, kernel_task: never jetsammed).
DARWIN_BANDS = {
    -1: "DEFAULT", 0: "IDLE", **{n: "ENTITLED" for n in range(1, 10)}, 10: "AGING_BAND1",
    15: "AGING_BAND1_STUCK", 20: "AGING_BAND2", 30: "BACKGROUND", 40: "MAIL", 50: "PHONE",
    75: "FREEZER", 80: "UI_SUPPORT", 90: "FOREGROUND_SUPPORT", 100: "FOREGROUND", 120: "AUDIO_AND_ACCESSORY",
    130: "CONDUCTOR", 150: "DRIVER_APPLE", 160: "HOME", 170: "EXECUTIVE", 180: "IMPORTANT", 190: "CRITICAL",
    210: "MAX", 999: "INTERNAL",
}
SCALED_BANDS_SINCE_IOS = 16
LEGACY_MAX_PRIORITY = 21

# oom_score_adj ranges, named after Android lmkd's adj levels (the closest Linux analogue of
# jetsam bands: higher = killed earlier). Lower bound inclusive, checked in order.
LINUX_BANDS = (
    (-1000, "OOM_DISABLED"), (-999, "PROTECTED"), (0, "DEFAULT"), (1, "VISIBLE"),
    (200, "PERCEPTIBLE"), (300, "BACKGROUND"), (500, "SERVICE"), (900, "CACHED"),
)

SUMMED = ("footprint", "purgeable_volatile", "purgeable_nonvolatile", "reusable", "graphics")


class _Device(Shape):
    id: str | None = None
    name: str | None = None
    type: str | None = None


class _Row(Shape):
    pid: int
    name: str | None = None
    status: Maybe[str] = UNSET
    priority: int | None = None
    band: str | None = None
    limit_source: str | None = None
    footprint: int | None = None
    lifetime_max: int | None = None
    purgeable_volatile: int | None = None
    purgeable_nonvolatile: int | None = None
    reusable: int | None = None
    graphics: int | None = None
    rss: int | None = None
    pss: int | None = None
    swap: int | None = None
    limit: int | None = None


class _Totals(Shape):
    processes: Maybe[int] = UNSET
    measured: Maybe[int] = UNSET
    vanished: Maybe[int] = UNSET
    denied: Maybe[int] = UNSET
    footprint: int | None = None        # the SUMMED columns
    purgeable_volatile: int | None = None
    purgeable_nonvolatile: int | None = None
    reusable: int | None = None
    graphics: int | None = None


class CensusDocument(Shape):
    """A census*.json document as a report reads it back."""

    kind: str
    rows: list[_Row]
    version: Maybe[int] = UNSET
    platform: Maybe[str] = UNSET
    time: str | None = None
    host_pid: int | None = None
    device: Maybe[_Device] = UNSET
    totals: Maybe[_Totals] = UNSET
    errors: Maybe[dict[str, str]] = UNSET
    notes: Maybe[list[str]] = UNSET


def document_problem(doc: Any) -> str | None:
    """Why a JSON document cannot be rendered as the census chapter, or None."""
    return schema.document_problem(doc, CensusDocument)


def darwin_band_table(os_version: str | None, priorities: Iterable[int | None] = ()) -> dict[int, str]:
    """The band table of a device: by its OS version (iOS 16+: the x10 scale); with no version, by
    the priorities seen (the legacy scale never goes past MAX = 21)."""
    major = _major(os_version)
    if major is not None:
        return DARWIN_BANDS if major >= SCALED_BANDS_SINCE_IOS else DARWIN_BANDS_LEGACY
    seen = [p for p in priorities if isinstance(p, int)]
    return DARWIN_BANDS if any(p > LEGACY_MAX_PRIORITY for p in seen) else DARWIN_BANDS_LEGACY


def _major(version: str | None) -> int | None:
    head = (version or "").strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def darwin_band(priority: int | None, table: dict[int, str] | None = None) -> str | None:
    """A jetsam priority's band name in ``table`` (default: the iOS 16+ scale)."""
    if priority is None:
        return None
    return (DARWIN_BANDS if table is None else table).get(priority, f"BAND_{priority}")


def linux_band(oom_score_adj: int | None) -> str | None:
    if oom_score_adj is None:
        return None
    name = None
    for low, label in LINUX_BANDS:
        if oom_score_adj >= low:
            name = label
    return name or "OOM_DISABLED"


def band_name(platform: str, priority: int | None) -> str | None:
    return darwin_band(priority) if platform == "darwin" else linux_band(priority)


def _num(row: dict[str, Any], key: str) -> int:
    v = row.get(key)
    return v if isinstance(v, int) else -1


def sort_rows(rows: list[dict[str, Any]], key: str = "footprint") -> list[dict[str, Any]]:
    """Largest first for sizes and priority; alphabetical for name; ascending for pid."""
    if key not in SORT_KEYS:
        raise ValueError(f"unknown sort key {key!r}; expected one of {', '.join(SORT_KEYS)}")
    if key == "name":
        return sorted(rows, key=lambda r: ((r.get("name") or "").lower(), r.get("pid", 0)))
    if key == "pid":
        return sorted(rows, key=lambda r: r.get("pid", 0))
    if key == "purgeable":
        return sorted(rows, key=lambda r: (-(max(_num(r, "purgeable_volatile"), 0)
                                             + max(_num(r, "purgeable_nonvolatile"), 0)), r.get("pid", 0)))
    return sorted(rows, key=lambda r: (-_num(r, key), r.get("pid", 0)))


def totals(rows: list[dict[str, Any]]) -> dict[str, int | None]:
    """Counts and byte sums; a sum is None when no row exposes that figure (e.g. purgeable on Linux)."""
    out: dict[str, int | None] = {
        "processes": len(rows),
        "measured": sum(1 for r in rows if isinstance(r.get("footprint"), int)),
        "vanished": sum(1 for r in rows if r.get("status") == "vanished"),
        "denied": sum(1 for r in rows if r.get("status") == "denied"),
    }
    for key in SUMMED:
        values = [r[key] for r in rows if isinstance(r.get(key), int)]
        out[key] = sum(values) if values else None
    return out


format_bytes = fmt_bytes     # the project's one byte formatter, under the name the census code uses


def render_markdown(census: dict[str, Any], limit: int = 30) -> str:
    """The "Census" section of a report (GitHub Markdown, starts with ``## Census``)."""
    rows = sort_rows(list(census.get("rows", [])), "footprint")
    t = census.get("totals") or totals(rows)
    device = census.get("device") or {}
    lines = ["## Census", ""]
    lines.append(f"{t.get('processes', len(rows))} processes on {cell(device.get('name') or '?')} "
                 f"({text(census.get('platform', '?'))}, {text(census.get('time', '?'))}); total footprint "
                 f"{format_bytes(t.get('footprint'))}"
                 + (f"; {t.get('vanished', 0)} vanished and {t.get('denied', 0)} denied during the scan"
                    if t.get("vanished") or t.get("denied") else "") + ".")
    lines.append("")
    rows_out = []
    for r in rows[:limit]:
        band = r.get("band") or "-"
        if r.get("priority") is not None:
            band = f"{band} ({r['priority']})"
        rows_out.append([r.get("pid"), r.get("name") or "?", format_bytes(r.get("footprint")),
                         format_bytes(r.get("lifetime_max")),
                         f"{format_bytes(r.get('purgeable_volatile'))} / "
                         f"{format_bytes(r.get('purgeable_nonvolatile'))}",
                         format_bytes(r.get("reusable")), format_bytes(r.get("graphics")), band,
                         format_bytes(r.get("limit")), r.get("status", "-")])
    lines += table(["pid", "process", "footprint", "lifetime max", "purgeable vol / nonvol", "reusable",
                    "graphics", "band", "limit", "status"], "rlrrrrrlrl", rows_out)
    if len(rows) > limit:
        lines += [f"{len(rows) - limit} smaller processes not shown.", ""]
    for note in census.get("notes", []):
        lines += [f"> {text(note, line_start=True)}", ""]
    return "\n".join(lines)
