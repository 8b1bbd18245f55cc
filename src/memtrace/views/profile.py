"""A capture as a stack profile: (stack, bytes, count) samples for one view.

The flame graph, the folded/speedscope/pprof exports and ``diff`` all read profiles, so they
show the same numbers as the summary: a view's total is the summary's figure for it.

Which views a capture has is its tracer's declaration (``Tracer.views``, the default first);
the summary makes each (``summary.profile(view)``, :mod:`memtrace.analyze.profile`): malloc's
gross, live, peak, leaked and temporary views, the count views of fds and threads, the stack
rows of the other tracers.
"""

from __future__ import annotations

from typing import Any

from memtrace import tracers
from memtrace.analyze.malloc import TIMELINE_STACKS
from memtrace.analyze.profile import BEFORE_TRACING, UNSTACKED, Profile, Sample
from memtrace.capture import RecordType, read_records

__all__ = ["BEFORE_TRACING", "UNSTACKED", "Profile", "Sample", "profile", "timeline", "views_of"]


def profile(loaded: Any, view: str = "gross") -> Profile:
    """The ``view`` of a loaded capture (:func:`memtrace.views.load`): ``view`` checked against
    the tracer's views ("gross", every tracer's default, is its first view), then made by the
    summary."""
    tracer = loaded.tracer
    if view not in tracer.views:
        owners = [t.name for t in tracers.all_tracers().values() if view in t.views]
        if not owners:
            raise ValueError(f"unknown view {view!r} (one of {', '.join(tracers.all_views())})")
        if view == "gross":
            view = tracer.views[0]
        else:
            p = Profile(tracer=tracer.name, view=view, target=loaded.summary.meta.get("target", {}).get("label"))
            if tracer.views == ("gross",):
                p.missing = f"the {view} view is {owners[0]}'s; a {tracer.name} capture has its stack rows only"
            else:
                p.missing = f"the {view} view is not a {tracer.name} view (its views: {', '.join(tracer.views)})"
            return p
    version = getattr(getattr(loaded, "info", None), "version", None)
    made: Profile = loaded.summary.profile(view, capture_version=version if isinstance(version, int) else None)
    made.tracer = tracer.name         # the registry's name, whatever the summary class calls itself
    return made


def views_of(tracer: str) -> tuple[str, ...]:
    """The views a tracer's captures have, the default first."""
    t = tracers.get(tracer)
    return t.views if t is not None else ("gross",)


# The summary timeline's byte columns the page draws, and their names on it (tracked_blocks is a
# count and peak_bytes only repeats the high-water mark: the peak view shows what made it).
TIMELINE_SERIES = {"tracked_bytes": "tracked live", "in_use": "allocator in use", "footprint": "footprint"}


def timeline(loaded: Any, snapshots: bool = True) -> dict[str, Any]:
    """The memory timeline above a flame graph: ``{"t": [...] seconds, "series": {name: [...]},
    "unit": "bytes" | None, "source"}``.

    From the summary's own timeline when it has one (samples with ``t`` and byte columns, one per
    drain), starting from the window's start where the capture calibrated it (nothing tracked yet;
    the allocator's in-use and the footprint as read before the window), so that a target that
    lives for less than a drain still shows how it grew. Else from the capture's once-a-second
    SNAPSHOT records (gross bytes so far, tracked live blocks); with ``snapshots`` False, ``{}``
    instead (a caller that wants the summary's own timeline only).
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
                stacks.append({"frames": loaded.summary.stack_frames(sid), "live": per_sample})
            if stacks:
                out["stacks"] = stacks
            return out
    if not snapshots:
        return {}
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
