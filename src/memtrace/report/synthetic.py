"""Synthetic malloc captures with known ground truth, written through the real capture format.

Used by the report tests, the golden data and ``bench/report_bench.py``: everything goes through
:class:`memtrace.capture.CaptureWriter` and :func:`memtrace.capture.encode_agent_records`, so the
bytes are exactly what a live capture would hold.  Counters are kept the way the agent keeps
them (calls and bytes per kind, six size tiers over allocations), so the analyzers' exact
counters and the per-record view agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memtrace import layout
from memtrace.capture import (
    FLAG_LIVE,
    KIND_NAMES,
    NO_STACK,
    TIER_MAX_BYTES,
    AgentRecord,
    AggRecord,
    AllocRecord,
    CaptureWriter,
    FreeRecord,
    PeakHeadRecord,
    PeakRecord,
    RecordType,
    StackRecord,
    encode_agent_records,
)

MALLOC, CALLOC, REALLOC, FREE, POSIX_MEMALIGN = (layout.KINDS[k] for k in
                                                 ("malloc", "calloc", "realloc", "free", "posix_memalign"))
MODULE_BASE = 0x5555_0000_0000
MODULE_SIZE = 0x10_0000


def tier_of(size: int) -> int:
    for i, cap in enumerate(TIER_MAX_BYTES):
        if cap is None or size <= cap:
            return i
    return len(TIER_MAX_BYTES) - 1


class SyntheticCapture:
    """Build one capture: declare stacks by frame labels, then allocate and free."""

    def __init__(self, path: Path | str, target: str, tracer: str = "malloc", window: float = 20.0,
                 module: str = "app", live_threshold: int = 4096, stack_threshold: int = 8192,
                 tid: int = 1000) -> None:
        self.writer = CaptureWriter(path, fsync_interval=3600)
        self.module = module
        self.tid = tid
        self.live_threshold = live_threshold
        self.stack_threshold = stack_threshold
        self.counters = [0] * layout.N_COUNTERS
        self._pending: list[AgentRecord] = []
        self._symbols: dict[str, int] = {}
        self._rows: list[list[Any]] = []
        self._stacks: dict[tuple[str, ...], int] = {}
        self._next_ptr = 0x7F00_0000_0000
        self.writer.write(RecordType.META, {
            "tool": "memtrace", "tool_version": "synthetic", "tracer": tracer,
            "target": {"device": "local", "app": None, "pid": None, "name": None, "argv": [target],
                       "label": target},
            "options": {"window": window, "attach_delay": 0.0,
                        "agent": {"liveThreshold": live_threshold, "stackThreshold": stack_threshold}},
        })
        self.writer.write(RecordType.RECON, {"symbols": [{"name": "malloc", "status": "found", "role": "hook"}]})
        self.writer.write(RecordType.MODULES, {"modules": [
            {"name": module, "path": f"/synthetic/{module}", "base": hex(MODULE_BASE), "size": MODULE_SIZE}]})

    # -- stacks ---------------------------------------------------------------------

    def _address(self, symbol: str) -> int:
        addr = self._symbols.get(symbol)
        if addr is None:
            addr = MODULE_BASE + 0x1000 + 0x40 * len(self._symbols)
            self._symbols[symbol] = addr
            self._rows.append([hex(addr), self.module, addr - MODULE_BASE, symbol, None, None])
        return addr

    def stack(self, *symbols: str) -> int:
        """A stack id for these frames (innermost first), interned like the agent does."""
        key = tuple(symbols)
        sid = self._stacks.get(key)
        if sid is None:
            sid = self._stacks[key] = len(self._stacks) + 1
            self._pending.append(StackRecord(self.tid, sid, tuple(self._address(s) for s in symbols)))
        return sid

    def frames(self, *symbols: str) -> list[str]:
        """Frame addresses (hex, innermost first) as the low-frequency tracers' events carry them."""
        return [hex(self._address(sym)) for sym in symbols]

    def events(self, events: list[dict[str, Any]]) -> None:
        """One EVENTS record (IOSurface, purgeable, probe tracers), after the symbols it needs."""
        if self._rows:
            self.writer.write(RecordType.SYMBOLS, {"rows": self._rows, "by": "synthetic"})
            self._rows = []
        self.writer.write(RecordType.EVENTS, {"type": "events", "events": events})

    # -- malloc events ---------------------------------------------------------------

    def alloc(self, sid: int | None, size: int, kind: int = MALLOC) -> int:
        """One allocation; stacked and live as the agent's thresholds decide.  Returns the pointer."""
        ptr = self._next_ptr
        self._next_ptr += max(16, (size + 15) & ~15)
        self._count(kind, size)
        flags = FLAG_LIVE if size >= self.live_threshold else 0
        stack_id = sid if (sid is not None and size >= self.stack_threshold) else NO_STACK
        if flags or stack_id != NO_STACK:
            self._pending.append(AllocRecord(self.tid, kind, flags, stack_id, ptr, size, size))
        return ptr

    def free(self, ptr: int, size: int) -> None:
        self.counters[layout.calls_at("free")] += 1
        if size >= self.live_threshold:
            self._pending.append(FreeRecord(self.tid, FREE, ptr, 0))

    def _count(self, kind: int, size: int) -> None:
        c = self.counters
        c[layout.calls_at(KIND_NAMES[kind])] += 1
        c[layout.bytes_at(KIND_NAMES[kind])] += size
        t = tier_of(size)
        c[layout.tier_calls_at(t)] += 1
        c[layout.tier_bytes_at(t)] += size

    def calibration(self, phase: str, in_use: int, footprint: int) -> None:
        self.writer.write(RecordType.CALIBRATION, {
            "phase": phase, "allocator": {"source": "mallinfo2", "in_use": in_use},
            "footprint": {"source": "/proc/self/status", "footprint": footprint}})

    def flush(self) -> None:
        if self._rows:
            self.writer.write(RecordType.SYMBOLS, {"rows": self._rows, "by": "synthetic"})
            self._rows = []
        if self._pending:
            data = encode_agent_records(self.tid, self._pending)
            self.writer.write(RecordType.BATCH, {"type": "events:batch", "counters": list(self.counters)}, data)
            self._pending = []

    def end(self, ended: str = "target-exited", reason: str = "the target exited on its own (normal process exit)",
            captured_s: float = 20.0, evidence: dict[str, Any] | None = None) -> None:
        self.flush()
        self.writer.write(RecordType.END, {"ended": ended, "reason": reason, "evidence": evidence or {},
                                           "counters": list(self.counters), "timing": {"captured_s": captured_s}})
        self.close()

    def close(self) -> None:
        self.writer.close()


# ---- a large aggregate capture: the scale the views must handle ----------------------------------

# Function names as a C++ program's symbolizer gives them (long template arguments included), so
# the views' name shortening and escaping are exercised at scale.
_LARGE_NAMES = ("std::vector<std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >, "
                "std::allocator<std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > > "
                ">::_M_realloc_insert",
                "std::_Hashtable<unsigned long, std::pair<unsigned long const, Node*>, std::allocator<std::pair<"
                "unsigned long const, Node*> >, std::__detail::_Select1st>::_M_rehash",
                "operator new(unsigned long)", "ggc_internal_alloc", "xmalloc", "obstack_alloc",
                "cp_parser_translation_unit", "cp_parser_declaration_seq_opt", "cp_parser_declaration",
                "cp_parser_class_specifier", "cp_parser_member_declaration", "cp_parser_function_definition",
                "instantiate_class_template<tree_node*>", "tsubst_expr", "tsubst_copy_and_build",
                "build_new_method_call", "lookup_template_class", "make_node", "copy_node", "build_decl",
                "gimplify_expr", "expand_call", "rtl_opt_pass::execute", "df_analyze", "lra_assign")


def write_large_capture(path: Path | str, stacks: int = 131_072, seed: int = 22, samples: int = 40,
                        target: str = "cc1plus") -> dict[str, int]:
    """An aggregate-mode malloc capture with ``stacks`` distinct stacks, as the in-target core ships
    them (STACK + AGG records, a peak composition, a timeline sample per drain), for the views'
    scale tests and bench/view_bench.py.  Stacks are paths through a call tree of a few thousand
    (function, line) frames, each function reached from up to four lines (so a view that merges
    by function has fewer boxes than one that splits by line); bytes fall off as a power law, as
    on real captures (a few stacks hold most bytes, most hold very little).

    Returns the ground truth: ``{"stacks", "bytes", "allocs", "live_bytes", "peak_bytes"}``."""
    import random

    rng = random.Random(seed)
    writer = CaptureWriter(path, fsync_interval=3600)
    module = target
    names = list(_LARGE_NAMES) + [f"{p}_{i}" for i in range(900)
                                  for p in ("parse", "lower", "emit")[i % 3:i % 3 + 1]]
    writer.write(RecordType.META, {
        "tool": "memtrace", "tool_version": "synthetic", "tracer": "malloc",
        "target": {"device": "local", "app": None, "pid": None, "name": None, "argv": [target], "label": target},
        "options": {"window": 60.0, "attach_delay": 0.0, "agent": {"liveThreshold": 0, "stackThreshold": 0}}})
    writer.write(RecordType.MODULES, {"modules": [
        {"name": module, "path": f"/synthetic/{module}", "base": hex(MODULE_BASE), "size": 0x4000_0000}]})
    rows: list[list[Any]] = []
    address: dict[tuple[int, int], int] = {}

    def frame(fn: int, line: int) -> int:
        a = address.get((fn, line))
        if a is None:
            a = address[(fn, line)] = MODULE_BASE + 0x1000 + 0x10 * len(address)
            stem = "".join(c for c in names[fn].split("(")[0].split("::")[-1].lower() if c.isalpha())[:16] or "rt"
            rows.append([hex(a), module, a - MODULE_BASE, names[fn], f"/src/gcc/{stem}.cc", 100 + line])
        return a

    # Stacks: a shared prefix (the runtime's entry), then a random walk through the tree: every
    # (depth, parent) picks among a few children, so the paths share callers as real programs do.
    prefix = (frame(3, 0),)
    seen: set[tuple[int, ...]] = set()
    all_stacks: list[tuple[int, ...]] = []
    while len(all_stacks) < stacks:
        depth = rng.randint(8, 20)
        path_frames: list[int] = []
        node = 0
        for d in range(depth):
            node = (node * 7 + rng.randrange(3 if d < 4 else 6) + d * 31) % len(names)
            path_frames.append(frame(node, rng.randrange(4)))
        key = tuple(reversed(path_frames)) + prefix        # innermost first, the runtime's entry last
        if key not in seen:
            seen.add(key)
            all_stacks.append(key)
    writer.write(RecordType.SYMBOLS, {"rows": rows, "by": "synthetic"})
    counters = [0] * layout.N_COUNTERS
    total_bytes = total_allocs = live_total = 0
    totals: list[tuple[int, int, int, int]] = []         # (allocs, bytes, frees, freed bytes) per stack
    for rank in range(stacks):
        allocs = 1 + int(5000 / (rank + 1) ** 0.7)
        size = 16 * (1 + (rank * 2654435761) % 512)
        b = allocs * size
        frees = allocs - (allocs // 3 if rank % 5 == 0 else 0)
        totals.append((allocs, b, frees, frees * size))
        total_bytes += b
        total_allocs += allocs
        live_total += b - frees * size
    counters[layout.calls_at("malloc")] = total_allocs
    counters[layout.bytes_at("malloc")] = total_bytes
    counters[layout.calls_at("free")] = sum(t[2] for t in totals)
    top_live = sorted(range(stacks), key=lambda i: -(totals[i][1] - totals[i][3]))[:16]
    t0 = 1000
    per_batch = max(1, stacks // samples)
    peak_bytes = 0
    for k in range(samples):
        records: list[AgentRecord] = []
        lo, hi = k * per_batch, (stacks if k == samples - 1 else (k + 1) * per_batch)
        for i in range(lo, hi):
            sid = i + 1
            allocs, b, frees, freed = totals[i]
            records.append(StackRecord(0, sid, all_stacks[i]))
            records.append(AggRecord(sid, {"allocs": allocs, "bytes": b, "frees": frees, "freed_bytes": freed}))
        frac = (k + 1) / samples
        tracked = live_total if k == samples - 1 else int(live_total * frac)
        peak_bytes = max(peak_bytes, tracked)
        body = {"t": t0 + 100 * (k + 1), "mode": "aggregate", "counters": counters, "t0": t0,
                "clock": [5_000_000 + 100_000 * (k + 1), t0 + 100 * (k + 1)],
                "peak": {"bytes": peak_bytes, "epoch": k + 1},
                "sample": {"t": t0 + 100 * (k + 1), "tracked_bytes": tracked, "tracked_blocks": int(frac * 1000),
                           "peak_bytes": peak_bytes, "in_use": tracked + (8 << 20),
                           "footprint": tracked + (900 << 20),
                           "top": [[i + 1, int((totals[i][1] - totals[i][3]) * frac)] for i in top_live]}}
        if k == samples - 1:
            # The peak is the end (live bytes only grow here): every stack still holding bytes.
            comp = [PeakRecord(i + 1, totals[i][1] - totals[i][3], totals[i][0] - totals[i][2])
                    for i in range(stacks) if totals[i][1] > totals[i][3]]
            records.insert(0, PeakHeadRecord(len(comp), samples, sum(r.bytes for r in comp),
                                             sum(r.count for r in comp), 5_000_000 + 100_000 * samples))
            records[1:1] = comp
        writer.write(RecordType.BATCH, body, encode_agent_records(0, records))
    writer.write(RecordType.END, {"ended": "target-exited", "reason": "the target exited on its own",
                                  "evidence": {}, "counters": counters, "timing": {"captured_s": samples / 10}})
    writer.close()
    return {"stacks": stacks, "bytes": total_bytes, "allocs": total_allocs, "live_bytes": live_total,
            "peak_bytes": live_total}
