"""Self-contained HTML: the flame graph page and report.html.

Every page carries its own CSS and JavaScript (``flame.css`` and ``flame.js`` beside this file,
inlined) and its data as JSON in a ``<script type="application/json">`` element; nothing is
fetched from the network.  Text from a capture (symbol names, file names, targets) reaches the
page only as escaped HTML or as JSON the script puts in with ``textContent``.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from memtrace.views.profile import VIEWS, profile, timeline

HERE = Path(__file__).resolve().parent


def _asset(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def json_script(obj: Any, flame_id: str) -> str:
    """JSON inside a script element: no ``</script>``, ``<!--`` or ``]]>`` can end it early."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f'<script type="application/json" data-mt-flame="{html.escape(flame_id)}">{text}</script>'


def flame_data(loaded: Any, view: str = "gross") -> dict[str, Any]:
    """Every view of one capture, frames root first, for flame.js."""
    views: dict[str, Any] = {}
    for v in VIEWS if loaded.tracer.name == "malloc" else ("gross",):
        p = profile(loaded, v)
        views[v] = {"missing": p.missing,
                    "samples": [{"bytes": s.bytes, "count": s.count,
                                 "frames": [{"name": f.name(), "where": f.location() or ""}
                                            for f in reversed(s.frames)]}
                                for s in p.samples if s.bytes > 0]}
    target = loaded.summary.meta.get("target", {}).get("label") or str(loaded.path)
    return {"title": f"{target} — {loaded.tracer.name}", "view": view, "views": views,
            "timeline": timeline(loaded)}


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
            f"<title>{html.escape(title)}</title><style>{_asset('flame.css')}</style></head>\n<body>\n"
            f"{body}\n<script>{_asset('flame.js')}</script>\n</body></html>\n")


def flame_block(data: dict[str, Any], flame_id: str) -> str:
    return f'<div class="mt-flame" id="{html.escape(flame_id)}"></div>\n{json_script(data, flame_id)}'


def flamegraph_page(loaded: Any, view: str = "gross") -> str:
    data = flame_data(loaded, view)
    body = (f"<h1>{html.escape(data['title'])}</h1>\n"
            f"<p class=\"mt-note\">{html.escape(str(loaded.path))} · memory timeline above, flame graph below "
            "(root at the top; click to zoom, search by regular expression, hover for bytes, count and "
            "file:line)</p>\n" + flame_block(data, "flame-0"))
    return _page(data["title"], body)


# ---- report.html: REPORT.md's Markdown as HTML, and a flame graph per target -------------------

_CODE = re.compile(r"`([^`]*)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")


def _unpipe(text: str) -> str:
    # A code span inside a table cell is escaped twice (code() then the table's cell()): "\\\\|".
    return text.replace("\\\\|", "|").replace("\\|", "|")


def _inline(text: str) -> str:
    """One line of memtrace's Markdown (code spans, bold, ``\\|``) as escaped HTML."""
    out, last = [], 0
    for m in _CODE.finditer(text):
        out.append(_BOLD.sub(r"<b>\1</b>", html.escape(_unpipe(text[last:m.start()]))))
        out.append("<code>" + html.escape(_unpipe(m.group(1))) + "</code>")
        last = m.end()
    out.append(_BOLD.sub(r"<b>\1</b>", html.escape(_unpipe(text[last:]))))
    # The one tag memtrace's Markdown cells use (several captures in one cell), restored after escaping.
    return "".join(out).replace("&lt;br&gt;", "<br>")


def _cells(row: str) -> list[str]:
    """A table row split on its unescaped pipes (a ``\\|`` is a pipe inside a cell)."""
    inner = row.strip()[1:-1]
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner)]


def markdown_html(md: str) -> str:
    """The Markdown memtrace writes (headings, paragraphs, lists, tables) as HTML."""
    out: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("#"):
            level = len(ln) - len(ln.lstrip("#"))
            out.append(f"<h{level}>{_inline(ln[level:].strip())}</h{level}>")
        elif ln.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|(:?-+:?\|)+", lines[i + 1].strip()):
            align = ["r" if a.endswith(":") else "" for a in lines[i + 1].strip().strip("|").split("|")]
            head = _cells(ln)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            cls = [f' class="{a}"' if a else "" for a in align]
            out.append("<table><tr>" + "".join(f"<th{cls[k] if k < len(cls) else ''}>{_inline(h)}</th>"
                                               for k, h in enumerate(head)) + "</tr>")
            for r in rows:
                out.append("<tr>" + "".join(f"<td{cls[k] if k < len(cls) else ''}>{_inline(c)}</td>"
                                            for k, c in enumerate(r)) + "</tr>")
            out.append("</table>")
            continue
        elif ln.startswith("- "):
            out.append("<ul>")
            while i < len(lines) and lines[i].startswith("- "):
                out.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append("</ul>")
            continue
        elif ln.strip():
            out.append(f"<p>{_inline(ln)}</p>")
        i += 1
    return "\n".join(out)


def report_page(title: str, markdown: str, flames: list[tuple[str, dict[str, Any]]]) -> str:
    """REPORT.md as HTML, then a "Flame graphs" chapter: one per capture with stacks."""
    parts = [markdown_html(markdown), "<h2>Flame graphs</h2>"]
    if not flames:
        parts.append("<p>No capture with stacks in this folder.</p>")
    for k, (heading, data) in enumerate(flames):
        parts.append(f"<h3>{html.escape(heading)}</h3>")
        parts.append(flame_block(data, f"flame-{k}"))
    return _page(title, "\n".join(parts))
