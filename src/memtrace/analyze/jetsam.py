"""JetsamEvent reports (``JetsamEvent-*.ips``, bug_type 298): parse, aggregate, render.

Pure: text in, data out. Reading files and pulling them from a device live in
``memtrace.commands.jetsam`` and ``memtrace.ios``.

A report is a one-line JSON header (``bug_type``, ``timestamp``, ``os_version``, ...) followed
by a JSON body (``product``, ``build``, ``memoryStatus``, ``largestProcess``, ``processes[]``).
Field sets differ across iOS versions (``priority``, ``physicalPages``, ``freeze_skip_reason``
appear in newer ones; very old ones lack ``pageSize``): every field is optional except a body
object with a ``processes`` list, unknown fields are ignored, and anything else raises
:class:`JetsamParseError` with a one-line reason. Hand-edited samples with ``// ...`` comment
lines and the trailing commas they leave behind are accepted.

``aggregate()`` returns the JSON document written by ``memtrace jetsam --json/--out-json``;
a report folder recognises it by its top-level keys::

    {
      "kind": "jetsam", "version": 1,
      "totals":  {"reports": int, "skipped": int, "kills": int},
      "reports": [report, ...],            # see JetsamReport.to_dict()
      "skipped": [{"source": str, "reason": str}, ...],
      "kills_by_reason":  {reason: count},
      "kills_by_process": [{"name", "kills", "reasons": {reason: count}, "max_footprint"}],
      "limit_by_model":   [{"product", "os_versions", "kills", "footprint_min",
                            "footprint_median", "footprint_max", "processes"}]
    }

Footprints are bytes (``rpages`` x ``pageSize``). ``limit_by_model`` only counts
``per-process-limit`` kills: the footprint at death is the observed memory limit of that
process class on that device model.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import msgspec
from msgspec import Struct

from memtrace import schema
from memtrace.errors import InputError
from memtrace.reporters.markdown import code, table, text
from memtrace.schema import UNSET, Maybe, Shape
from memtrace.units import fmt_bytes

JETSAM_BUG_TYPE = "298"
# arm64 iOS devices use 16 KB pages; only reports too old to carry pageSize need the guess.
DEFAULT_PAGE_SIZE = 16384
PER_PROCESS_LIMIT = "per-process-limit"
FORMAT_VERSION = 1

# xnu kern_memorystatus.c memorystatus_kill_cause_name[], for documentation and ordering.
KILL_CAUSES = (
    "jettisoned", "highwater", "vnode-limit", "vm-pageshortage", "proc-thrashing",
    "fc-thrashing", "per-process-limit", "disk-space-shortage", "idle-exit",
    "zone-map-exhaustion", "vm-compressor-thrashing", "vm-compressor-space-shortage",
)


class JetsamParseError(InputError):
    """A report that cannot be read as a JetsamEvent; the message is one line."""


class JetsamProcess(Struct):
    pid: int | None
    name: str
    rpages: int | None
    footprint: int | None
    lifetime_max: int | None
    reason: str | None = None
    kill_delta: int | None = None
    priority: int | None = None
    states: list[str] = msgspec.field(default_factory=list)
    fds: int | None = None
    purgeable: int | None = None
    coalition: int | None = None
    physical_pages: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid, "name": self.name, "rpages": self.rpages, "footprint": self.footprint,
            "lifetime_max": self.lifetime_max, "reason": self.reason, "kill_delta": self.kill_delta,
            "priority": self.priority, "states": self.states, "fds": self.fds,
            "purgeable": self.purgeable, "coalition": self.coalition,
            "physical_pages": self.physical_pages,
        }


class JetsamReport(Struct):
    source: str
    product: str | None
    os_version: str | None
    build: str | None
    timestamp: str | None
    incident: str | None
    page_size: int
    page_size_assumed: bool
    memory_pages: dict[str, int]
    memory_status: dict[str, Any]
    largest_process: str | None
    processes: list[JetsamProcess]
    ignored_entries: int = 0

    @property
    def killed(self) -> list[JetsamProcess]:
        return [p for p in self.processes if p.reason]

    def top(self, n: int = 10) -> list[JetsamProcess]:
        return sorted(self.processes, key=lambda p: p.footprint or 0, reverse=True)[:n]

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        return {
            "source": self.source, "product": self.product, "os_version": self.os_version,
            "build": self.build, "timestamp": self.timestamp, "incident": self.incident,
            "page_size": self.page_size, "page_size_assumed": self.page_size_assumed,
            "memory_pages": self.memory_pages,
            "memory_pages_bytes": {k: v * self.page_size for k, v in self.memory_pages.items()},
            "memory_status": self.memory_status, "largest_process": self.largest_process,
            "process_count": len(self.processes), "ignored_entries": self.ignored_entries,
            "killed": [p.to_dict() for p in self.killed],
            "top_processes": [p.to_dict() for p in self.top(top)],
        }


# --- parsing ---------------------------------------------------------------------------------


def _strip_comments_and_trailing_commas(text: str) -> str:
    """Drop ``//`` comments and commas before ``]``/``}``, never touching string contents."""
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                in_string = False
            i += 1
            continue
        if c == '"':
            in_string = True
            out.append(c)
        elif c == "/" and text.startswith("//", i):
            nl = text.find("\n", i)
            i = n if nl < 0 else nl
            continue
        elif c in "]}":
            # A comment line between the last element and the bracket leaves "x,\n ]".
            j = len(out) - 1
            while j >= 0 and out[j] in " \t\r\n":
                j -= 1
            if j >= 0 and out[j] == ",":
                del out[j]
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _loads(text: str, source: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return json.loads(_strip_comments_and_trailing_commas(text))
    except RecursionError:
        raise JetsamParseError(f"{source}: {what} is nested too deeply to be a JetsamEvent") from None
    except ValueError as e:
        msg = getattr(e, "msg", str(e)).splitlines()[0] if str(e) else "invalid JSON"
        line = getattr(e, "lineno", None)
        where = f" (line {line})" if line else ""
        raise JetsamParseError(f"{source}: {what} is not valid JSON: {msg}{where}") from None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _str(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _split_header(text: str, source: str) -> tuple[dict[str, Any], Any]:
    stripped = text.lstrip("\ufeff \t\r\n")
    if not stripped:
        raise JetsamParseError(f"{source}: empty file")
    first, _, rest = stripped.partition("\n")
    header: Any = None
    if rest.strip():
        try:
            header = json.loads(first)
        except (ValueError, RecursionError):
            header = None
    if isinstance(header, dict) and not ("processes" in header and "memoryStatus" in header):
        return header, _loads(rest, source, "report body")
    # No one-line header: the whole file is the body (older exports, hand-made samples).
    return {}, _loads(stripped, source, "report")


def parse_report(text: str, source: str = "<report>") -> JetsamReport:
    """Parse one JetsamEvent report; raise JetsamParseError (one line, naming ``source``)."""
    header, body = _split_header(text, source)
    bug_type = _str(header.get("bug_type"))
    if bug_type is not None and bug_type != JETSAM_BUG_TYPE:
        raise JetsamParseError(f"{source}: bug_type {bug_type} is not a JetsamEvent (298)")
    if not isinstance(body, dict):
        raise JetsamParseError(f"{source}: report body is a JSON {type(body).__name__}, not an object")
    raw_processes = body.get("processes")
    if not isinstance(raw_processes, list):
        raise JetsamParseError(f"{source}: no 'processes' list in the report body")

    status = body.get("memoryStatus")
    status = status if isinstance(status, dict) else {}
    reported_page_size = _int(status.get("pageSize"))
    assumed = reported_page_size is None or reported_page_size <= 0
    page_size = DEFAULT_PAGE_SIZE if reported_page_size is None or reported_page_size <= 0 else reported_page_size
    pages_raw = status.get("memoryPages")
    memory_pages: dict[str, int] = {}
    if isinstance(pages_raw, dict):
        for k, v in pages_raw.items():
            iv = _int(v)
            if iv is not None:
                memory_pages[str(k)] = iv
    scalars = {
        str(k): v for k, v in status.items()
        if k not in ("memoryPages",) and (isinstance(v, (str, int)) or
                                          (isinstance(v, float) and math.isfinite(v)))
    }

    processes: list[JetsamProcess] = []
    ignored = 0
    for entry in raw_processes:
        if not isinstance(entry, dict):
            ignored += 1
            continue
        pid = _int(entry.get("pid"))
        rpages = _int(entry.get("rpages"))
        if rpages is not None and rpages < 0:
            rpages = None
        lifetime = _int(entry.get("lifetimeMax"))
        states = entry.get("states")
        phys = entry.get("physicalPages")
        processes.append(JetsamProcess(
            pid=pid,
            name=_str(entry.get("name")) or (f"pid {pid}" if pid is not None else "?"),
            rpages=rpages,
            footprint=rpages * page_size if rpages is not None else None,
            lifetime_max=lifetime * page_size if lifetime is not None and lifetime >= 0 else None,
            reason=_str(entry.get("reason")) or None,
            kill_delta=_int(entry.get("killDelta")),
            priority=_int(entry.get("priority")),
            states=[s for s in states if isinstance(s, str)] if isinstance(states, list) else [],
            fds=_int(entry.get("fds")),
            purgeable=_int(entry.get("purgeable")),
            coalition=_int(entry.get("coalition")),
            physical_pages=phys if isinstance(phys, dict) else None,
        ))

    build = _str(body.get("build"))
    return JetsamReport(
        source=source,
        product=_str(body.get("product")),
        os_version=_str(header.get("os_version")) or build,
        build=build,
        timestamp=_str(header.get("timestamp")) or _str(body.get("date")),
        incident=_str(header.get("incident_id")) or _str(body.get("incident")),
        page_size=page_size,
        page_size_assumed=assumed,
        memory_pages=memory_pages,
        memory_status=scalars,
        largest_process=_str(body.get("largestProcess")),
        processes=processes,
        ignored_entries=ignored,
    )


# --- aggregation -----------------------------------------------------------------------------


def aggregate(reports: Iterable[JetsamReport], skipped: Iterable[tuple[str, str]] = (),
              top: int = 10) -> dict[str, Any]:
    """Combine parsed reports (and (source, reason) pairs for skipped ones) into one document."""
    reports = list(reports)
    skipped_rows = [{"source": s, "reason": r} for s, r in skipped]
    by_reason: Counter[str] = Counter()
    by_process: dict[str, dict[str, Any]] = {}
    limits: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"footprints": [], "os_versions": set(), "processes": Counter()})
    for report in reports:
        for p in report.killed:
            reason = p.reason or "?"
            by_reason[reason] += 1
            entry = by_process.setdefault(p.name, {"name": p.name, "kills": 0, "reasons": Counter(),
                                                   "max_footprint": None})
            entry["kills"] += 1
            entry["reasons"][reason] += 1
            if p.footprint is not None:
                entry["max_footprint"] = max(entry["max_footprint"] or 0, p.footprint)
            if reason == PER_PROCESS_LIMIT and p.footprint is not None:
                slot = limits[report.product or "unknown"]
                slot["footprints"].append(p.footprint)
                if report.os_version:
                    slot["os_versions"].add(report.os_version)
                slot["processes"][p.name] += 1

    limit_rows = []
    for product, slot in sorted(limits.items()):
        fps = slot["footprints"]
        limit_rows.append({
            "product": product, "os_versions": sorted(slot["os_versions"]), "kills": len(fps),
            "footprint_min": min(fps), "footprint_median": int(statistics.median(fps)),
            "footprint_max": max(fps), "processes": dict(slot["processes"].most_common()),
        })
    process_rows = sorted(by_process.values(), key=lambda e: (-e["kills"], e["name"]))
    for e in process_rows:
        e["reasons"] = dict(e["reasons"].most_common())
    return {
        "kind": "jetsam",
        "version": FORMAT_VERSION,
        "totals": {"reports": len(reports), "skipped": len(skipped_rows),
                   "kills": sum(by_reason.values())},
        "reports": [r.to_dict(top) for r in reports],
        "skipped": skipped_rows,
        "kills_by_reason": dict(by_reason.most_common()),
        "kills_by_process": process_rows,
        "limit_by_model": limit_rows,
    }


# --- the document read back (a report folder's jetsam*.json) ----------------------------------

class _Process(Shape):
    name: str
    footprint: int | None
    reason: str | None
    kill_delta: int | None
    pid: int | None = None
    lifetime_max: int | None = None
    priority: int | None = None


class _Totals(Shape):
    reports: Maybe[int] = UNSET
    skipped: Maybe[int] = UNSET
    kills: Maybe[int] = UNSET


class _Report(Shape):
    product: str | None
    os_version: str | None
    timestamp: str | None
    largest_process: str | None
    killed: list[_Process]
    source: Maybe[str] = UNSET
    page_size: Maybe[int] = UNSET
    memory_pages: Maybe[dict[str, int]] = UNSET
    top_processes: Maybe[list[_Process]] = UNSET


class _Skipped(Shape):
    source: str
    reason: str


class _ProcessKills(Shape):
    name: str
    kills: int
    reasons: dict[str, int]
    max_footprint: int | None


class _ModelLimit(Shape):
    product: str
    os_versions: list[str]
    kills: int
    footprint_min: int
    footprint_median: int
    footprint_max: int
    processes: dict[str, int]


class JetsamDocument(Shape):
    """A jetsam*.json document as a report reads it back."""

    kind: str
    version: Maybe[int] = UNSET
    totals: Maybe[_Totals] = UNSET
    reports: Maybe[list[_Report]] = UNSET
    skipped: Maybe[list[_Skipped]] = UNSET
    kills_by_reason: Maybe[dict[str, int]] = UNSET
    kills_by_process: Maybe[list[_ProcessKills]] = UNSET
    limit_by_model: Maybe[list[_ModelLimit]] = UNSET


def document_problem(doc: Any) -> str | None:
    """Why a JSON document cannot be rendered as the jetsam chapter, or None."""
    return schema.document_problem(doc, JetsamDocument)


# --- rendering -------------------------------------------------------------------------------


format_bytes = fmt_bytes     # the project's one byte formatter, under the name the jetsam code uses


def render_markdown(agg: dict[str, Any]) -> str:
    """The "Jetsam" chapter of a report (GitHub Markdown, starts with ``## Jetsam``)."""
    t = agg.get("totals", {})
    lines = ["## Jetsam", ""]
    lines.append(f"{t.get('reports', 0)} JetsamEvent report(s), {t.get('kills', 0)} kill(s)"
                 + (f", {t.get('skipped')} report(s) skipped as unreadable" if t.get("skipped") else "")
                 + ".")
    lines.append("")
    if agg.get("kills_by_reason"):
        lines += ["### Kills by reason", ""]
        lines += table(["reason", "kills"], "lr", [[r, n] for r, n in agg["kills_by_reason"].items()])
    if agg.get("kills_by_process"):
        lines += ["### Kills by process", ""]
        lines += table(["process", "kills", "reasons", "max footprint"], "lrlr",
                       [[e["name"], e["kills"], ", ".join(f"{r} ×{n}" for r, n in e["reasons"].items()),
                         format_bytes(e["max_footprint"])] for e in agg["kills_by_process"]])
    if agg.get("limit_by_model"):
        lines += ["### Memory limit per device model (footprint at per-process-limit kill)", ""]
        lines += table(["model", "OS", "kills", "min", "median", "max", "processes"], "llrrrrl",
                       [[e["product"], ", ".join(e["os_versions"]) or "-", e["kills"],
                         format_bytes(e["footprint_min"]), format_bytes(e["footprint_median"]),
                         format_bytes(e["footprint_max"]), ", ".join(e["processes"])]
                        for e in agg["limit_by_model"]])
    if agg.get("reports"):
        lines += ["### Reports", ""]
        rows = []
        for r in agg["reports"]:
            killed = "; ".join(
                f"{k['name']} ({k['reason']}, {format_bytes(k['footprint'])}, {k['kill_delta']})"
                for k in r["killed"]) or "-"
            mp = r.get("memory_pages", {})
            rows.append([r["timestamp"] or "-", r["product"] or "-", r["os_version"] or "-", killed,
                         r["largest_process"] or "-",
                         " / ".join(str(mp.get(k, "-")) for k in ("free", "wired", "anonymous"))])
        lines += table(["time", "model", "OS", "killed (reason, footprint, killDelta)", "largest",
                        "free / wired / anon pages"], "llllll", rows)
    if agg.get("skipped"):
        lines += ["### Skipped reports", ""]
        lines += [f"- {code(s['source'])}: {text(s['reason'])}" for s in agg["skipped"]]
        lines.append("")
    return "\n".join(lines)
