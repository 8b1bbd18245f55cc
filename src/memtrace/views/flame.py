"""A profile as the flame graph's tree, built here once so a page never carries every stack.

Pages used to embed every sample with its frames spelled out (a capture with 131,072 stacks made a
146 MB page).  Here the samples are merged into the tree the page draws, and the tree is written
compactly:

* **merged by function**, as every flame-graph tool does: two call sites of one function under one
  caller are one box (their ``file:line`` locations go to the tooltip); ``by_line=True`` keeps one
  box per source line instead;
* **small nodes folded**: the children of a node that each hold less than ``min_fraction`` of the
  view's total become one ``other`` node under that parent (its bytes and count are their exact
  sums, so every total stays exact; the tooltip says how many were folded);
* **frames deduplicated**: a name or a location is written once in a string table, nodes refer to it
  by index.

The result for one view is ``{"nodes": [parent, name, where, bytes, count, folded] * n}`` in
depth-first order (the root, "all", first; a node's parent always comes before it), with the shared
``names`` and ``wheres`` tables in the page's data.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

from memtrace.frames import Frame

MIN_FRACTION = 0.001        # a node under 0.1 % of the view's total folds into its parent's "other"
NODE_FIELDS = 6             # parent, name, where, bytes, count, folded
OTHER = "other"
MAX_WHERES = 4              # file:line locations listed per node (then "+N more")

INT64_MAX = (1 << 63) - 1


def frame_key(f: Frame, by_line: bool) -> tuple[Any, ...]:
    """Which frames share a box: same function (and module); with ``by_line``, same source line too.
    An unnamed frame is its module and code offset (nothing says two offsets are one function)."""
    if f.function is None:
        return (None, f.module, f.offset if f.module is not None else f.address)
    if by_line:
        return (f.function, f.module, f.file, f.line, f.inlined)
    return (f.function, f.module, f.inlined)


def frame_label(f: Frame) -> str:
    return f.name() + (" [inlined]" if f.inlined else "")


class Strings:
    """A string table: each distinct string written once."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        i = self._index.get(s)
        if i is None:
            i = self._index[s] = len(self.items)
            self.items.append(s)
        return i


_KEYS = 1 << 32     # frame key ids per parent in the tree's index


class Tree:
    """Every stack of a capture merged into one call tree (root first), built once; each view then
    only weighs its leaves (:meth:`encode`).  Nodes are parallel lists indexed by node id, so a
    capture with a million distinct call paths stays a few lists, not a million objects."""

    def __init__(self, by_line: bool = False) -> None:
        self.by_line = by_line
        self.parent = array("l", [-1])         # a node's parent; children are found at encode time
        self.label: list[str] = ["all"]
        self.wheres: list[Any] = [None]        # None, one "file:line", or a list of up to MAX_WHERES
        self._index: dict[int, int] = {}       # parent id * _KEYS + frame key id -> node id
        self._keys: dict[tuple[Any, ...], int] = {}
        self._frames: dict[Frame, tuple[int, str, str | None]] = {}       # -> (key id, label, where)
        self._addresses: dict[int, list[tuple[int, str, str | None]]] = {}   # return address -> its frames'

    def _frame(self, f: Frame) -> tuple[int, str, str | None]:
        hit = self._frames.get(f)
        if hit is None:
            key = frame_key(f, self.by_line)
            kid = self._keys.get(key)
            if kid is None:
                kid = self._keys[key] = len(self._keys)
            hit = self._frames[f] = (kid, frame_label(f), f.location())
        return hit

    def add(self, frames: list[Frame]) -> int:
        """The node of one stack (frames innermost first), created as needed."""
        return self._walk(self._frame(f) for f in reversed(frames))

    def add_addresses(self, addresses: tuple[int, ...], symbols: Any) -> int:
        """The node of one captured stack (return addresses innermost first): each address is
        symbolized once for the whole tree.  Leading addresses in no module are skipped, as
        :meth:`memtrace.analyze.malloc.MallocSummary.stack_frames` does (an Interceptor trampoline's)."""
        i = 0
        while i < len(addresses) - 1 and symbols.frame(addresses[i]).module is None:
            i += 1
        memo = self._addresses
        steps: list[tuple[int, str, str | None]] = []
        for a in reversed(addresses[i:]):
            hit = memo.get(a)
            if hit is None:
                hit = memo[a] = [self._frame(f) for f in reversed(symbols.frames_of(a))]
            steps += hit
        return self._walk(steps)

    def _walk(self, steps: Iterable[tuple[int, str, str | None]]) -> int:
        node = 0
        index, parent, wheres = self._index, self.parent, self.wheres
        for key, label, where in steps:
            slot = node * _KEYS + key
            kid = index.get(slot)
            if kid is None:
                kid = index[slot] = len(parent)
                parent.append(node)
                self.label.append(label)
                wheres.append(where)
            elif where and wheres[kid] is not where and wheres[kid] != where:
                self._where(kid, where)
            node = kid
        return node

    def done(self) -> None:
        """No more stacks: the index that finds a child is freed (encode does not need it)."""
        self._index.clear()
        self._frames.clear()
        self._addresses.clear()

    def _where(self, node: int, where: str) -> None:
        w = self.wheres[node]
        if w is None:
            self.wheres[node] = where
        elif isinstance(w, str):
            if w != where:
                self.wheres[node] = [w, where]
        elif where not in w and len(w) <= MAX_WHERES:
            w.append(where)

    def encode(self, leaves: Iterable[tuple[int, int, int]], names: Strings, wheres: Strings,
               min_fraction: float = MIN_FRACTION) -> list[int]:
        """One view: ``leaves`` are (node, bytes, count) of its stacks; sums go up to the root, the
        children of each node under ``min_fraction`` of the total fold into one "other" node (exact
        sums; a lone small child is kept as itself), and the visible tree comes out as flat rows
        (module docstring), children largest first."""
        n = len(self.parent)
        size = [0] * n
        count = [0] * n
        for node, b, c in leaves:
            if b > 0:
                size[node] += b
                count[node] += c
        parent = self.parent
        for node in range(n - 1, 0, -1):       # a child's id is always above its parent's
            if size[node]:
                size[parent[node]] += size[node]
                count[parent[node]] += count[node]
        limit = size[0] * min_fraction
        # The children of every node big enough to draw its callees (ids ascend from parent to child).
        kids: dict[int, list[int]] = {0: []}
        for node in range(1, n):
            if size[node] > 0:
                up = parent[node]
                siblings = kids.get(up)
                if siblings is not None:
                    siblings.append(node)
                    if size[node] >= limit:
                        kids[node] = []
        out: list[int] = []
        label, where_of = self.label, self.wheres
        stack: list[tuple[int, int]] = [(0, -1)]
        row = 0
        while stack:
            node, up = stack.pop()
            if node < 0:                        # an "other" node: -(the parent's id) - 1
                small = [k for k in kids[-node - 1] if size[k] < limit]
                out += [up, names(OTHER), wheres(""), sum(size[k] for k in small), sum(count[k] for k in small),
                        len(small)]
                row += 1
                continue
            w = where_of[node]
            text = "" if w is None else w if isinstance(w, str) else (
                ", ".join(w[:MAX_WHERES]) + (" and more" if len(w) > MAX_WHERES else ""))
            out += [up, names(label[node]), wheres(text), size[node], count[node], 0]
            me = row
            row += 1
            children = kids.get(node) or []
            shown = [k for k in children if size[k] >= limit]
            small = [k for k in children if size[k] < limit]
            if len(small) == 1:
                shown += small
            entries = [(size[k], k) for k in shown]
            if len(small) > 1:
                entries.append((sum(size[k] for k in small), -node - 1))
            # Pushed smallest first: the largest child is written (and drawn) first.
            for _, k in sorted(entries, key=lambda e: (e[0], -e[1])):
                stack.append((k, me))
        return out


def flame_view(samples: Iterable[Any], names: Strings, wheres: Strings, by_line: bool = False,
               min_fraction: float = MIN_FRACTION, tree: Tree | None = None) -> list[int]:
    """A profile's samples (``frames`` innermost first, ``bytes``, ``count``) as flat rows."""
    tree = tree or Tree(by_line)
    leaves = [(tree.add(s.frames), s.bytes, s.count) for s in samples if s.bytes > 0]
    tree.done()
    return tree.encode(leaves, names, wheres, min_fraction)


def stack_leaves(loaded: Any, tree: Tree) -> dict[str, Iterable[tuple[int, int, int]]]:
    """The views a summary holds per stack id (``measured_views()``: malloc's gross, live, and peak
    and temporary when the capture kept them), as leaves of one shared tree: every stack is walked once for all views.

    The same numbers as :func:`memtrace.views.profile.profile` (tests/unit/test_flame.py checks
    the totals): each stack's figure, and for gross, peak and temporary the bytes no stack covers
    as one "(no stack)" leaf, so each view adds up to the summary's figure."""
    from memtrace.analyze.malloc import MEASURES
    from memtrace.analyze.profile import UNSTACKED
    from memtrace.capture import NO_STACK

    s = loaded.summary
    unstacked = tree.add([UNSTACKED])
    views = s.measured_views()
    # Three flat arrays per view (node, bytes, count): a tuple per stack and view would weigh more
    # than the tree on a capture with a hundred thousand stacks.
    cols = {v: (array("q"), array("q"), array("q")) for v in views}
    measures = [(cols[v], MEASURES[v]) for v in views]
    for st in s.stack_stats.values():
        node = -1
        for (nodes, sizes, counts), measure in measures:
            est, cnt, _ = measure(st)
            if est <= 0:
                continue
            if node < 0:
                sid = st.stack_id
                raw = s.stacks.get(sid)
                node = unstacked if sid == NO_STACK else (tree.add_addresses(raw, s.symbols) if raw
                                                          else tree.add(s.stack_frames(sid)))
            nodes.append(node)
            # The columns are int64 arrays: a damaged capture's absurd value is capped, not a crash.
            sizes.append(min(int(round(est)), INT64_MAX))
            counts.append(min(int(round(cnt)), INT64_MAX))
    tree.done()

    def rest(view: str, total: int, calls: int | None) -> None:
        nodes, sizes, counts = cols[view]
        have = sum(sizes)
        if total - have > 0:
            nodes.append(unstacked)
            sizes.append(total - have)
            counts.append(max(0, calls - sum(counts)) if calls is not None else 0)

    rest("gross", s.gross_bytes - s.coverage()["estimated_bytes_with_sampling"] + sum(cols["gross"][1]),
         s.alloc_calls)
    if "peak" in cols:
        rest("peak", s.peak.bytes, s.peak.count)
    if "temporary" in cols:
        rest("temporary", s.counter("temp_bytes"), s.counter("temp_calls"))
    return {v: zip(*c, strict=True) for v, c in cols.items()}
