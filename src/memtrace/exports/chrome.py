"""The Chrome trace-event JSON that the Perfetto UI (and chrome://tracing) opens.

Counter tracks: the footprint and the allocator's in-use bytes (the capture's calibrations, and
every sample of the summary's own timeline when it has one), tracked live blocks and gross bytes
(the once-a-second snapshots), and one track per top stack ("live: <function>", that stack's live
bytes at each drain, for the stacks the in-target timeline follows).  Instant events: every event a JSON-event tracer recorded
(IOSurface creations, purgeable transitions, thread and fd events), the leak scan, the end.

Times: snapshots are seconds since the window started; agent events and calibrations are
milliseconds since the agent loaded, placed on the window's clock by the "before" calibration
(taken by the agent just before the window starts).
"""

from __future__ import annotations

import json
from typing import Any

from memtrace.capture import RecordType, read_records
from memtrace.exports.limits import TS_US_MAX, finite

PID = 1
EVENT_TID = 0


# The summary timeline's columns as the counter tracks the calibrations and snapshots already use
# (one track per quantity, whichever record a value came from).
TIMELINE_COUNTERS = {"tracked_bytes": "tracked live bytes", "tracked_blocks": "tracked live blocks",
                     "peak_bytes": "peak tracked bytes", "in_use": "allocator in-use", "footprint": "footprint"}


def _name(ev: dict[str, Any]) -> str:
    for key in ("type", "event", "op", "kind"):
        value = ev.get(key)
        if isinstance(value, str):
            return value
    return "event"


def document(loaded: Any) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    target = loaded.summary.meta.get("target", {}).get("label") or str(loaded.path)
    events.append({"name": "process_name", "ph": "M", "pid": PID, "args": {"name": f"{target} ({loaded.tracer.name})"}})
    origin: float | None = None      # agent ms at the window's start
    pending: list[tuple[float, dict[str, Any]]] = []   # agent-clock events until the origin is known

    def at_agent(t_ms: float, ev: dict[str, Any]) -> None:
        pending.append((t_ms, ev))

    def counter(name: str, ts_us: float, value: Any) -> dict[str, Any]:
        return {"name": name, "ph": "C", "ts": ts_us, "pid": PID, "args": {"value": value}}

    for rec in read_records(loaded.path):
        b = rec.body
        if rec.type == RecordType.CALIBRATION:
            t = b.get("t")
            if t is None:
                continue
            if b.get("phase") == "before" and origin is None:
                origin = float(t)
            fp = (b.get("footprint") or {}).get("footprint")
            use = (b.get("allocator") or {}).get("in_use")
            if fp is not None:
                at_agent(t, counter("footprint", 0, fp))
            if use is not None:
                at_agent(t, counter("allocator in-use", 0, use))
        elif rec.type == RecordType.SNAPSHOT:
            ts = float(b.get("t") or 0) * 1e6
            for name, value in loaded.summary.snapshot_counters(b):
                events.append(counter(name, ts, value))
        elif rec.type == RecordType.EVENTS:
            for ev in b.get("events") or []:
                args = {k: v for k, v in ev.items() if k not in ("frames", "t")}
                at_agent(float(ev.get("t") or 0), {"name": _name(ev), "ph": "i", "s": "t", "pid": PID,
                                                   "tid": ev.get("tid", EVENT_TID), "ts": 0, "args": args})
        elif rec.type == RecordType.RESULT and b.get("kind") == "leaks":
            args = {k: v for k, v in b.items() if k not in ("leaked", "type")}
            at_agent(float(b.get("t") or 0), {"name": "leak scan", "ph": "i", "s": "p", "pid": PID, "ts": 0,
                                              "args": args})
        elif rec.type == RecordType.END:
            captured = (b.get("timing") or {}).get("captured_s")
            if captured is not None:
                events.append({"name": f"end: {b.get('ended')}", "ph": "i", "s": "p", "pid": PID,
                               "ts": float(captured) * 1e6, "args": {"reason": b.get("reason")}})
    base = origin if origin is not None else 0.0
    for t_ms, ev in pending:
        ev["ts"] = max(0.0, (t_ms - base) * 1000.0)
        events.append(ev)
    timeline = getattr(loaded.summary, "timeline", None)
    if isinstance(timeline, list):
        for sample in timeline:
            if not isinstance(sample, dict) or "t" not in sample:
                continue
            for k, v in sample.items():
                if k != "t" and isinstance(v, int | float):
                    events.append(counter(TIMELINE_COUNTERS.get(k) or str(k), float(sample["t"]) * 1e6, v))
    events += stack_counters(loaded, counter)
    for ev in events:           # what the format holds: finite numbers, timestamps a double keeps exact
        if "ts" in ev:
            ev["ts"] = finite(ev["ts"], "chrome-trace: a timestamp (microseconds)", loaded, 0.0, TS_US_MAX)
        ev_args = ev.get("args")
        if isinstance(ev_args, dict):
            for k, v in ev_args.items():
                ev_args[k] = finite(v, "chrome-trace: a value", loaded)
    events.sort(key=lambda e: (e.get("ts", -1), e["ph"] != "M"))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"exporter": "memtrace", "capture": str(loaded.path), "tracer": loaded.tracer.name}}


def stack_counters(loaded: Any, counter: Any) -> list[dict[str, Any]]:
    """One counter track per stack the in-target timeline follows (its largest by live bytes): the
    stack's live bytes at each drain, named "live: <innermost function>" (then its caller when two
    stacks share it)."""
    from memtrace.views.profile import timeline

    tl = timeline(loaded, snapshots=False)      # the summary's own timeline: the stacks it follows
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for st in tl.get("stacks") or []:
        frames = st["frames"]
        name = "live: " + " ← ".join(f.name() for f in frames[:1])
        if name in seen and len(frames) > 1:
            name += f" ← {frames[1].name()}"
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name += f" #{seen[name]}"
        for t, v in zip(tl["t"], st["live"], strict=True):
            if v is not None:
                out.append(counter(name, float(t) * 1e6, v))
    return out


def export(loaded: Any, view: str) -> bytes:
    return json.dumps(document(loaded), ensure_ascii=False).encode()
