"""Markdown pieces every renderer shares: inert text, code spans and a GitHub table.

Everything that comes from a target or a file (function names, paths, process names, folder
names) is written with :func:`text` or :func:`code`, so REPORT.md stays inert even when a viewer
renders it with raw HTML enabled: ``<script>``, ``<img onerror=…>``, emphasis, links, a backtick
that would close a code span early, or a carriage return that would end a table row all come out
as the characters they are.  Markdown that memtrace writes itself (a code span, ``**bold**``, a
``<br>`` between lines of a cell) is wrapped in :class:`Markup`, which :func:`table` keeps as is.

Here rather than in ``memtrace.report`` so that the analyzers' own chapters (census, jetsam,
probe) use them without importing the report package that imports them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# Control characters are shown, not obeyed (a terminal `cat REPORT.md` would obey them), as the
# console does; line breaks and tabs become spaces so a value never ends a table row or a line.
_CONTROL = {c: f"\\x{c:02x}" for c in range(32)} | {9: " ", 10: " ", 13: " ", 127: "\\x7f",
                                                     0x85: " ", 0x2028: " ", 0x2029: " "}
# What can start inline markup or raw HTML.  A backslash escape works for every ASCII punctuation
# character (CommonMark 2.4); HTML's three are written as entities, which raw-HTML viewers decode
# back to text.  `_` is left alone between two word characters (json_service), where CommonMark
# never reads it as emphasis, to keep names readable in the source.
_INLINE = re.compile(r"[\\`*\[\]~|]|(?<![^\W_])_|_(?![^\W_])|#(?=\s*$)")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# What a line's text may not start with: a heading, list item or a setext/thematic line.
_BLOCK_START = re.compile(r"^(#{1,6}(?=\s|$)|[-+](?=\s|$)|\d{1,9}(?=[.)](?:\s|$))|[-=]+$)")


class Markup(str):
    """Markdown memtrace wrote itself, already safe: :func:`table` and :func:`text` keep it as is."""

    __slots__ = ()


def text(value: Any, line_start: bool = False) -> Markup:
    """Data as inert Markdown text: safe in a paragraph, a heading or a table cell.

    ``line_start``: the text begins a line (a list item's or a quote's text), where ``# x``,
    ``- x`` or ``1. x`` would start a block."""
    if isinstance(value, Markup):
        return value
    s = str(value).translate(_CONTROL)
    s = _INLINE.sub(lambda m: "\\" + m.group(0), s)
    s = "".join(_HTML.get(c, c) for c in s)
    if line_start:
        s = s.lstrip(" ")           # four spaces would start an indented code block
        m = _BLOCK_START.match(s)
        if m:
            lead = m.group(0)
            s = (lead + "\\" + s[len(lead):]) if lead[0].isdigit() else "\\" + s
    return Markup(s)


cell = text     # one table cell: the same escapes (a `|` is escaped everywhere)


def lines(values: Iterable[Any]) -> Markup:
    """Several lines of data in one table cell (``<br>`` between them, each line inert)."""
    return Markup("<br>".join(text(v) for v in values))


def code(value: Any) -> Markup:
    """A code span that holds ``value`` literally, wherever it is written (a table cell too)."""
    s = str(value).translate(_CONTROL)
    if not s.strip():
        return Markup("—")
    # A fence longer than any run of backticks inside it can't be closed early (CommonMark 6.1).
    longest = max((len(r) for r in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s[0] in "` " or s[-1] in "` " else ""
    return Markup(fence + pad + _pipes(s) + pad + fence)


def _pipes(s: str) -> str:
    """Escape every ``|`` so a table never splits on it, whatever backslashes come before it.

    Table parsers differ: markdown-it looks at the one character before a pipe, cmark-gfm counts
    backslashes.  An odd number of backslashes before the pipe satisfies both."""
    def esc(m: re.Match[str]) -> str:
        slashes = m.group(1)
        return slashes + ("\\" if len(slashes) % 2 == 0 else "\\\\") + "|"
    return re.sub(r"(\\*)\|", esc, s)


def join(parts: Iterable[Any], sep: str = ", ") -> Markup:
    """Several values in one cell or line, each made inert; ``sep`` is memtrace's own."""
    return Markup(sep.join(text(p) for p in parts))


def table(header: list[str], align: str, rows: list[list[Any]]) -> list[str]:
    """Header, alignment row (``r`` right, anything else left) and rows, then a blank line.

    The header is memtrace's own words; plain values are escaped with :func:`text` and
    :class:`Markup` cells are written as they are."""
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(text(c) for c in r) + " |" for r in rows]
    return out + [""]
