"""A capture as a stack profile: (stack, bytes, count) samples for one view.

The flame graph, the folded/speedscope/pprof exports and ``diff`` all read profiles, so they
show the same numbers as the summary: a view's total is the summary's figure for it (the gross
view includes the bytes no stack covers, as one "(no stack)" sample).

Views (malloc): ``gross`` every allocation; ``live`` tracked blocks alive at the end; ``leaked``
the --leaks scan's unreachable blocks; ``peak`` the live set at the footprint's peak and
``temporary`` blocks freed soon after they were made (both from the summary's ``peak`` and
``temporary`` sections, which older captures lack: the view is then "not in this capture").
Other tracers: their summary's stack rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from memtrace.analyze.malloc import TIMELINE_STACKS, MallocSummary
from memtrace.capture import NO_STACK, RecordType, read_records
from memtrace.frames import Frame

VIEWS = ("gross", "live", "peak", "leaked", "temporary")
UNSTACKED = Frame(0, function="(no stack: below the stack threshold)")
BEFORE_TRACING = Frame(0, function="(allocated before tracing: no stack)")    # --leaks: found by the allocator walk
_ALL = 10 ** 9      # "every row" for summaries whose to_json slices by top


@dataclass
class Sample:
    frames: list[Frame]          # innermost first
    bytes: int
    count: int


@dataclass
class Profile:
    tracer: str
    view: str
    target: str | None
    samples: list[Sample] = field(default_factory=list)
    missing: str | None = None   # why this view has nothing: "not in this capture"
    unit: str = "bytes"          # what a sample's ``bytes`` weighs: "bytes", or "count" (fds, threads)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.samples)

    @property
    def total_count(self) -> int:
        return sum(s.count for s in self.samples)


def _rows(rows: Iterable[dict[str, Any]]) -> list[Sample]:
    out = []
    for r in rows:
        frames = [Frame.from_json(f) for f in r.get("frames") or []] or \
            [BEFORE_TRACING if r.get("allocated_before_tracing") else UNSTACKED]
        count = r.get("count", r.get("blocks", r.get("calls", 1)))
        out.append(Sample(frames, int(round(r.get("bytes") or 0)), int(round(count or 0))))
    return out


def _section(doc: dict[str, Any], key: str) -> dict[str, Any] | None:
    sec = doc.get(key)
    return sec if isinstance(sec, dict) else None


def profile(loaded: Any, view: str = "gross") -> Profile:
    """The ``view`` of a loaded capture (:func:`memtrace.views.load`)."""
    s = loaded.summary
    name = loaded.tracer.name
    target = getattr(s, "meta", {}).get("target", {}).get("label")
    p = Profile(tracer=name, view=view, target=target)
    if name != "malloc":
        return _generic(p, s, view)
    if view in ("gross", "live"):
        live = view == "live"
        for r in s.stack_rows(None, live=live):
            frames = r.frames if r.frames and r.stack_ids != [NO_STACK] else [UNSTACKED]
            p.samples.append(Sample(frames, int(round(r.est_bytes)), int(round(r.count))))
        if not live:
            # Bytes no stack covers (below the stack threshold, unsampled): one sample, so the
            # view adds up to the gross bytes.
            stacked = s.coverage()["estimated_bytes_with_sampling"]
            rest = s.gross_bytes - stacked
            if rest > 0:
                p.samples.append(Sample([UNSTACKED], rest, max(0, s.alloc_calls - sum(x.count for x in p.samples))))
        return p
    if view == "leaked":
        leaks = s.leaks_json(None)
        if leaks is None:
            p.missing = "no leak scan in this capture (capture with --leaks)"
        else:
            p.samples = _rows(leaks["leaked"]["by_stack"])
        return p
    if view in ("peak", "temporary"):
        # The section alone: the whole to_json would rank every stack by every measure.
        sec = s.peak_json(_ALL) if view == "peak" else s.temporary_json(_ALL)
        if sec is None and type(s).to_json is not MallocSummary.to_json:
            # A summary class that adds the section in its own to_json (a newer analyzer's shape).
            sec = _section(s.to_json(top=_ALL), view)
        if sec is None or not isinstance(sec.get("by_stack"), list):
            p.missing = f"the {view} view is not in this capture ({_why_no_aggregates(loaded)})"
        else:
            p.samples = _rows(sec["by_stack"])
            # As in the gross view, what no stack covers is one sample, so the total is the summary's.
            rest = int(sec.get("bytes") or 0) - sum(x.bytes for x in p.samples)
            calls = sec.get("calls", sec.get("count", sec.get("blocks")))
            if rest > 0:
                rest_count = int(calls) - sum(x.count for x in p.samples) if isinstance(calls, int) else 0
                p.samples.append(Sample([UNSTACKED], rest, max(0, rest_count)))
        return p
    raise ValueError(f"unknown view {view!r} (one of {', '.join(VIEWS)})")


# Tracers whose stacks weigh objects, not bytes: their views, each a list of stack rows in the
# summary's JSON (a dotted path) weighed by its rows' "count".
COUNT_VIEWS: dict[str, dict[str, tuple[str, str]]] = {
    "fds": {"open": ("open_at_end.by_stack", "descriptors open at the end, by the stack that opened them"),
            "failed": ("failures_by_stack", "failed opens (EMFILE, ENFILE, ...), by stack")},
    "threads": {"created": ("created_by_stack", "threads created, by the stack that created them"),
                "running": ("running_at_end.by_stack", "threads still running at the end, by creating stack"),
                "leaked": ("leaked.by_stack", "threads never joined nor detached, by creating stack")},
}


def views_of(tracer: str) -> tuple[str, ...]:
    """The views a tracer's captures have, the default first."""
    if tracer == "malloc":
        return VIEWS
    return tuple(COUNT_VIEWS.get(tracer, {"gross": ("", "")}))


def _counted(p: Profile, s: Any, view: str) -> Profile:
    path, meaning = COUNT_VIEWS[p.tracer][view]
    node: Any = s.to_json(capture=None, top=0)
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    p.unit = "count"
    rows = [r for r in node or [] if isinstance(r, dict) and r.get("frames")]
    if not rows:
        p.missing = f"no {meaning} in this capture"
        return p
    for r in rows:
        n = int(r.get("count") or 0)
        p.samples.append(Sample([Frame.from_json(f) for f in r["frames"]], n, n))
    return p


def _generic(p: Profile, s: Any, view: str) -> Profile:
    from memtrace.frames import named_stack_lists as _named_stack_lists

    if p.tracer in COUNT_VIEWS:
        if view == "gross":
            # The default view of every tracer (export --view gross, older callers): its first.
            view = p.view = next(iter(COUNT_VIEWS[p.tracer]))
        if view not in COUNT_VIEWS[p.tracer]:
            views = ", ".join(COUNT_VIEWS[p.tracer])
            p.missing = f"the {view} view is not a {p.tracer} view (its views: {views})"
            return p
        return _counted(p, s, view)
    if view != "gross":
        p.missing = f"the {view} view is malloc's; a {p.tracer} capture has its stack rows only"
        return p
    lists = _named_stack_lists(s.to_json(capture=None, top=_ALL))
    if not lists:
        p.missing = f"this {p.tracer} capture has no stacks"
        return p
    p.samples = _rows(lists[0][1])
    return p


# The summary timeline's byte columns the page draws, and their names on it (tracked_blocks is a
# count and peak_bytes only repeats the high-water mark: the peak view shows what made it).
TIMELINE_SERIES = {"tracked_bytes": "tracked live", "in_use": "allocator in use", "footprint": "footprint"}


def _why_no_aggregates(loaded: Any) -> str:
    """Why a malloc capture has no peak or temporary section: only the in-target aggregates keep them."""
    info = getattr(loaded, "info", None)
    if getattr(info, "version", None) == 1 or getattr(loaded.summary, "mode", None) != "events":
        return "recorded by a memtrace that did not keep it yet"
    return "an --events capture: the in-target aggregates that keep it were off"


def timeline(loaded: Any) -> dict[str, Any]:
    """The memory timeline above a flame graph: ``{"t": [...] seconds, "series": {name: [...]},
    "unit": "bytes" | None, "source"}``.

    From the summary's own timeline when it has one (samples with ``t`` and byte columns, one per
    drain), starting from the window's start where the capture calibrated it (nothing tracked yet;
    the allocator's in-use and the footprint as read before the window), so that a target that
    lives for less than a drain still shows how it grew. Else from the capture's once-a-second
    SNAPSHOT records (gross bytes so far, tracked live blocks).
    """
    own = getattr(loaded.summary, "timeline", None)
    if isinstance(own, list) and own and isinstance(own[0], dict):
        samples = [dict(x) for x in own]
        calibration = getattr(loaded.summary, "calibration", None)
        start = _start_sample(calibration)
        if start is not None and float(samples[0].get("t") or 0) > 0:
            samples.insert(0, start)
        # Two more points the capture knows exactly, so that a run shorter than a few drains is
        # still a shape: the peak of tracked bytes at its instant, and the allocator and footprint
        # as read at the end.
        peak = getattr(loaded.summary, "peak", None)
        if peak is not None and peak.t_s is not None and all(float(x.get("t") or 0) != peak.t_s for x in samples):
            samples.append({"t": peak.t_s, "tracked_bytes": peak.bytes})
        end = _end_sample(calibration)
        if end is not None and end["t"] > max(float(x.get("t") or 0) for x in samples):
            samples.append(end)
        samples.sort(key=lambda x: float(x.get("t") or 0))
        t = [float(x.get("t") or 0) for x in samples]
        keys = [k for k in TIMELINE_SERIES if any(isinstance(x.get(k), int | float) for x in samples)]
        if keys:
            out: dict[str, Any] = {"t": t, "series": {TIMELINE_SERIES[k]: [x.get(k) for x in samples] for k in keys},
                                   "unit": "bytes", "source": "summary"}
            if peak is not None and peak.t_s is not None:
                out["peak"] = {"t": peak.t_s, "bytes": peak.bytes}
            # The largest stacks' live bytes at each drain: what a time range's flame graph shows.
            stacks = []
            for sid in _timeline_stacks(own):
                per_sample = [dict(x["top"]).get(sid) if isinstance(x.get("top"), list) else None for x in samples]
                stacks.append({"frames": loaded.summary.stack(sid), "live": per_sample})
            if stacks:
                out["stacks"] = stacks
            return out
    t = []
    gross: list[int] = []
    live: list[int] = []
    for rec in read_records(loaded.path):
        if rec.type == RecordType.SNAPSHOT:
            t.append(float(rec.body.get("t", 0)))
            gross.append(int(rec.body.get("bytes") or 0))
            live.append(int(rec.body.get("live") or 0))
    series: dict[str, list[Any]] = {}
    if any(gross):
        series["gross bytes allocated"] = gross
    if any(live):
        series["tracked live blocks"] = live
    return {"t": t, "series": series, "unit": None, "source": "snapshots"}


def _end_sample(calibration: Any) -> dict[str, Any] | None:
    """The window's end as a timeline sample (allocator in-use and footprint), placed by the agent
    clock the "before" and the end calibrations share; None when either lacks its time."""
    if not isinstance(calibration, dict):
        return None
    before = calibration.get("before")
    after = calibration.get("after") or calibration.get("at-exit")
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return None
    if not (isinstance(before.get("t"), int | float) and isinstance(after.get("t"), int | float)):
        return None
    allocator: dict[str, Any] = after["allocator"] if isinstance(after.get("allocator"), dict) else {}
    footprint: dict[str, Any] = after["footprint"] if isinstance(after.get("footprint"), dict) else {}
    return {"t": round((after["t"] - before["t"]) / 1000, 3), "in_use": allocator.get("in_use"),
            "footprint": footprint.get("footprint")}


def _timeline_stacks(samples: list[dict[str, Any]]) -> list[int]:
    """The stacks the timeline's samples list (each sample names its largest), largest first."""
    highest: dict[int, int] = {}
    for x in samples:
        for row in x.get("top") or []:
            if isinstance(row, list | tuple) and len(row) >= 2:
                highest[row[0]] = max(highest.get(row[0], 0), int(row[1] or 0))
    return sorted(highest, key=lambda sid: (-highest[sid], sid))[:TIMELINE_STACKS]


def _start_sample(calibration: Any) -> dict[str, Any] | None:
    """The window's start as a timeline sample, from the "before" calibration (None without one)."""
    before = calibration.get("before") if isinstance(calibration, dict) else None
    if not isinstance(before, dict):
        return None
    allocator = before.get("allocator")
    footprint = before.get("footprint")
    allocator = allocator if isinstance(allocator, dict) else {}
    footprint = footprint if isinstance(footprint, dict) else {}
    return {"t": 0.0, "tracked_bytes": 0, "in_use": allocator.get("in_use"), "footprint": footprint.get("footprint")}
