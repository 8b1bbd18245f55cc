"""The malloc line from one record per event: captures made before the aggregate core, and the
per-event stream of ``--events`` replayed offline.

The agent drains thread by thread, so a free on one thread can arrive before the allocation it
releases (made on another).  The agent removes a block from its live table before the real
free, so an address is never live twice: a second allocation of a live address proves the first
was freed, and a free with no live block is matched with the allocation still to come.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from memtrace.analyze.vm import VM_KINDS, VmFold
from memtrace.capture import FLAG_LIVE, FLAG_SAMPLED, NO_STACK, REC_ALLOC, REC_FREE, iter_agent_tuples


class _Totals(Protocol):
    stacked_bytes: int
    sampled_est_bytes: float
    unmatched_frees: int
    live_count: int
    live_bytes: int
    live_est_bytes: float


class EventFold:
    """The per-record hot loop, on plain dicts (this is where a report spends its time)."""

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

    def finish(self, s: _Totals, stats: Callable[[int], Any]) -> None:
        """Totals into ``s``; ``stats(stack_id)`` gives the StackStats row to fill."""
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
