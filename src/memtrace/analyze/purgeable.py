"""The purgeable line, offline: the transition matrix, who drives it, the reusable line.

Pure: capture records in, a :class:`PurgeableSummary` out.  Transitions come from the state
machine's own entries (``vm_purgable_control`` / ``mach_vm_purgable_control`` SET, and
``IOSurfaceSetPurgeable``, which IOKit applies in the kernel where a trap hook cannot see it).
Framework entries (Core Animation) are reported as calls with their callers: the transitions
they cause are already counted underneath, so counting them again would double the matrix.
``madvise`` is its own "reusable" line, never a transition (docs/domain/iosurface-purgeable.md, "madvise").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from memtrace.analyze.context import event_frames, fold_context
from memtrace.analyze.symbols import SymbolTable
from memtrace.capture import Record, RecordType

STATE_NAMES = {0: "NONVOLATILE", 1: "VOLATILE", 2: "EMPTY", 3: "DENY"}
MADVISE_NAMES = {
    "darwin": {5: "MADV_FREE", 6: "MADV_ZERO_WIRED_PAGES", 7: "MADV_FREE_REUSABLE", 8: "MADV_FREE_REUSE",
               9: "MADV_CAN_REUSE", 10: "MADV_PAGEOUT"},
    "linux": {4: "MADV_DONTNEED", 8: "MADV_FREE", 20: "MADV_COLD", 21: "MADV_PAGEOUT"},
}
STATE_MACHINE_ENTRIES = ("vm_purgable_control", "mach_vm_purgable_control")
NO_END = "the capture ends without an END record (memtrace or the machine died)"


@dataclass
class Group:
    """Events sharing a key and a stack."""

    count: int = 0
    bytes: int = 0
    unknown_bytes: int = 0          # events whose object size was not seen (created before attach)
    frames: tuple[int, ...] = ()


@dataclass
class PurgeableSummary:
    meta: dict[str, Any] = field(default_factory=dict)
    end: dict[str, Any] = field(default_factory=dict)
    recon: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    symbols: SymbolTable = field(default_factory=SymbolTable)
    counts: dict[str, Any] = field(default_factory=dict)
    transitions: dict[str, int] = field(default_factory=dict)
    transition_bytes: dict[str, int] = field(default_factory=dict)
    by_entry: dict[str, dict[str, int]] = field(default_factory=dict)
    by_caller: dict[tuple[str, str, tuple[int, ...]], Group] = field(default_factory=dict)
    keep_current: int = 0
    failed_sets: int = 0
    set_events: int = 0
    created: dict[tuple[str, tuple[int, ...]], Group] = field(default_factory=dict)
    madvise: dict[tuple[str, int, tuple[int, ...]], Group] = field(default_factory=dict)
    madvise_platform: dict[str, str] = field(default_factory=dict)
    calls: dict[tuple[str, tuple[int, ...]], Group] = field(default_factory=dict)
    warnings: list[dict[str, Any]] = field(default_factory=list)

    # -- derived ----------------------------------------------------------------

    def _controls(self) -> dict[str, dict[str, int]]:
        return self.counts.get("controls", {})

    @property
    def set_calls(self) -> int:
        """SET calls into the state machine's trap entries (exact, counted in C)."""
        return sum(c.get("set", 0) + c.get("set_from_kernel", 0) for c in self._controls().values())

    @property
    def get_calls(self) -> int:
        return sum(c.get("get", 0) for c in self._controls().values())

    def caller(self, frames: tuple[int, ...]) -> str | None:
        """The direct caller's function name (demangled nested name for C++)."""
        if not frames:
            return None
        f = self.symbols.frame(frames[0])
        return demangle_nested(f.symbol) if f.symbol else f.label()

    def labels(self, frames: tuple[int, ...]) -> list[str]:
        out = []
        for a in frames:
            f = self.symbols.frame(a)
            name = demangle_nested(f.symbol) if f.symbol else None
            out.append(f"{name} ({f.module})" if name and f.module else (name or f.label()))
        return out

    def to_json(self, capture: str | None = None, top: int = 50) -> dict[str, Any]:
        def group_rows(items: Iterable[tuple[tuple[Any, ...], Group]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
            # Stacks are kept per return address; a row is one caller *function* (several call
            # sites and deeper stacks merge), with the stack that carried most of its events.
            merged: dict[tuple[Any, ...], tuple[Group, Group, int]] = {}
            for key, g in items:
                k = (*key[:-1], self.caller(g.frames))
                if k not in merged:
                    merged[k] = (Group(), g, 0)
                total, best, n = merged[k]
                total.count += g.count
                total.bytes += g.bytes
                total.unknown_bytes += g.unknown_bytes
                merged[k] = (total, g if g.count > best.count else best, n + 1)
            rows = []
            for k, (g, best, n) in merged.items():
                row = dict(zip((*keys, "caller"), k, strict=True))
                row.update({"count": g.count, "bytes": g.bytes if g.unknown_bytes < g.count else None,
                            "stacks": n, "frames": self.labels(best.frames)})
                if g.unknown_bytes and g.unknown_bytes < g.count:
                    row["events_without_size"] = g.unknown_bytes
                rows.append(row)
            rows.sort(key=lambda r: (-r["count"], -(r["bytes"] or 0), str(r.get("caller"))))
            return rows[:top] if top else rows

        madvise_counts: dict[str, int] = {}
        madvise_bytes: dict[str, int] = {}
        standin_counts: dict[str, int] = {}
        for (entry, advice, _), g in self.madvise.items():
            target = standin_counts if entry == "mtdarwin_madvise" else madvise_counts
            target[str(advice)] = target.get(str(advice), 0) + g.count
            if entry != "mtdarwin_madvise":
                madvise_bytes[str(advice)] = madvise_bytes.get(str(advice), 0) + g.bytes
        platform = self.madvise_platform.get("madvise") or self.counts.get("madvise_platform") or "linux"
        created_bytes = sum(g.bytes for (entry, _), g in self.created.items())
        calls_json: dict[str, Any] = {}
        for row in group_rows(self.calls.items(), ("entry",)):
            e = calls_json.setdefault(row.pop("entry"), {"calls": 0, "by_caller": []})
            row.pop("bytes", None)
            e["calls"] += row["count"]
            e["by_caller"].append(row)
        return {
            "capture": capture,
            "tracer": "purgeable",
            "target": self.meta.get("target", {}).get("label"),
            "ended": self.end.get("ended", "truncated"),
            "reason": self.end.get("reason", NO_END),
            "transitions": dict(sorted(self.transitions.items())),
            "transition_bytes": dict(sorted(self.transition_bytes.items())),
            "set_calls": self.set_calls,
            "get_calls": self.get_calls,
            "purge_all_calls": sum(c.get("purge_all", 0) for c in self._controls().values()),
            "controls": self._controls(),
            "by_entry": self.by_entry,
            "keep_current": self.keep_current,
            "failed_sets": self.failed_sets,
            "stolen": {"count": self.transitions.get("2->0", 0), "bytes": self.transition_bytes.get("2->0", 0)},
            "created_purgeable": sum(g.count for g in self.created.values()),
            "created_bytes": created_bytes,
            "created_by": group_rows(self.created.items(), ("entry",)),
            "creation_calls": self.counts.get("creation_calls", {}),
            "madvise": madvise_counts,
            "madvise_bytes": madvise_bytes,
            "madvise_platform": platform,
            "madvise_names": {a: MADVISE_NAMES.get(platform, {}).get(int(a)) for a in madvise_counts},
            "madvise_all_advice": self.counts.get("madvise_all", {}),
            "madvise_standin": standin_counts,
            "madvise_by_caller": group_rows(self.madvise.items(), ("entry", "advice")),
            "by_caller": group_rows(self.by_caller.items(), ("entry", "transition")),
            "framework_calls": calls_json,
            "missing": self.missing,
            "window_s": self.meta.get("options", {}).get("window"),
            "captured_s": self.end.get("timing", {}).get("captured_s"),
        }


def demangle_nested(symbol: str) -> str:
    """`_ZN2CA6Render5Shmem12set_volatileEbPi` -> `CA::Render::Shmem::set_volatile`.

    Only the nested name (what callers are matched on); parameters are dropped.  Anything that
    is not an Itanium nested name is returned unchanged."""
    m = re.match(r"_{1,2}ZN[KVr]*", symbol)
    if m is None:
        return symbol
    pos, parts = m.end(), []
    while pos < len(symbol) and symbol[pos].isdigit():
        n = re.match(r"\d+", symbol[pos:])
        assert n is not None
        length = int(n.group())
        start = pos + len(n.group())
        parts.append(symbol[start:start + length])
        pos = start + length
    if not parts or pos >= len(symbol) or symbol[pos] != "E":
        return symbol
    return "::".join(parts)



def _bump(table: dict[Any, Group], key: Any, frames: tuple[int, ...], nbytes: int | None) -> None:
    g = table.get(key)
    if g is None:
        g = table[key] = Group(frames=frames)
    g.count += 1
    if nbytes is None:
        g.unknown_bytes += 1
    else:
        g.bytes += nbytes


def _fold_event(s: PurgeableSummary, ev: dict[str, Any]) -> None:
    kind = ev.get("type")
    if kind == "counts":
        s.counts = ev                       # cumulative: the last one wins
        return
    frames = event_frames(ev)
    if kind == "set":
        entry = ev.get("entry", "?")
        if ev.get("control") == "keep-current":
            s.keep_current += 1             # IOSurface query: reads the state, moves nothing
            s.by_entry.setdefault(entry, {})["keep_current"] = s.by_entry.get(entry, {}).get("keep_current", 0) + 1
            return
        s.set_events += 1
        old = ev.get("old_state")
        if old is None:
            s.failed_sets += 1
            return
        key = f"{old}->{ev.get('new_state')}"
        s.transitions[key] = s.transitions.get(key, 0) + 1
        nbytes = ev.get("bytes")
        s.transition_bytes[key] = s.transition_bytes.get(key, 0) + (nbytes or 0)
        per = s.by_entry.setdefault(entry, {})
        per[key] = per.get(key, 0) + 1
        _bump(s.by_caller, (entry, key, frames), frames, nbytes)
    elif kind == "create":
        if ev.get("kr") == 0:
            _bump(s.created, (ev.get("entry", "?"), frames), frames, ev.get("bytes"))
    elif kind == "madvise":
        entry = ev.get("entry", "madvise")
        s.madvise_platform[entry] = ev.get("platform", "linux")
        _bump(s.madvise, (entry, int(ev.get("advice", -1)), frames), frames, ev.get("len"))
    elif kind == "call":
        _bump(s.calls, (ev.get("entry", "?"), frames), frames, None)


def summarize(records: Iterable[Record]) -> PurgeableSummary:
    s = PurgeableSummary()
    for rec in records:
        t = rec.type
        if t == RecordType.EVENTS:
            for ev in rec.body.get("events", []):
                _fold_event(s, ev)
        else:
            fold_context(s, rec)
    return s
