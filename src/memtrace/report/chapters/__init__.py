"""A tracer's part of ``memtrace report``: its entry per capture, its aggregate per target, its
findings and its Markdown chapter.

Every method works on JSON-ready data (the ``report.json`` document is the report; REPORT.md
is rendered from it alone).  A tracer without a chapter of its own gets :class:`GenericChapter`,
which shows each capture's scalar figures and its stack tables.

The report's shared sections -- the panorama, the stack families, the leaks table, the measurable
verdict -- are made of what each chapter contributes through the methods below (the defaults
contribute nothing), so adding a tracer adds its part of them without editing the report:

- ``panorama(agg)`` its fields of a target's panorama row (``agg`` is its aggregate, None when the
  target was not traced by it), placed by ``panorama_place``; ``panorama_columns`` the panorama
  table's columns it renders from those fields; ``panorama_legend`` what they mean;
- ``families_line(agg)`` / ``family_rows(agg)`` its part of the panorama's dominant families and of
  the "Stack families" tables;
- ``measured_nothing(agg)`` True when its captures saw none of the calls it counts (with a death,
  the target is "not measurable");
- ``heap(agg)`` the process heap's figures (``live_bytes``, ``gross_bytes``) when it is the heap line
  (another chapter compares against them: :meth:`Lines.heap`);
- ``leak_headings`` / ``leak_legend`` / ``leak_cells(agg)`` / ``leak_items(t, agg)`` /
  ``leak_details(t, agg)`` its columns, explanation, row cells, findings and sections in "Leaks".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from memtrace.analyze.families import FamilyRules
from memtrace.analyze.profile import named_stack_lists, rows_at
from memtrace.frames import Frame
from memtrace.reporters.markdown import Markup, cell, code, table, text
from memtrace.units import fmt_bytes

TOP = 10
FRAMES_SHOWN = 6
UNSTACKED = "(no stack: below the stack threshold)"


Row = dict[str, Any]
Cell = Any          # a table cell: text, a number, or Markup


@dataclass(frozen=True)
class Column:
    """A column a chapter adds to the panorama table: its heading, its alignment (a
    ``reporters.markdown.table`` letter), its place among all columns (the report's own:
    target 0, dominant families 50, ended 60) and its cell, from the panorama row."""

    heading: str
    align: str
    place: int
    cell: Callable[[Row], Cell]


class Chapter(Protocol):
    name: str
    panorama_place: int
    panorama_columns: tuple[Column, ...]
    panorama_legend: str
    leak_headings: tuple[str, ...]
    leak_legend: str

    def entry(self, summary: Any, rel: str, rules: FamilyRules, top: int) -> dict[str, Any]: ...
    def aggregate(self, entries: list[dict[str, Any]]) -> Any: ...
    def findings(self, targets: list[dict[str, Any]], chapters: Lines) -> list[dict[str, Any]]: ...
    def markdown(self, targets: list[dict[str, Any]]) -> list[str]: ...
    def calibration(self, entry: dict[str, Any]) -> dict[str, Any]: ...
    def calibration_text(self, row: dict[str, Any]) -> str | None: ...
    def panorama(self, agg: Any) -> Row: ...
    def families_line(self, agg: Any) -> list[str]: ...
    def family_rows(self, agg: Any) -> list[list[Cell]]: ...
    def measured_nothing(self, agg: Any) -> bool: ...
    def heap(self, agg: Any) -> Row | None: ...
    def leak_cells(self, agg: Any) -> tuple[list[Cell], bool]: ...
    def leak_items(self, t: Row, agg: Any) -> list[Row]: ...
    def leak_details(self, t: Row, agg: Any) -> list[str]: ...


class Lines:
    """The report's chapters in registry order, as the report and each chapter's findings see them."""

    def __init__(self, chapters: Sequence[Chapter]) -> None:
        self.chapters = list(chapters)

    def traced(self, t: Row) -> list[tuple[Chapter, Any]]:
        """(chapter, its aggregate) for every line that traced target ``t``."""
        return [(c, t.get(c.name)) for c in self.chapters if t.get(c.name)]

    def heap(self, t: Row) -> Row | None:
        """The process heap's figures for ``t`` (live_bytes, gross_bytes), from the line that has them."""
        for c in self.chapters:
            figures = c.heap(t.get(c.name)) if t.get(c.name) else None
            if figures is not None:
                return figures
        return None


class BaseChapter:
    """Defaults every chapter can lean on: the summary's JSON, families on every stack row, and no
    part in the report's shared sections."""

    name = "?"
    stack_tables: tuple[str, ...] = ()       # dotted paths of the entry's row lists that carry frames
    panorama_place = 100                     # the order of its fields in a panorama row
    panorama_columns: tuple[Column, ...] = ()
    panorama_legend = ""
    leak_headings: tuple[str, ...] = ()
    leak_legend = ""

    def entry(self, summary: Any, rel: str, rules: FamilyRules, top: int) -> dict[str, Any]:
        j: dict[str, Any] = summary.to_json(capture=rel, top=top)
        j["analyzed"] = True
        for path in self.stack_tables:
            for row in _rows_at(j, path):
                row["family"] = rules.classify(row.get("frames") or [])
        return j

    def aggregate(self, entries: list[dict[str, Any]]) -> Any:
        return entries

    def findings(self, targets: list[dict[str, Any]], chapters: Lines) -> list[dict[str, Any]]:
        return []

    def markdown(self, targets: list[dict[str, Any]]) -> list[str]:
        return []

    def calibration(self, entry: dict[str, Any]) -> dict[str, Any]:
        return {}

    def calibration_text(self, row: dict[str, Any]) -> str | None:
        """The report's coverage cell for a calibration row (None: "—", or "not analyzed")."""
        return None

    def own(self, t: Row) -> Any:
        """This chapter's aggregate for target ``t`` (None: the target was not traced by it)."""
        return t.get(self.name)

    # ---- contributions to the report's shared sections (none by default) ----------------------

    def panorama(self, agg: Any) -> Row:
        return {}

    def families_line(self, agg: Any) -> list[str]:
        return []

    def family_rows(self, agg: Any) -> list[list[Cell]]:
        return []

    def measured_nothing(self, agg: Any) -> bool:
        return False

    def heap(self, agg: Any) -> Row | None:
        return None

    def leak_cells(self, agg: Any) -> tuple[list[Cell], bool]:
        """Its cells of a target's row in the leaks table, and whether they say anything (a row is
        shown when some line's do)."""
        return ["not traced"] * len(self.leak_headings), False

    def leak_items(self, t: Row, agg: Any) -> list[Row]:
        return []

    def leak_details(self, t: Row, agg: Any) -> list[str]:
        return []



class CountedLeakChapter(BaseChapter):
    """A chapter whose leak is one count per run with the stacks behind it (descriptors still open,
    threads never joined): one Leaks column of the runs' counts, and a finding per run naming its
    top stack."""

    leak_key = ""                 # the run's entry holding {"count", "by_stack"}
    leak_top_words = "most from"  # how a finding names the top stack

    def leak_text(self, target: str, count: int, at: str) -> str:
        raise NotImplementedError

    def leak_cells(self, agg: Any) -> tuple[list[Cell], bool]:
        counts = [e[self.leak_key]["count"] for e in agg or []]
        return [" / ".join(f"{n:,}" for n in counts) or "not traced"], bool(counts)

    def leak_items(self, t: Row, agg: Any) -> list[Row]:
        items = []
        for e in agg or []:
            leaked = e.get(self.leak_key) or {}
            if not leaked.get("count"):
                continue
            top = leaked["by_stack"][0] if leaked["by_stack"] else None
            at = f", {self.leak_top_words} {where(top['frames'])} ({top['count']:,})" if top else ""
            items.append({"target": t["target"], "line": self.name, "count": leaked["count"],
                          "text": self.leak_text(t["target"], leaked["count"], at)})
        return items

class GenericChapter(BaseChapter):
    """Each capture's numbers and its stack tables, for a tracer with no chapter of its own."""

    def __init__(self, name: str) -> None:
        self.name = name

    def entry(self, summary: Any, rel: str, rules: FamilyRules, top: int) -> dict[str, Any]:
        j = super().entry(summary, rel, rules, top)
        for rows in _stack_lists(j):
            for row in rows:
                row["family"] = rules.classify(row.get("frames") or [])
        return j

    def markdown(self, targets: list[dict[str, Any]]) -> list[str]:
        runs = [(t["target"], e) for t in targets for e in self.own(t) or []]
        if not runs:
            return []
        lines = [f"## {self.name}", ""]
        for target, e in runs:
            lines += [f"### {cell(target)} ({cell(e.get('path'))})", ""]
            scalars = [[k, v] for k, v in e.items() if isinstance(v, int | float | str) and not isinstance(v, bool)
                       and k not in ("capture", "path", "tracer", "target")]
            lines += table(["figure", "value"], "lr", scalars)
            for key, rows in named_stack_lists(e):
                lines += [f"{text(key, line_start=True)}:", ""]
                lines += table(["count", "bytes", "family", "frames"], "rrll",
                               [[r.get("count", "—"), fmt_bytes(r.get("bytes")), r.get("family", "—"),
                                 frames_cell(r.get("frames") or [])] for r in rows[:TOP]])
        return lines


def chapter_of(tracer: Any) -> Chapter:
    """A tracer's report chapter (its own, or the generic one)."""
    return tracer.chapter() if tracer.chapter is not None else GenericChapter(tracer.name)


def _rows_at(doc: dict[str, Any], path: str) -> list[dict[str, Any]]:
    return rows_at(doc, path) or []


def _stack_lists(doc: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [rows for _, rows in named_stack_lists(doc)]


# ---- pieces the chapters share ------------------------------------------------------------------


def frames_cell(frames: list[Any]) -> Markup:
    """A stack in one table cell: ``function (module) file:line`` ← ... innermost first."""
    shown = [code(_frame(f).label()) for f in frames[:FRAMES_SHOWN]]
    more = f" ← … (+{len(frames) - FRAMES_SHOWN})" if len(frames) > FRAMES_SHOWN else ""
    return Markup(" ← ".join(shown) + more if shown else "—")


def _frame(f: Any) -> Frame:
    if isinstance(f, Frame):
        return f
    if isinstance(f, dict):
        return Frame.from_json(f)
    return Frame(0, function=str(f))


def where(frames: list[Any]) -> str:
    """A stack's first three functions, for one line of text (a finding's item)."""
    names = [f.get("function") or f.get("module") or "?" for f in frames[:3]] if frames else ["(no stack)"]
    return " ← ".join(names)


def arrow(key: str) -> str:
    return key.replace("->", "→")


def family_rows(fam: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = [{"family": k, **v} for k, v in fam.items()]
    rows.sort(key=lambda r: (-r.get("bytes", 0), r["family"]))
    return rows


def merge_families(dst: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    for r in rows:
        f = dst.setdefault(r["family"], {})
        for k, v in r.items():
            if k != "family" and isinstance(v, int | float):
                f[k] = f.get(k, 0) + v


def add(a: Any, b: Any) -> Any:
    """Numbers and nested dicts of numbers, summed key by key."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: add(a.get(k, 0), b.get(k, 0)) for k in {**a, **b}}
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a + b
    return a


def frames_key(frames: list[Any]) -> tuple[Any, ...]:
    """Rows from several captures of one target merge when their symbolized stacks are the same."""
    return tuple(_frame(f).key() for f in frames)
