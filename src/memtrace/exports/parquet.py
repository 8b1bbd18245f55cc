"""One capture as Parquet: a row per (stack, view), with the stack's frames and the capture's
identity, for aggregating thousands of captures (a device farm's) with DuckDB, Spark or pandas.

Optional: needs pyarrow (``pip install 'memtrace[parquet]'``).  Columns (docs/report.md shows a
DuckDB query that reproduces report.json's family table from them):

    capture_id  sha256 of the capture file        capture     the path it was exported from
    tracer, target, device, pid, started_at, host, tool_version      from the capture's META
    view        gross | live | peak | temporary | leaked (malloc); open, failed (fds);
                created, running, leaked (threads); gross (the other tracers)
    unit        "bytes", or "count" for fds and threads (bytes is then the same count)
    stack_id    the capture's stack id (null for the bytes no stack covers)
    family      the stack's family under the built-in rules ("(no stack)" for unstacked bytes)
    bytes, count                                  leaf  the innermost frame's "function (module)"
    frames      list of {function, module, file, line, offset, address, inlined}, innermost first

The malloc rows add up as the report's do: per view, the sum of ``bytes`` is the summary's figure
(gross bytes, live bytes, the peak, temporary bytes), the bytes no stack covers in one row.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

from memtrace.analyze.families import load_rules
from memtrace.capture import NO_STACK
from memtrace.errors import InputError
from memtrace.exports.limits import clamp_int64
from memtrace.layout import PSEUDO_STACKS
from memtrace.report.chapters import UNSTACKED
from memtrace.views.profile import profile

FRAME_FIELDS = ("function", "module", "file", "line", "offset", "address", "inlined")


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise InputError("--format parquet needs pyarrow, an optional extra: pip install 'memtrace[parquet]'") from None
    return pyarrow


def _frames(frames: list[Any]) -> list[dict[str, Any]]:
    return [{"function": f.function, "module": f.module, "file": f.file, "line": f.line, "offset": f.offset,
             "address": f.address, "inlined": f.inlined} for f in frames]


def rows(loaded: Any) -> list[dict[str, Any]]:
    """The rows (without the capture's identity columns)."""
    rules = load_rules()
    out: list[dict[str, Any]] = []
    s = loaded.summary

    def add(view: str, unit: str, sid: int | None, family: str, b: float, c: float, frames: list[Any]) -> None:
        out.append({"view": view, "unit": unit, "stack_id": sid, "family": family, "bytes": int(round(b)),
                    "count": int(round(c)), "leaf": frames[0].name() if frames else None, "frames": _frames(frames)})

    views = s.measured_views()
    if views:
        # A summary with per-stack-id totals (malloc): a row per stack id and view, then each
        # view's bytes no stack covers, then the views it does not hold per stack (leaked).
        from memtrace.analyze.malloc import MEASURES

        # Stackless rows (the pseudo stacks of the aggregate core, NO_STACK) count in the live set,
        # their gross bytes in the unstacked row -- as the report's family table counts them.
        stackless = set(PSEUDO_STACKS) if s.aggregates else {NO_STACK}
        stacked_count = 0
        for sid, st in s.stack_stats.items():
            stacked = sid not in stackless
            frames = s.stack_frames(sid) if sid != NO_STACK else []
            family = rules.classify(frames) if stacked else UNSTACKED
            for view in views:
                b, c, _ = MEASURES[view](st)
                if b > 0 and (stacked or view != "gross"):
                    add(view, "bytes", sid, family, b, c, frames)
                    if view == "gross":
                        stacked_count += int(round(c))
        rest = s.gross_bytes - s.coverage()["estimated_bytes_with_sampling"]
        if rest > 0:
            add("gross", "bytes", None, UNSTACKED, rest, max(0, s.alloc_calls - stacked_count), [])
        for view in ("peak", "temporary"):
            if view in views:
                total = s.peak.bytes if view == "peak" else s.counter("temp_bytes")
                have = sum(r["bytes"] for r in out if r["view"] == view)
                if total > have:
                    add(view, "bytes", None, UNSTACKED, total - have, 0, [])
        leaked = profile(loaded, "leaked")
        for smp in leaked.samples:
            add("leaked", "bytes", None, rules.classify(smp.frames), smp.bytes, smp.count, smp.frames)
        return out
    for view in loaded.tracer.views:
        p = profile(loaded, view)
        for smp in p.samples:
            add(view, p.unit, None, rules.classify(smp.frames), smp.bytes, smp.count, smp.frames)
    return out


def _capture_id(path: Any) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def table(loaded: Any) -> Any:
    pa = _pyarrow()
    meta = loaded.summary.meta
    target = meta.get("target") or {}
    ident = {"capture_id": _capture_id(loaded.path), "capture": str(loaded.path), "tracer": loaded.tracer.name,
             "target": target.get("label"), "device": target.get("device"), "pid": target.get("pid"),
             "started_at": meta.get("started_at"), "host": str(meta.get("host") or "") or None,
             "tool_version": meta.get("tool_version")}
    data = rows(loaded)
    frame = pa.struct([("function", pa.string()), ("module", pa.string()), ("file", pa.string()),
                       ("line", pa.int64()), ("offset", pa.int64()), ("address", pa.uint64()), ("inlined", pa.bool_())])
    schema = pa.schema([("capture_id", pa.string()), ("capture", pa.string()), ("tracer", pa.string()),
                        ("target", pa.string()), ("device", pa.string()), ("pid", pa.int64()),
                        ("started_at", pa.string()), ("host", pa.string()), ("tool_version", pa.string()),
                        ("view", pa.string()), ("unit", pa.string()), ("stack_id", pa.int64()),
                        ("family", pa.string()), ("bytes", pa.int64()), ("count", pa.int64()),
                        ("leaf", pa.string()), ("frames", pa.list_(frame))])
    columns = {k: [v] * len(data) for k, v in ident.items()}
    for k in ("view", "unit", "stack_id", "family", "bytes", "count", "leaf", "frames"):
        columns[k] = [r[k] for r in data]
    # int64/uint64 columns: a value a damaged capture pushed past them is clamped, and said once.
    for k in ("stack_id", "bytes", "count"):
        columns[k] = [None if v is None else clamp_int64(v, f"parquet: a row's {k}", loaded) for v in columns[k]]
    columns["pid"] = [None if v is None else clamp_int64(v, "parquet: the pid", loaded) for v in columns["pid"]]
    for frames in columns["frames"]:
        for f in frames or ():
            for k in ("line", "offset"):
                if f.get(k) is not None:
                    f[k] = clamp_int64(f[k], f"parquet: a frame's {k}", loaded)
            if isinstance(f.get("address"), int):
                f["address"] = min(max(f["address"], 0), (1 << 64) - 1)
    return pa.Table.from_pydict(columns, schema=schema)


def export(loaded: Any, view: str) -> bytes:
    """Every view at once (``view`` is not a filter: the rows carry it)."""
    pa = _pyarrow()
    buf = io.BytesIO()
    pa.parquet.write_table(table(loaded), buf, compression="zstd")
    return buf.getvalue()
