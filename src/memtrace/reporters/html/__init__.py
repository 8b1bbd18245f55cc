"""Self-contained HTML: the flame graph page and report.html.

Every flame graph page carries its own CSS and JavaScript (``flame.css`` and ``flame.js`` beside
this file, inlined) and its data -- the tree :mod:`memtrace.views.flame` built, never the raw
stacks -- as JSON in a ``<script type="application/json">`` element; nothing is fetched from the
network.  report.html is the report's chapters and a link per capture to its own page (no script,
no flame data: it stays small whatever the folder holds).  Text from a capture (symbol names, file
names, targets) reaches a page only as HTML escaped once or as JSON the script puts in with
``textContent``.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from memtrace.views.flame import MIN_FRACTION, NODE_FIELDS, Strings, Tree, flame_view, stack_leaves
from memtrace.views.profile import profile, timeline

HERE = Path(__file__).resolve().parent


def _asset(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def json_script(obj: Any, flame_id: str) -> str:
    """JSON inside a script element: no ``</script>``, ``<!--`` or ``]]>`` can end it early."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f'<script type="application/json" data-mt-flame="{html.escape(flame_id)}">{text}</script>'


def flame_data(loaded: Any, view: str = "gross", by_line: bool = False,
               min_fraction: float = MIN_FRACTION) -> dict[str, Any]:
    """Every view of one capture as flame.js's compact trees (:mod:`memtrace.views.flame`): the
    names and file:line locations written once, each view a flat node list."""
    names, wheres = Strings(), Strings()
    views: dict[str, Any] = {}
    tree = Tree(by_line)
    # Views the summary holds per stack id come from one walk of its stacks; the others from profile().
    fast = stack_leaves(loaded, tree) if loaded.summary.measured_views() else {}
    for v in loaded.tracer.views:
        if v in fast:
            views[v] = {"missing": None, "unit": "bytes",
                        "nodes": tree.encode(fast[v], names, wheres, min_fraction)}
            continue
        p = profile(loaded, v)
        entry: dict[str, Any] = {"missing": p.missing, "unit": p.unit}
        if not p.missing:
            entry["nodes"] = flame_view(p.samples, names, wheres, by_line, min_fraction)
        views[v] = entry
    target = loaded.summary.meta.get("target", {}).get("label") or str(loaded.path)
    tl = timeline(loaded)
    if "stacks" in tl:
        # The range view's stacks, root first, their frames in the same tables as the trees'.
        tl["stacks"] = [{"frames": [[names(f.name() + (" [inlined]" if f.inlined else "")),
                                     wheres(f.location() or "")] for f in reversed(st["frames"])],
                         "live": st["live"]} for st in tl["stacks"]]
    if tl.get("unit") == "bytes":
        # Panels: tracked live beside the allocator's in-use (one scale, so they compare; tracked
        # drawn on top), the footprint on its own scale (it dwarfs the heap).
        heap = [n for n in ("tracked live", "allocator in use") if n in tl["series"]]
        tl["panels"] = [g for g in (heap, [n for n in tl["series"] if n not in heap]) if g]
    else:
        tl["panels"] = [[n] for n in tl.get("series", {})]
    return {"title": f"{target} — {loaded.tracer.name}", "view": view if view in views else next(iter(views)),
            "by_line": by_line, "min_fraction": min_fraction, "names": names.items, "wheres": wheres.items,
            "views": views, "timeline": tl}


def has_stacks(data: dict[str, Any]) -> bool:
    return any(len(v.get("nodes") or ()) > NODE_FIELDS for v in data["views"].values())


def _page(title: str, body: str, script: bool = True) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
            f"<title>{html.escape(title)}</title><style>{_asset('flame.css')}</style></head>\n<body>\n"
            + body + (f"\n<script>{_asset('flame.js')}</script>" if script else "") + "\n</body></html>\n")


def flame_block(data: dict[str, Any], flame_id: str) -> str:
    return f'<div class="mt-flame" id="{html.escape(flame_id)}"></div>\n{json_script(data, flame_id)}'


def flamegraph_page(loaded: Any, view: str = "gross", by_line: bool = False,
                    min_fraction: float = MIN_FRACTION, data: dict[str, Any] | None = None,
                    back: str | None = None) -> str:
    """One capture's page.  ``back``: a link to the report the page belongs to."""
    data = data or flame_data(loaded, view, by_line, min_fraction)
    link = f'<a href="{html.escape(back)}">← the report</a> · ' if back else ""
    body = (f"<h1>{html.escape(data['title'])}</h1>\n"
            f"<p class=\"mt-note\">{link}{html.escape(str(loaded.path))} · memory timeline above (drag across it "
            "to see the flame graph of a time range), flame graph below (root at the top; merged by function"
            + (", split by source line" if by_line else "") + f"; nodes under {min_fraction:.1%} of the total folded "
            "into \"other\"; click to zoom, search by regular expression, hover for the full name, bytes, count "
            "and file:line)</p>\n" + flame_block(data, "flame-0"))
    return _page(data["title"], body)


# ---- report.html: REPORT.md's Markdown as HTML, and a flame graph per target -------------------

_CODE = re.compile(r"(?<!\\)(`+)(.*?[^`])\1(?!`)")


def _unpipe(text: str) -> str:
    # A code span inside a table cell is escaped twice (code() then the table's cell()): "\\\\|".
    return text.replace("\\\\|", "|").replace("\\|", "|")


# What memtrace's Markdown text() escapes (reporters/markdown.py): a backslash before ASCII
# punctuation, and &, < and > as entities.  Read back to the characters they stand for, so that
# report.html escapes each name exactly once (``std::__cxx11::basic_string<char>``, not
# ``std::\_\_cxx11::basic_string&lt;char&gt;``).
_TEXT_TOKEN = re.compile(r"\\([!-/:-@\[-`{-~])|&(amp|lt|gt);|(\*\*)|(<br>)")
_ENTITIES = {"amp": "&", "lt": "<", "gt": ">"}
SHORT_NAME = 48             # longer names have their template arguments collapsed for display


def short_name(name: str) -> str:
    """A long C++ name with every template argument list collapsed (``std::vector<…>::_M_realloc_insert``);
    ``operator<``, ``a < b`` and names without lists are left as they are (flame.js does the same)."""
    if len(name) <= SHORT_NAME or "<" not in name:
        return name
    out, depth = [], 0
    for i, c in enumerate(name):
        if c == "<" and depth == 0 and (not re.search(r"[\w:]$", name[:i]) or re.search(r"operator\s*<*$", name[:i])):
            out.append(c)
        elif c == "<":
            if depth == 0:
                out.append("<…")
            depth += 1
        elif c == ">" and depth > 0:
            depth -= 1
            if depth == 0:
                out.append(">")
        elif depth == 0:
            out.append(c)
    return "".join(out) if depth == 0 else name


def _text_html(text: str) -> str:
    """memtrace's Markdown text (outside code spans) as HTML: its escapes read back, then every
    character escaped once; ``**`` pairs become bold and ``<br>`` a line break (memtrace's own)."""
    out: list[str] = []
    bold = False
    last = 0
    for m in _TEXT_TOKEN.finditer(text):
        out.append(html.escape(text[last:m.start()], quote=False))
        if m.group(1) is not None:
            out.append(html.escape(m.group(1), quote=False))
        elif m.group(2) is not None:
            out.append(html.escape(_ENTITIES[m.group(2)], quote=False))
        elif m.group(3) is not None:
            out.append("</b>" if bold else "<b>")
            bold = not bold
        else:
            out.append("<br>")
        last = m.end()
    out.append(html.escape(text[last:], quote=False))
    if bold:
        out.append("</b>")
    return "".join(out)


def _code_html(raw: str) -> str:
    """A code span: its text literally, a long template name shortened with the full name on hover."""
    full = _unpipe(raw)
    if full.startswith(" ") and full.endswith(" ") and full.strip():
        full = full[1:-1]           # code()'s padding beside a backtick
    short = short_name(full)
    if short != full:
        return f'<code title="{html.escape(full)}">{html.escape(short, quote=False)}</code>'
    return "<code>" + html.escape(full, quote=False) + "</code>"


def _inline(text: str) -> str:
    """One line of memtrace's Markdown (code spans, bold, ``\\|``) as escaped HTML."""
    out, last = [], 0
    for m in _CODE.finditer(text):
        out.append(_text_html(text[last:m.start()]))
        out.append(_code_html(m.group(2)))
        last = m.end()
    out.append(_text_html(text[last:]))
    return "".join(out)


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


def report_page(title: str, markdown: str, flames: list[tuple[str, str]]) -> str:
    """REPORT.md as HTML, then a "Flame graphs" chapter linking each capture's own page (pages per
    capture keep report.html small whatever the folder holds)."""
    parts = [markdown_html(markdown), "<h2>Flame graphs</h2>"]
    if not flames:
        parts.append("<p>No capture with stacks in this folder.</p>")
    else:
        parts.append("<p class=\"mt-note\">One page per capture (timeline, every view, zoom and search).</p><ul>")
        parts += [f'<li><a class="mt-flame-link" href="{html.escape(href)}">{html.escape(heading)}</a></li>'
                  for heading, href in flames]
        parts.append("</ul>")
    return _page(title, "\n".join(parts), script=False)
