"""Stacks as a capture streams in: each new return address symbolized once, families for the live view.

The capture loop hands every agent batch and JSON event here.  Addresses never seen before
are queued; :meth:`StacksSeen.symbolize` resolves the queue — on the host from the module
files for a local target (works after the target died), by the agent otherwise — and returns
the SYMBOLS rows to write.  When the UI shows families, bytes are kept per stack too.
"""

from __future__ import annotations

import contextlib
import sys
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtrace.capture import (
    AGG_FIELDS,
    FLAG_SAMPLED,
    REC_AGG,
    REC_ALLOC,
    REC_STACK,
    CaptureError,
    DeferredBytes,
    agg_values,
    iter_stacks_and_aggs,
)

if TYPE_CHECKING:
    from memtrace.analyze.symbols import SymbolTable
    from memtrace.symbols import HostSymbolizer

Rows = list[list[Any]]
HOST_ROUND = 20000      # addresses per SYMBOLS record the host writes (StacksSeen.symbolize)
HELD_MAX = 64 << 20     # bytes of batches held unread at most (StacksSeen.batch)
# A stack's gross bytes from its aggregate totals: tracked + untracked + sampled weights - sampled sizes.
_GROSS = tuple(k for k in ("bytes", "untracked_bytes", "sampled_weight") if k in AGG_FIELDS)


class StacksSeen:
    def __init__(self, want_families: bool) -> None:
        self.want_families = want_families
        self._symtab: SymbolTable | None = None
        self.host: HostSymbolizer | None = None
        self._seen: set[int] = set()
        self.pending: list[int] = []
        self._frames: dict[Any, tuple[int, ...]] = {}
        self._bytes: dict[Any, int] = {}
        self._totals: dict[int, dict[str, int]] = {}   # aggregate core: each stack's latest totals
        self._aggregates = False
        self._held: list[bytes | DeferredBytes] = []      # batches not read yet (batch), and their bytes
        self._held_bytes = 0
        self.uuids: dict[str, tuple[str, ...]] = {}      # module name -> the Mach-O UUID the agent read
        self.device_tree: Path | None = None             # a remote device's shared-cache symbols, if here

    @property
    def symtab(self) -> SymbolTable:
        """Modules for host symbols; labels for families.  Made at first use: its module (and
        the demangler's) is imported while Frida injects, not before the target is spawned."""
        if self._symtab is None:
            from memtrace.analyze.symbols import SymbolTable

            self._symtab = SymbolTable()
        return self._symtab

    def symbolize_on_host(self) -> None:
        from memtrace.symbols import HostSymbolizer  # symbolic: imported here, not at a capture's start

        self.host = HostSymbolizer(self.symtab.modules)

    def modules(self, modules: list[dict[str, Any]]) -> None:
        self.symtab.add_modules(modules)
        for m in modules:
            if m.get("uuid"):
                self.uuids[m["name"]] = (m["uuid"],)

    def batch(self, data: bytes | DeferredBytes) -> None:
        """An agent batch from a C core: its STACK records, and bytes per stack for families.

        Without families (no live panel) a batch's stacks are wanted only when its addresses are
        named (:meth:`symbolize`), which for a local target is once it has run a while
        (capture_loop.NAMES_QUIET_S): the batch is held until then, HELD_MAX bytes at most.
        Reading the stacks out of every drain as it came was most of the host's CPU while a short
        target ran, beside it on a machine they share."""
        if not data:
            return
        if self.want_families:
            # A record no agent should write: the live view skips the rest of this batch; the capture
            # keeps its bytes, and reading it back names the record (issue 26).
            with contextlib.suppress(CaptureError):
                self._fold(bytes(data))
            return
        self._held.append(data)
        self._held_bytes += len(data)
        if self._held_bytes > HELD_MAX:
            self._fold_held()

    def _fold_held(self) -> None:
        """The held batches' return addresses, new ones queued to be named.  No families, so only
        the addresses are wanted: each stack's frames are taken as one array, not a tuple a stack
        (cc1plus's 48,000 stacks, 1.7 M frames, all read at its end)."""
        held, self._held, self._held_bytes = self._held, [], 0
        found: set[int] = set()
        for data in held:
            with contextlib.suppress(CaptureError):      # (as batch: the capture names the record)
                for r in iter_stacks_and_aggs(bytes(data), aggs=False, raw_frames=True):
                    frames = array("Q")
                    frames.frombytes(r[4])
                    if sys.byteorder != "little":       # (the records' words are little-endian)
                        frames.byteswap()
                    found.update(frames)
        found -= self._seen
        self._seen |= found
        self.pending += sorted(found)

    def _fold(self, data: bytes) -> None:
        """A batch's STACK records, and bytes per stack for families (batch)."""
        frames_of, bytes_of = self._frames, self._bytes
        # Only STACK, AGG and (without aggregates) ALLOC records: the rest is stepped over.
        for r in iter_stacks_and_aggs(data, allocs=not self._aggregates):
            if r[0] == REC_AGG:
                # The aggregate core's running totals (with --events, ALLOC records come too: not added twice).
                self._aggregates = True
                t = self._totals.setdefault(r[3], {})
                t.update(agg_values(r[4], r[6]))
                bytes_of[r[3]] = sum(t.get(k, 0) for k in _GROSS) - t.get("sampled_bytes", 0)
            elif r[0] == REC_ALLOC:
                if not self._aggregates:
                    sid = r[3]
                    bytes_of[sid] = bytes_of.get(sid, 0) + (r[6] if r[2] & FLAG_SAMPLED else r[5])
            elif r[0] == REC_STACK:
                frames_of[r[3]] = r[4]
                self._note(r[4])

    def events(self, events: list[dict[str, Any]]) -> None:
        """JSON events carry their stacks as "frames": ["0x...", ...]; a thread's start "routine" is a
        function's first byte, noted one byte in because every address is read as a return
        address (the symbolizer steps back one)."""
        for ev in events:
            frames = tuple(int(f, 16) if isinstance(f, str) else int(f) for f in ev.get("frames") or ())
            routine = ev.get("routine")
            self._note(frames + ((int(routine, 16) + 1,) if isinstance(routine, str) else ()))
            size = ev.get("bytes", ev.get("alloc_size"))
            if frames and isinstance(size, int) and self.want_families:
                self._frames[frames] = frames
                self._bytes[frames] = self._bytes.get(frames, 0) + size

    def _note(self, addresses: tuple[int, ...]) -> None:
        seen = self._seen
        if seen.issuperset(addresses):      # most new stacks' frames are known already (in C, at once)
            return
        for a in addresses:
            if a not in seen:
                seen.add(a)
                self.pending.append(a)

    def images(self) -> list[dict[str, Any]]:
        """Which file served each module's symbols (host symbolization), for the SYMBOLS record."""
        return self.host.images(new_only=True) if self.host is not None else []

    def symbolize(self, by_agent: Callable[[list[int]], Rows | None] | None,
                  final: bool = False) -> list[tuple[Rows, str]]:
        """Resolve the queue; returns (rows, by) pairs to write as SYMBOLS records.

        ``by_agent`` is None when the agent cannot be asked (gone, or a host-symbolized target).
        The agent is asked only once the window has closed (``final``, after the last calibration):
        symbolizing inside the target (CoreSymbolication on a device, rebuilt after every dlopen)
        puts its heap into the very figures being measured and can stall the target past the
        host's rpc timeout.  Until then its addresses wait; ``memtrace symbolize`` can do better
        on the host later (the modules carry their UUIDs)."""
        out: list[tuple[Rows, str]] = []
        self._fold_held()
        if not self.pending:
            return out
        if self.host is not None:
            # In records of HOST_ROUND addresses at most: the round at a target's end may name a
            # whole run's (a reader refuses a record past 256 MiB of JSON).
            while self.pending:
                rows = self.host.symbolize(self.pending[:HOST_ROUND])
                self.symtab.add_rows(rows)
                del self.pending[:HOST_ROUND]
                out.append((rows, "host"))
            return out
        if not final:
            return out
        if self.device_tree is not None:
            out += self._by_device_symbols()
        if by_agent is None:
            return out
        while self.pending:
            chunk = self.pending[:2000]
            answered = by_agent(chunk)
            if answered is None:
                break
            self.symtab.add_rows(answered)
            out.append((answered, "agent"))
            del self.pending[:len(chunk)]
        return out

    def _by_device_symbols(self) -> list[tuple[Rows, str]]:
        """The host names what it can first, from the device's shared-cache symbols on this machine
        (by the modules' UUIDs); only the rest is left to the agent."""
        from memtrace.errors import MemtraceError
        from memtrace.symbols.device import DeviceSymbols
        from memtrace.symbols.service import Symbolizer

        assert self.device_tree is not None
        try:
            tree = DeviceSymbols(self.device_tree)
        except (MemtraceError, OSError):
            return []
        sym = Symbolizer(self.symtab.modules, [], ids=self.uuids, system_dirs=(), device_symbols=tree)
        rows = [row for row in sym.symbolize(self.pending) if row[3] is not None]
        if not rows:
            return []
        named = {int(row[0], 16) for row in rows}
        self.symtab.add_rows(rows)
        self.pending = [a for a in self.pending if a not in named]
        return [(rows, "host: device symbols")]

    def label(self, sid: int) -> str:
        """A stack for the live view: its first frame outside the allocator and runtime (the
        families' signature), ``← caller``."""
        frames = self._frames.get(sid)
        if not frames:
            return f"stack {sid}"
        # (the families' rules: imported when the live view first asks, not at a capture's start)
        from memtrace.analyze.families import builtin_rules

        labels = self.symtab.labels(frames)
        sig = builtin_rules().signature(labels) or labels
        return " ← ".join(str(x) for x in sig[:2])

    def families(self, top: int = 200) -> list[tuple[str, int]]:
        """Top stack families so far, from the biggest stacks (cheap enough for a 1 s tick)."""
        if not self.want_families:
            return []
        from memtrace.analyze.families import classify as classify_family

        ranked = sorted(self._bytes.items(), key=lambda kv: -kv[1])[:top]
        totals: dict[str, int] = {}
        for sid, nbytes in ranked:
            frames = self._frames.get(sid)
            if not frames:
                continue
            name = classify_family(self.symtab.labels(frames))
            totals[name] = totals.get(name, 0) + nbytes
        return sorted(totals.items(), key=lambda kv: -kv[1])[:5]
