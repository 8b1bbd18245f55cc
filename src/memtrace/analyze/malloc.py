"""The malloc line, offline: exact counters, live set at end, stacks, coverage.

Pure: an iterator of capture records in, a :class:`MallocSummary` out.  Memory
is bounded by distinct stacks and live blocks, never by the number of events.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from memtrace.analyze.context import CaptureContext, fold_context
from memtrace.analyze.leaks import LeakScan, is_leak_result, resolve
from memtrace.analyze.vm import VM_KINDS, VmFold
from memtrace.capture import (
    C_CALLS,
    C_TIER_BYTES,
    C_TIER_CALLS,
    COUNTER_NAMES,
    DROPPED_STACK,
    FLAG_LIVE,
    FLAG_SAMPLED,
    KIND_NAMES,
    NO_STACK,
    REC_ALLOC,
    REC_FREE,
    TIER_MAX_BYTES,
    Record,
    RecordType,
    alloc_totals,
    iter_agent_tuples,
)
from memtrace.frames import Frame, stack_key


@dataclass
class StackStats:
    stack_id: int
    count: int = 0              # exact allocations seen with this stack
    bytes: int = 0              # their exact bytes
    est_bytes: float = 0.0      # exact + sampled weights (unbiased estimate)
    est_count: float = 0.0
    live_count: int = 0
    live_bytes: int = 0
    live_est_bytes: float = 0.0


@dataclass
class StackRow:
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


@dataclass
class MallocSummary(CaptureContext):
    counters: list[int] = field(default_factory=lambda: [0] * 64)
    calibration: dict[str, dict[str, Any]] = field(default_factory=dict)
    stacks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    by_stack: dict[int, StackStats] = field(default_factory=dict)
    live_count: int = 0
    live_bytes: int = 0
    live_est_bytes: float = 0.0
    stacked_bytes: int = 0
    sampled_est_bytes: float = 0.0
    unmatched_frees: int = 0
    batches: int = 0
    leaks: LeakScan | None = None      # --leaks: the scan, joined with the live blocks it ran on
    vm: VmFold = field(default_factory=VmFold)     # Darwin's VM line, apart from the malloc family

    # -- derived ----------------------------------------------------------------

    @property
    def calls(self) -> dict[str, int]:
        return {name: self.counters[C_CALLS + k] for k, name in KIND_NAMES.items()}

    @property
    def gross_bytes(self) -> int:
        return alloc_totals(self.counters)[1]

    @property
    def alloc_calls(self) -> int:
        return alloc_totals(self.counters)[0]

    @property
    def tiers(self) -> list[dict[str, Any]]:
        return [{"max_bytes": m, "calls": self.counters[C_TIER_CALLS + i], "bytes": self.counters[C_TIER_BYTES + i]}
                for i, m in enumerate(TIER_MAX_BYTES)]

    @property
    def dropped(self) -> dict[str, int]:
        d = {COUNTER_NAMES[i]: self.counters[i] for i in (44, 45, 46, 47)}
        d["unmatched_frees"] = self.unmatched_frees
        return d

    def stack(self, stack_id: int) -> list[Frame]:
        """A stack's frames, innermost first, inlined calls expanded."""
        frames = self.stacks.get(stack_id)
        if frames is None:
            return [Frame(0, function="<stack dropped>" if stack_id == DROPPED_STACK
                          else f"<stack {stack_id} not in capture>")]
        # Entries Frida redirects with a trampoline (Interceptor.replace) leave its
        # return address on top: a frame in no module, before the real caller.
        i = 0
        while i < len(frames) - 1 and self.symbols.frame(frames[i]).module is None:
            i += 1
        return self.symbols.stack(frames[i:])

    def stack_rows(self, n: int | None = 10, live: bool = False) -> list[StackRow]:
        """Rows keyed by the whole symbolized stack (several stack ids with the same frames --
        an unrolled loop, several call sites on one source line -- are one row), largest first."""
        rows: dict[tuple[Any, ...], StackRow] = {}
        for st in self.by_stack.values():
            est = st.live_est_bytes if live else st.est_bytes
            if est <= 0:
                continue
            frames = self.stack(st.stack_id) if st.stack_id != NO_STACK else []
            key = stack_key(frames) if frames else ("no-stack", st.stack_id)
            row = rows.get(key)
            if row is None:
                row = rows[key] = StackRow(frames=frames, stack_ids=[])
            row.stack_ids.append(st.stack_id)
            row.est_bytes += est
            row.count += st.live_count if live else st.est_count
            row.exact_bytes += st.live_bytes if live else st.bytes
        out = sorted(rows.values(), key=lambda r: (-r.est_bytes, min(r.stack_ids)))
        return out if n is None else out[:n]

    def top_stacks(self, n: int = 10, live: bool = False) -> list[StackStats]:
        key = (lambda s: s.live_est_bytes) if live else (lambda s: s.est_bytes)
        rows = [s for s in self.by_stack.values() if key(s) > 0]
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
            out["allocator"] = {"source": aa.get("source"), "in_use_before": ab["in_use"],
                                "in_use_after": aa["in_use"], "in_use_delta": delta,
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
        return out

    def to_json(self, capture: str | None = None, top: int = 10) -> dict[str, Any]:
        return {
            **self.header_json("malloc", capture),
            "calls": self.calls,
            "alloc_calls": self.alloc_calls,
            "gross_bytes": self.gross_bytes,
            "tiers": self.tiers,
            "live": {"count": self.live_count, "bytes": self.live_bytes,
                     "estimated_bytes": round(self.live_est_bytes)},
            "top_stacks": [r.to_json() for r in self.stack_rows(top)],
            "live_by_stack": [r.to_json() for r in self.stack_rows(top, live=True)],
            "dropped": self.dropped,
            "sampled": self.counters[49],
            "truncated_stacks": self.counters[48],
            "missing": self.missing,
            "coverage": self.coverage(),
            "leaks": self.leaks_json(top),
            "vm": self.vm.to_json(self.counters),
            **self.timing_json(),
        }

    def leaks_json(self, top: int | None = 10) -> dict[str, Any] | None:
        return None if self.leaks is None else self.leaks.to_json(self._frames_of, top)

    def _frames_of(self, sid: int) -> list[Frame]:
        return self.stack(sid) if sid != NO_STACK else []


def summarize(records: Iterable[Record]) -> MallocSummary:
    s = MallocSummary()
    fold = _Fold(s.vm)
    for rec in records:
        t = rec.type
        if t == RecordType.BATCH:
            s.batches += 1
            counters = rec.body.get("counters")
            if counters:
                s.counters = counters
            if rec.data:
                fold.batch(rec.data, s.stacks)
        elif t == RecordType.RESULT and is_leak_result(rec.body):
            s.leaks = resolve(rec.body, fold.live)
        else:
            fold_context(s, rec)
            if t == RecordType.END and rec.body.get("counters") and sum(rec.body["counters"]) >= sum(s.counters):
                s.counters = rec.body["counters"]
    fold.finish(s)
    return s


class _Fold:
    """The per-record hot loop, on plain dicts (this is where a report spends its time).

    The agent drains thread by thread, so a free on one thread can arrive before the
    allocation it releases (made on another).  The agent removes a block from its live
    table before the real free, so an address is never live twice: a second allocation
    of a live address proves the first was freed, and a free with no live block is
    matched with the allocation still to come.
    """

    def __init__(self, vm: VmFold | None = None) -> None:
        self.vm = vm if vm is not None else VmFold()   # VM-kind records go there, never into the malloc figures
        self.exact: dict[int, list[int]] = {}      # stack -> [exact allocations, their bytes]
        self.sampled: dict[int, float] = {}        # stack -> summed sample weights
        self.sampled_count: dict[int, float] = {}  # stack -> estimated allocations
        self.live: dict[int, tuple[int, ...]] = {}   # ptr -> its ALLOC record (iter_agent_tuples)
        self.replaced: dict[int, int] = {}         # ptr -> frees owed to an overwritten entry
        self.early: dict[int, int] = {}            # ptr -> frees seen before their alloc

    def batch(self, data: bytes, stacks: dict[int, tuple[int, ...]]) -> None:
        exact, live, replaced, early = self.exact, self.live, self.replaced, self.early
        exact_get, live_pop = exact.get, live.pop
        rec_alloc, rec_free, f_sampled, f_live, no_stack = REC_ALLOC, REC_FREE, FLAG_SAMPLED, FLAG_LIVE, NO_STACK
        vm_kinds = VM_KINDS
        for r in iter_agent_tuples(data):
            rtype = r[0]
            if rtype == rec_alloc:
                _, kind, flags, sid, p, size, weight = r
                if kind in vm_kinds:
                    self.vm.alloc(kind, flags, p, size)
                    continue
                if flags & f_sampled:
                    if sid != no_stack:
                        self.sampled[sid] = self.sampled.get(sid, 0.0) + weight
                        self.sampled_count[sid] = self.sampled_count.get(sid, 0.0) + (weight / size if size else 0)
                else:
                    if sid != no_stack:
                        acc = exact_get(sid)
                        if acc is None:
                            exact[sid] = [1, size]
                        else:
                            acc[0] += 1
                            acc[1] += size
                if flags & f_live:
                    if early and p in early:
                        owed = early[p]
                        if owed == 1:
                            del early[p]
                        else:
                            early[p] = owed - 1
                        continue
                    if p in live:
                        replaced[p] = replaced.get(p, 0) + 1
                    live[p] = r      # the record itself: no new object per live block
            elif rtype == rec_free:
                p = r[4]
                if r[1] in vm_kinds:
                    self.vm.free(p, r[5])
                    continue
                if replaced and p in replaced:
                    owed = replaced[p]
                    if owed == 1:
                        del replaced[p]
                    else:
                        replaced[p] = owed - 1
                elif live_pop(p, None) is None:
                    early[p] = early.get(p, 0) + 1
            else:
                stacks[r[3]] = r[4]

    def finish(self, s: MallocSummary) -> None:
        by_stack = s.by_stack

        def stats(sid: int) -> StackStats:
            st = by_stack.get(sid)
            if st is None:
                st = by_stack[sid] = StackStats(sid)
            return st

        for sid, (n, nbytes) in self.exact.items():
            st = stats(sid)
            st.count = n
            st.bytes = nbytes
            st.est_count += n
            st.est_bytes += st.bytes
            s.stacked_bytes += st.bytes
        for sid, w in self.sampled.items():
            st = stats(sid)
            st.est_bytes += w
            st.est_count += self.sampled_count[sid]
            s.sampled_est_bytes += w
        s.unmatched_frees = sum(self.early.values())
        f_sampled = FLAG_SAMPLED
        for r in self.live.values():
            sid, size = r[3], r[5]
            weight = r[6] if r[2] & f_sampled else size
            s.live_count += 1
            s.live_bytes += size
            s.live_est_bytes += weight
            st = stats(sid)
            st.live_count += 1
            st.live_bytes += size
            st.live_est_bytes += weight
