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
    C_BYTES,
    C_CALLS,
    C_TIER_BYTES,
    C_TIER_CALLS,
    FLAG_LIVE,
    NO_STACK,
    TIER_MAX_BYTES,
    AgentRecord,
    AllocRecord,
    CaptureWriter,
    FreeRecord,
    RecordType,
    StackRecord,
    encode_agent_records,
)

MALLOC, CALLOC, REALLOC, FREE, POSIX_MEMALIGN = 0, 1, 2, 3, 4
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
        self.counters[C_CALLS + FREE] += 1
        if size >= self.live_threshold:
            self._pending.append(FreeRecord(self.tid, FREE, ptr, 0))

    def _count(self, kind: int, size: int) -> None:
        c = self.counters
        c[C_CALLS + kind] += 1
        c[C_BYTES + kind] += size
        t = tier_of(size)
        c[C_TIER_CALLS + t] += 1
        c[C_TIER_BYTES + t] += size

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
