"""Markdown pieces every renderer shares: an escaped table cell and a GitHub table.

Here rather than in ``memtrace.report`` so that the analyzers' own chapters (census, jetsam,
probe) use them without importing the report package that imports them.
"""

from __future__ import annotations

from typing import Any


def cell(text: Any) -> str:
    """One table cell: a bare ``|`` would split it and a newline would end the row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def code(text: Any) -> str:
    """A code span inside a table cell: the cell's escapes, and no backtick can close it early."""
    return "`" + cell(text).replace("`", "'") + "`"


def table(header: list[str], align: str, rows: list[list[Any]]) -> list[str]:
    """Header, alignment row (``r`` right, anything else left) and rows, then a blank line."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return out + [""]
