"""The malloc line, offline: exact counters, per-stack totals, live set, peak, temporaries, timeline.

Pure: an iterator of capture records in, a :class:`MallocSummary` out.  Memory is bounded by
distinct stacks and live blocks, never by the number of events.

A capture from the aggregate core (every capture since it exists; batches say ``mode``) carries
each stack's running totals (AGG records), the composition at the peak and the live table at the
end: the summary is read from those.  An older capture (one record per event) is folded event by
event (:mod:`memtrace.analyze.malloc_events`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import msgspec
from msgspec import Struct

from memtrace.analyze.context import CaptureContext, fold_context
from memtrace.analyze.leaks import LeakScan, is_leak_result, resolve
from memtrace.analyze.malloc_events import EventFold
from memtrace.analyze.profile import ALL_ROWS, UNSTACKED, Profile, Sample, samples_of
from memtrace.analyze.vm import VM_KINDS, VmFold
from memtrace.capture import (
    AGG_FIELDS,
    DROPPED_STACK,
    NESTED_STACK,
    NO_STACK,
    REC_AGG,
    REC_ALLOC,
    REC_FREE,
    REC_LIVE,
    REC_PEAK,
    REC_PEAK_HEAD,
    REC_STACK,
    TIER_MAX_BYTES,
    Record,
    RecordType,
    alloc_totals,
    iter_agent_tuples,
)
from memtrace.frames import Frame
from memtrace.layout import (
    AGG_FP_SHIFT,
    AGG_STRIDE,
    COUNTERS,
    KINDS,
    N_COUNTERS,
    PSEUDO_STACKS,
    RELEASE_KINDS,
    TRUNCATED_FRAME,
    calls_at,
    failed_at,
    tier_bytes_at,
    tier_calls_at,
)
from memtrace.units import fmt_bytes

_F = AGG_FIELDS
TIMELINE_STACKS = 16    # stack series in the timeline, the largest by their highest live bytes


class StackStats(Struct):
    stack_id: int
    count: int = 0              # exact allocations seen with this stack
    bytes: int = 0              # their exact bytes
    est_bytes: float = 0.0      # exact + sampled weights (unbiased estimate)
    est_count: float = 0.0
    live_count: int = 0
    live_bytes: int = 0
    live_est_bytes: float = 0.0
    temp_count: int = 0         # temporary allocations (aggregate captures)
    temp_bytes: int = 0
    peak_count: int = 0         # tracked blocks at the peak (aggregate captures)
    peak_bytes: int = 0
    failed: int = 0             # allocation calls here that returned NULL (aggregate captures)


# What a stack table ranks by: (bytes, count, exact bytes) of a StackStats.
Measure = Callable[[StackStats], tuple[float, float, int]]
MEASURES: dict[str, Measure] = {
    "gross": lambda s: (s.est_bytes, s.est_count, s.bytes),
    "live": lambda s: (s.live_est_bytes, s.live_count, s.live_bytes),
    "temporary": lambda s: (s.temp_bytes, s.temp_count, s.temp_bytes),
    "peak": lambda s: (s.peak_bytes, s.peak_count, s.peak_bytes),
    "failed": lambda s: (s.failed, s.failed, 0),        # ranked by failed calls
}


class StackRow(Struct):
    """One row of a stack table: every stack id whose symbolized frames are these."""

    frames: list[Frame]
    stack_ids: list[int]
    est_bytes: float = 0.0      # exact + sampled weights
    count: float = 0.0
    exact_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"bytes": round(self.est_bytes), "count": round(self.count), "exact_bytes": self.exact_bytes,
                "stack_id": min(self.stack_ids), "stack_ids": sorted(self.stack_ids),
                "frames": [f.to_json() for f in self.frames]}


class Peak(Struct):
    """The high-water mark of bytes in tracked blocks and what held them at that instant."""

    bytes: int = 0
    count: int = 0
    epoch: int = 0
    t_us: int = 0               # the core's clock when it was reached
    t_s: float | None = None    # seconds after the hooks went in
    exact: bool = True          # False: the target died before the composition of its last peak was shipped
    # The composition's sum: the bytes the stacks held at that instant.  Below `bytes` only with
    # several threads, by the frees other threads had not yet added to the total (cmodule/track.c,
    # mt_tracked_add_own: 4 KiB a thread at most).
    held_bytes: int = 0


class MallocSummary(CaptureContext):
    tracer_name: ClassVar[str] = "malloc"
    # gross: every allocation; live: tracked blocks alive at the end; peak: the live set at the
    # footprint's peak; leaked: the --leaks scan's unreachable blocks; temporary: blocks freed soon
    # after they were made.
    VIEWS: ClassVar[tuple[str, ...]] = ("gross", "live", "peak", "leaked", "temporary")
    counters: list[int] = msgspec.field(default_factory=lambda: [0] * N_COUNTERS)
    calibration: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    stacks: dict[int, tuple[int, ...]] = msgspec.field(default_factory=dict)
    # Each stack id's totals (CaptureContext.by_stack, the grouping by symbolized stack, is another thing).
    stack_stats: dict[int, StackStats] = msgspec.field(default_factory=dict)
    mode: str = "events"        # "aggregate" | "events" (--events) ; older captures: "events"
    aggregates: bool = False    # the summary comes from the core's per-stack totals
    live_count: int = 0
    live_bytes: int = 0
    live_est_bytes: float = 0.0
    stacked_bytes: int = 0
    sampled_est_bytes: float = 0.0
    unmatched_frees: int = 0
    batches: int = 0
    peak: Peak | None = None
    timeline: list[dict[str, Any]] = msgspec.field(default_factory=list)
    live_blocks: list[tuple[int, int, int, int]] = msgspec.field(default_factory=list)   # (ptr, size, stack id, tick)
    live_dump_complete: bool = False
    leaks: LeakScan | None = None      # --leaks: the scan, joined with the live blocks it ran on
    vm: VmFold = msgspec.field(default_factory=VmFold)     # Darwin's VM line, apart from the malloc family
    # stack id -> its row key (_row_key), valid for the (symbols' version, stacks defined) it was made with
    _row_keys: dict[int, tuple[Any, ...]] = msgspec.field(default_factory=dict)
    _row_keys_version: tuple[int, int] = (-1, -1)

    # -- derived ----------------------------------------------------------------

    @property
    def calls(self) -> dict[str, int]:
        return {name: self.counters[calls_at(name)] for name in KINDS}

    @property
    def gross_bytes(self) -> int:
        return alloc_totals(self.counters)[1]

    @property
    def alloc_calls(self) -> int:
        return alloc_totals(self.counters)[0]

    @property
    def tiers(self) -> list[dict[str, Any]]:
        return [{"max_bytes": m, "calls": self.counters[tier_calls_at(i)], "bytes": self.counters[tier_bytes_at(i)]}
                for i, m in enumerate(TIER_MAX_BYTES)]

    @property
    def failed(self) -> dict[str, int]:
        """Allocation calls that returned NULL, by kind (in ``calls``, never in bytes or tiers)."""
        return {name: self.counters[failed_at(name)] for name, k in KINDS.items()
                if k not in RELEASE_KINDS and k not in VM_KINDS}

    def counter(self, name: str) -> int:
        return self.counters[COUNTERS[name]]

    @property
    def dropped(self) -> dict[str, int]:
        d = {name: self.counter(name)
             for name in ("dropped_records", "dropped_record_bytes", "dropped_stacks", "live_table_full")}
        d["unslotted_calls"] = self.counter("unslotted_calls")
        d["unmatched_frees"] = self.unmatched_frees
        return d

    @property
    def covers(self) -> dict[str, Any]:
        """What the capture's options made it cover, in one line for every summary: everything (the
        local default), or the layered capture's thresholds (a device's default, or asked for)."""
        options = self.meta.get("options")
        agent = options.get("agent") if isinstance(options, dict) else None
        agent = agent if isinstance(agent, dict) else {}

        def number(key: str) -> int | None:    # a capture is input: anything else is "not recorded"
            v = agent.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

        stack_t, live_t, sample = number("stackThreshold"), number("liveThreshold"), number("sampleBytes") or 0
        if stack_t is None or live_t is None:
            return {"complete": None, "text": "thresholds not recorded in this capture"}
        complete = stack_t == 0 and live_t == 0
        if complete:
            text = "every allocation stacked, every block tracked"
        else:
            text = (f"stacks for allocations of {fmt_bytes(stack_t)} and up, blocks of "
                    f"{fmt_bytes(min(stack_t, live_t))} and up tracked; smaller ones only counted "
                    "(live, peak and leaks leave them out)")
            if sample:
                text += f"; sampled every {fmt_bytes(sample)} on average"
        return {"complete": complete, "stack_threshold": stack_t, "live_threshold": live_t,
                "sample_bytes": sample, "frames": number("frames"), "text": text}

    def row(self, stack_id: int) -> StackStats:
        """The stack's row in ``stack_stats``, created empty on first use."""
        st = self.stack_stats.get(stack_id)
        if st is None:
            st = self.stack_stats[stack_id] = StackStats(stack_id)
        return st

    def _stack_addresses(self, stack_id: int) -> tuple[tuple[int, ...] | None, bool]:
        """A stack id's return addresses as its frames show them (None: not in the capture), and
        whether the core cut it (kept the innermost frames of a deeper stack)."""
        frames = self.stacks.get(stack_id)
        if frames is None:
            return None, False
        cut = bool(frames) and frames[-1] == TRUNCATED_FRAME
        if cut:
            frames = frames[:-1]
        i = 0
        if self.info.get("callerFrame") != "exact":
            # Agents before the core put the real caller in place of the trampoline's return
            # address (Interceptor.replace's entries) left that frame, in no module, on top.  Now
            # a frame in no module (JIT code, an anonymous mapping) is kept: "0x7f... (unknown)".
            while i < len(frames) - 1 and self.symbols.frame(frames[i]).module is None:
                i += 1
        return tuple(frames[i:]), cut

    def stack_frames(self, stack_id: int) -> list[Frame]:
        """A stack id's frames, innermost first, inlined calls expanded (:meth:`stack` symbolizes
        return addresses)."""
        addresses, cut = self._stack_addresses(stack_id)
        if addresses is None:
            return [Frame(0, function=_PSEUDO_NAMES.get(stack_id, f"<stack {stack_id} not in capture>"))]
        out = self.symbols.stack(addresses)
        if cut:
            out.append(_TRUNCATED)
        return out

    def _row_key(self, stack_id: int) -> tuple[Any, ...]:
        """What makes stacks one row: their frames' keys (Frame.key(), as SymbolTable.key_id
        ints), frame by frame; a stack without frames is a row of its own.  Memoized while the
        symbols stay as they are (a table ranks the same stacks several ways)."""
        symbols = self.symbols
        if self._row_keys_version != (symbols.version, len(self.stacks)):
            self._row_keys.clear()
            self._row_keys_version = (symbols.version, len(self.stacks))
        key = self._row_keys.get(stack_id)
        if key is not None:
            return key
        if stack_id == NO_STACK:
            key = ("no-stack", stack_id)
        else:
            addresses, cut = self._stack_addresses(stack_id)
            if addresses is None:
                key = tuple(symbols.key_id(f.key()) for f in self.stack_frames(stack_id))
            else:
                key = symbols.stack_key(addresses)
                if cut:
                    key += (symbols.key_id(_TRUNCATED.key()),)
            if not key:
                key = ("no-stack", stack_id)
        self._row_keys[stack_id] = key
        return key

    def stack_rows(self, n: int | None = 10, live: bool = False, measure: str | None = None,
                   order: Callable[[StackRow], Any] | None = None) -> list[StackRow]:
        """Rows keyed by the whole symbolized stack (several stack ids with the same frames --
        an unrolled loop, several call sites on one source line -- are one row), largest first
        (or by ``order``).  ``measure``: "gross" (the default), "live", "temporary" or "peak".
        Only the rows returned are symbolized (given the frames of the row's first stack id)."""
        value = MEASURES[measure or ("live" if live else "gross")]
        rows: dict[tuple[Any, ...], StackRow] = {}
        row_key = self._row_key
        for st in self.stack_stats.values():
            est, count, exact = value(st)
            if est <= 0:
                continue
            key = row_key(st.stack_id)
            row = rows.get(key)
            if row is None:
                rows[key] = StackRow(frames=[], stack_ids=[st.stack_id], est_bytes=est, count=count, exact_bytes=exact)
            else:
                row.stack_ids.append(st.stack_id)
                row.est_bytes += est
                row.count += count
                row.exact_bytes += exact
        out = sorted(rows.values(), key=order or (lambda r: (-r.est_bytes, min(r.stack_ids))))
        if n is not None:
            out = out[:n]
        for row in out:
            if row.stack_ids[0] != NO_STACK:
                row.frames = self.stack_frames(row.stack_ids[0])
        return out

    def top_stacks(self, n: int = 10, live: bool = False) -> list[StackStats]:
        def key(s: StackStats) -> float:
            return s.live_est_bytes if live else s.est_bytes

        rows = [s for s in self.stack_stats.values() if key(s) > 0]
        rows.sort(key=lambda s: (-key(s), s.stack_id))
        return rows[:n]

    def coverage(self) -> dict[str, Any]:
        gross = self.gross_bytes
        before = self.calibration.get("before", {})
        after = self.calibration.get("after") or self.calibration.get("at-exit") or {}
        out: dict[str, Any] = {
            "stacked_bytes": self.stacked_bytes,
            "stack_coverage": round(self.stacked_bytes / gross, 4) if gross else None,
            "estimated_bytes_with_sampling": round(self.stacked_bytes + self.sampled_est_bytes),
            "estimated_coverage": round((self.stacked_bytes + self.sampled_est_bytes) / gross, 4) if gross else None,
        }
        ab, aa = before.get("allocator") or {}, after.get("allocator") or {}
        if ab and aa and "in_use" in ab and "in_use" in aa:
            delta = aa["in_use"] - ab["in_use"]
            # What memtrace's own thread came to hold meanwhile (the agent's JavaScript, its
            # symbolization) is in the allocator's figures but not the target's: taken out.
            own_b, own_a = before.get("own_bytes"), after.get("own_bytes")
            own = own_a - own_b if isinstance(own_b, int) and isinstance(own_a, int) else None
            if own:
                delta -= own
            out["allocator"] = {"source": aa.get("source"), "in_use_before": ab["in_use"],
                                "in_use_after": aa["in_use"], "in_use_delta": delta,
                                "memtrace_own_bytes": own,
                                "after_phase": "after" if "after" in self.calibration else "at-exit"}
            tracked = self.live_est_bytes
            out["live_coverage"] = round(tracked / delta, 4) if delta > 0 else None
        fb, fa = before.get("footprint") or {}, after.get("footprint") or {}
        if fb and fa and "footprint" in fb and "footprint" in fa:
            out["footprint"] = {"source": fa.get("source"), "before": fb["footprint"], "after": fa["footprint"],
                                "delta": fa["footprint"] - fb["footprint"]}
            # The agent's own tables grow resident as they fill: that much of the delta is ours.
            agb, aga = before.get("agent") or {}, after.get("agent") or {}
            if "resident" in agb and "resident" in aga:
                agent_delta = aga["resident"] - agb["resident"]
                out["footprint"]["agent_delta"] = agent_delta
                out["footprint"]["delta_without_agent"] = out["footprint"]["delta"] - agent_delta
                # Which of the agent's tables grew (the live table is most of it on a large heap).
                bb, ba = agb.get("resident_by_table"), aga.get("resident_by_table")
                if isinstance(bb, dict) and isinstance(ba, dict):
                    grown = {name: v - bb.get(name, 0) for name, v in ba.items()}
                    out["footprint"]["agent_delta_by_table"] = {name: d for name, d in grown.items() if d}
        return out

    @property
    def peak_exact(self) -> bool:
        """The peak is the true high-water mark: its composition was shipped, and no new high was
        missed (peak_missed: one the core could not record, TinyCC builds only)."""
        return self.peak is not None and self.peak.exact and self.counter("peak_missed") == 0

    def temporary_rows(self, top: int | None) -> list[StackRow]:
        """Temporary allocations by stack, most calls first (``count`` is calls)."""
        return self.stack_rows(top, measure="temporary",
                               order=lambda r: (-round(r.count), -round(r.est_bytes), min(r.stack_ids)))

    def peak_json(self, top: int) -> dict[str, Any] | None:
        p = self.peak
        if p is None:
            return None
        return {"bytes": p.bytes, "count": p.count, "held_bytes": p.held_bytes, "t": p.t_s, "exact": self.peak_exact,
                "by_stack": [r.to_json() for r in self.stack_rows(top, measure="peak")]}

    def temporary_json(self, top: int) -> dict[str, Any] | None:
        if not self.aggregates:
            return None
        rows = []
        for r in self.temporary_rows(top):
            j = r.to_json()
            j["calls"] = j.pop("count")
            del j["exact_bytes"]
            rows.append(j)
        return {"calls": self.counter("temp_calls"), "bytes": self.counter("temp_bytes"), "by_stack": rows}

    def timeline_json(self) -> dict[str, Any] | None:
        """Columns, one entry per drain (100 ms): time, tracked bytes and blocks, the peak so far,
        the allocator's in-use and the footprint (null where unread), and for the stacks that were
        among the top stacks of some sample (the TIMELINE_STACKS largest of them), their live bytes
        (null where a sample did not list them)."""
        if not self.timeline:
            return None
        samples = self.timeline
        cols: dict[str, Any] = {k: [s.get(k) for s in samples]
                                for k in ("t", "tracked_bytes", "tracked_blocks", "peak_bytes", "in_use", "footprint")}
        order: list[int] = []
        series: dict[int, list[int | None]] = {}
        for i, s in enumerate(samples):
            for sid, live in s.get("top") or []:
                if sid not in series:
                    series[sid] = [None] * len(samples)
                    order.append(sid)
                series[sid][i] = live
        largest = set(sorted(order, key=lambda sid: -max(v or 0 for v in series[sid]))[:TIMELINE_STACKS])
        cols["stacks"] = [{"stack_id": sid, "frames": [f.to_json() for f in self.stack_frames(sid)], "live": series[sid]}
                          for sid in order if sid in largest]
        return cols

    def to_json(self, capture: str | None = None, top: int = 10) -> dict[str, Any]:
        out = {
            **self.header_json("malloc", capture),
            "mode": self.mode,
            "calls": self.calls,
            "alloc_calls": self.alloc_calls,
            "failed": self.failed,
            "failed_by_stack": [{"calls": round(r.count), "stack_ids": sorted(r.stack_ids),
                                 "frames": [f.to_json() for f in r.frames]}
                                for r in self.stack_rows(top, measure="failed")],
            "gross_bytes": self.gross_bytes,
            "tiers": self.tiers,
            "live": {"count": self.live_count, "bytes": self.live_bytes,
                     "estimated_bytes": round(self.live_est_bytes)},
            "top_stacks": [r.to_json() for r in self.stack_rows(top)],
            "live_by_stack": [r.to_json() for r in self.stack_rows(top, live=True)],
            "covers": self.covers,
            "dropped": self.dropped,
            "sampled": self.counter("sampled"),
            "truncated_stacks": self.counter("truncated_stacks"),
            "nested": {"calls": self.counter("nested_calls"), "bytes": self.counter("nested_bytes"),
                       "allocator_internal": self.counter("nested_internal"),
                       "unreconciled": self.counter("nested_unreconciled")},
            "missing": self.missing,
            "coverage": self.coverage(),
            "leaks": self.leaks_json(top),
            "vm": self.vm.to_json(self.counters),
            **self.timing_json(),
        }
        if self.aggregates:
            out["peak"] = self.peak_json(top)
            out["temporary"] = self.temporary_json(top)
            out["timeline"] = self.timeline_json()
        return out

    # -- the views protocol ------------------------------------------------------------------

    def profile(self, view: str, capture_version: int | None = None) -> Profile:
        """A view's samples; each view's total is the summary's figure for it (gross, peak and
        temporary include the bytes no stack covers, as one "(no stack)" sample)."""
        p = Profile(tracer=self.tracer_name, view=view, target=self.meta.get("target", {}).get("label"))
        if view in ("gross", "live"):
            live = view == "live"
            for r in self.stack_rows(None, live=live):
                frames = r.frames if r.frames and r.stack_ids != [NO_STACK] else [UNSTACKED]
                p.samples.append(Sample(frames, int(round(r.est_bytes)), int(round(r.count))))
            if not live:
                # Bytes no stack covers (below the stack threshold, unsampled): one sample, so the
                # view adds up to the gross bytes.
                stacked = self.coverage()["estimated_bytes_with_sampling"]
                rest = self.gross_bytes - stacked
                if rest > 0:
                    p.samples.append(Sample([UNSTACKED], rest,
                                            max(0, self.alloc_calls - sum(x.count for x in p.samples))))
            return p
        if view == "leaked":
            leaks = self.leaks_json(None)
            if leaks is None:
                p.missing = "no leak scan in this capture (capture with --leaks)"
            else:
                p.samples = samples_of(leaks["leaked"]["by_stack"])
            return p
        if view in ("peak", "temporary"):
            # The section alone: the whole to_json would rank every stack by every measure.
            sec = self.peak_json(ALL_ROWS) if view == "peak" else self.temporary_json(ALL_ROWS)
            if sec is None and type(self).to_json is not MallocSummary.to_json:
                # A summary class that adds the section in its own to_json (a newer analyzer's shape).
                own = self.to_json(top=ALL_ROWS).get(view)
                sec = own if isinstance(own, dict) else None
            if sec is None or not isinstance(sec.get("by_stack"), list):
                p.missing = f"the {view} view is not in this capture ({self._why_no_aggregates(capture_version)})"
            else:
                p.samples = samples_of(sec["by_stack"])
                # As in the gross view, what no stack covers is one sample, so the total is the summary's.
                rest = int(sec.get("bytes") or 0) - sum(x.bytes for x in p.samples)
                calls = sec.get("calls", sec.get("count", sec.get("blocks")))
                if rest > 0:
                    rest_count = int(calls) - sum(x.count for x in p.samples) if isinstance(calls, int) else 0
                    p.samples.append(Sample([UNSTACKED], rest, max(0, rest_count)))
            return p
        raise ValueError(f"unknown view {view!r} (one of {', '.join(self.VIEWS)})")

    def _why_no_aggregates(self, capture_version: int | None) -> str:
        """Why there is no peak or temporary section: only the in-target aggregates keep them."""
        if capture_version == 1 or self.mode != "events":
            return "recorded by a memtrace that did not keep it yet"
        return "an --events capture: the in-target aggregates that keep it were off"

    def measured_views(self) -> list[str]:
        """The views ``stack_stats`` holds per stack id: gross and live, and the peak and temporary
        views when the in-target aggregates kept them."""
        views = ["gross", "live"]
        if self.aggregates and self.peak is not None:
            views.append("peak")
        if self.aggregates:
            views.append("temporary")
        return views

    def snapshot_counters(self, body: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """A SNAPSHOT's tracked live blocks (when it has them) and gross bytes so far."""
        out: list[tuple[str, Any]] = []
        if "live" in body:
            out.append(("tracked live blocks", body.get("live") or 0))
        out.append(("gross bytes allocated", body.get("bytes")))
        return out

    def leaks_json(self, top: int | None = 10) -> dict[str, Any] | None:
        if self.leaks is None:
            return None
        # Blocks the live table had no room for are found by the allocator walk like those from
        # before tracing (no stack): the scan's summary says how many of those there were.
        return self.leaks.to_json(self._frames_of, top, live_table_full=self.dropped["live_table_full"])

    def _frames_of(self, sid: int) -> list[Frame]:
        return self.stack_frames(sid) if sid != NO_STACK else []


_TRUNCATED = Frame(0, function="<truncated: outer frames not walked>")
_PSEUDO_NAMES = {DROPPED_STACK: "<stack dropped>", NESTED_STACK: "<nested call: stack skipped>",
                 NO_STACK: "<no stack>"}


def summarize(records: Iterable[Record]) -> MallocSummary:
    s = MallocSummary()
    events = EventFold(s.vm)
    agg = _AggFold(s.vm)
    for rec in records:
        t = rec.type
        if t == RecordType.BATCH:
            s.batches += 1
            body = rec.body
            counters = body.get("counters")
            if counters:
                s.counters = counters
            mode = body.get("mode")
            if mode is not None:
                s.mode = mode
                s.aggregates = True
                agg.body(body)
                if rec.data:
                    agg.batch(rec.data, s)
            elif rec.data:
                events.batch(rec.data, s.stacks)
        elif t == RecordType.RESULT and is_leak_result(rec.body):
            s.leaks = resolve(rec.body)
        else:
            fold_context(s, rec)
            if t == RecordType.END and rec.body.get("counters") and sum(rec.body["counters"]) >= sum(s.counters):
                s.counters = rec.body["counters"]
    if s.aggregates:
        agg.finish(s)
    else:
        events.finish(s, s.row)
    return s


class _AggFold:
    """The aggregate stream: each stack's latest totals, the compositions at the peak, the samples."""

    def __init__(self, vm: VmFold) -> None:
        self.vm = vm                                # Darwin's VM regions: never in the malloc figures
        self.totals: dict[int, list[int]] = {}
        self.masks: dict[int, tuple[int, ...]] = {}
        self.composition: dict[int, tuple[int, int]] | None = None
        self.composition_head: tuple[int, ...] = ()
        self.head: tuple[int, ...] | None = None      # the PEAK_HEAD being read
        self.pending: dict[int, tuple[int, int]] = {}
        self.peak_epoch = 0                         # the core's latest peak (batch payloads)
        self.clock: tuple[int, int] | None = None   # (core us, agent ms) of the latest batch
        self.t0: int | None = None                  # agent ms when the hooks went in
        self.samples: list[dict[str, Any]] = []
        self.live_done = False

    def body(self, body: dict[str, Any]) -> None:
        peak = body.get("peak")
        if isinstance(peak, dict):
            self.peak_epoch = max(self.peak_epoch, int(peak.get("epoch") or 0))
        if body.get("t0") is not None:
            self.t0 = body["t0"]
        clock = body.get("clock")
        if isinstance(clock, list) and len(clock) == 2:
            self.clock = (clock[0], clock[1])
        sample = body.get("sample")
        if isinstance(sample, dict):
            self.samples.append(sample)
        if body.get("live_done"):
            self.live_done = True

    def batch(self, data: bytes, s: MallocSummary) -> None:
        totals, masks, vm, vm_kinds = self.totals, self.masks, self.vm, VM_KINDS
        for r in iter_agent_tuples(data):
            rtype = r[0]
            if rtype == REC_AGG:
                sid, mask, values = r[3], r[4], r[6]
                row = totals.get(sid)
                if row is None:
                    row = totals[sid] = [0] * AGG_STRIDE
                bits = masks.get(mask)
                if bits is None:
                    bits = masks[mask] = tuple(i for i in range(32) if mask >> i & 1)
                for i, v in zip(bits, values, strict=True):
                    row[i] = v
            elif rtype == REC_STACK:
                s.stacks[r[3]] = r[4]
            elif rtype == REC_PEAK_HEAD:
                self.head = r
                self.pending = {}
                if r[3] == 0:
                    self._close_composition()
            elif rtype == REC_PEAK:
                self.pending[r[3]] = (r[4], r[5])
                if self.head is not None and len(self.pending) == self.head[3]:
                    self._close_composition()
            elif rtype == REC_LIVE:
                s.live_blocks.append((r[4], r[5], r[3], r[6]))
            # Darwin's VM regions (every mode); the rest is events mode's per-event stream, which
            # the totals above already hold.
            elif rtype == REC_ALLOC and r[1] in vm_kinds:
                vm.alloc(r[1], r[2], r[4], r[5])
            elif rtype == REC_FREE and r[1] in vm_kinds:
                vm.free(r[4], r[5])

    def _close_composition(self) -> None:
        """A composition whose every PEAK record arrived; the latest peak's wins."""
        assert self.head is not None
        if self.composition is None or self.head[4] >= self.composition_head[4]:
            self.composition = self.pending
            self.composition_head = self.head
        self.head = None
        self.pending = {}

    def seconds(self, t_ms: float) -> float | None:
        return None if self.t0 is None else round((t_ms - self.t0) / 1000, 3)

    def finish(self, s: MallocSummary) -> None:
        by_stack = s.stack_stats
        pseudo = set(PSEUDO_STACKS)
        for sid, t in self.totals.items():
            exact_count = t[_F["allocs"]] + t[_F["untracked"]] - t[_F["sampled"]]
            exact_bytes = t[_F["bytes"]] + t[_F["untracked_bytes"]] - t[_F["sampled_bytes"]]
            live_bytes = t[_F["bytes"]] - t[_F["freed_bytes"]]
            st = by_stack[sid] = StackStats(
                sid, count=exact_count, bytes=exact_bytes,
                live_count=t[_F["allocs"]] - t[_F["frees"]], live_bytes=live_bytes,
                live_est_bytes=live_bytes + t[_F["extra_weight"]] - t[_F["extra_weight_freed"]],
                temp_count=t[_F["temp"]], temp_bytes=t[_F["temp_bytes"]], failed=t[_F["failed"]])
            if sid != NO_STACK:
                # Unstacked tracked blocks (the live threshold's) belong to the live set, not to gross rows.
                st.est_bytes = exact_bytes + t[_F["sampled_weight"]]
                st.est_count = exact_count + t[_F["sampled_count_fp"]] / (1 << AGG_FP_SHIFT)
                s.sampled_est_bytes += t[_F["sampled_weight"]]
            if sid not in pseudo:
                s.stacked_bytes += exact_bytes
            s.live_count += st.live_count
            s.live_bytes += st.live_bytes
            s.live_est_bytes += st.live_est_bytes
        for x in self.samples:
            sample = dict(x)
            if isinstance(x.get("t"), (int, float)):
                sample["t"] = self.seconds(x["t"])
            s.timeline.append(sample)
        s.live_dump_complete = self.live_done
        if self.composition is None:
            return
        head = self.composition_head
        p = s.peak = Peak(bytes=head[5], count=head[6], epoch=head[4], t_us=head[7],
                          exact=head[4] == self.peak_epoch)
        if self.clock is not None:
            us, ms = self.clock
            p.t_s = self.seconds(ms - (us - p.t_us) / 1000)
        for sid, (b, c) in self.composition.items():
            st = s.row(sid)
            st.peak_bytes, st.peak_count = b, c
            p.held_bytes += b
