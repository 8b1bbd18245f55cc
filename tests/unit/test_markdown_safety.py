"""REPORT.md stays inert when a viewer renders it with raw HTML enabled.

Every value from a target or a file (function names, target labels, folder and file names,
JetsamEvent process names, census rows) is written as text or a code span: rendered by a real
Markdown renderer (markdown-it-py, CommonMark + GFM tables, ``html: True``), no element or
attribute comes from the data, no table row is split, and each value reads back as itself.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from memtrace.analyze import jetsam as J
from memtrace.report import build_report
from memtrace.report.synthetic import SyntheticCapture
from memtrace.reporters.markdown import Markup, code, table, text

# Tags memtrace's own Markdown produces; anything else came from the data.
ALLOWED = {"h1", "h2", "h3", "p", "table", "thead", "tbody", "tr", "th", "td", "code", "strong", "ul", "li",
           "blockquote", "br"}
HOSTILE = [
    "<script>alert(1)</script>", "<img src=x onerror=alert(2)>", "a`b``c", "cr\rsplit|row", "lone[/]",
    "[link](javascript:alert(3))", "__init__", "*em* **strong**", "~~gone~~", "\x1b[2J\x1b]0;title\x07",
    "# heading", "- item", "1. item", "&lt;b&gt;", "<!-- c -->", "![i](x)", "trailing\\", "\\|",
]


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []
        self.cells: list[list[str]] = []
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        if tag == "table":
            self.tables.append([])
        if tag == "tr":
            self.cells.append([])
            if self.tables:
                self.tables[-1].append(self.cells[-1])
        if tag in ("td", "th"):
            self._cell = []

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.cells[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def handle_comment(self, data: str) -> None:
        self.tags.append(("!--", []))


def render(md: str) -> Tags:
    html = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(md)
    parsed = Tags()
    parsed.feed(html)
    parsed.close()
    return parsed


def assert_inert(parsed: Tags) -> None:
    for tag, attrs in parsed.tags:
        assert tag in ALLOWED, f"element <{tag}> came from the data"
        for name, value in attrs:
            assert tag in ("th", "td") and name == "style" and value in ("text-align:right", "text-align:left"), \
                f"attribute {name}={value!r} on <{tag}> came from the data"


def visible(s: str) -> str:
    """What a value reads as: control characters shown as \\xNN, line breaks and tabs as spaces."""
    out = []
    for c in s:
        o = ord(c)
        out.append(" " if c in "\t\n\r\x85\u2028\u2029" else f"\\x{o:02x}" if o < 32 or o == 127 else c)
    return "".join(out)


def test_hostile_values_in_cells_read_back_as_themselves() -> None:
    md = "\n".join(table(["text", "code"], "ll", [[v, code(v)] for v in HOSTILE]))
    parsed = render(md)
    assert_inert(parsed)
    rows = parsed.cells[1:]
    assert len(rows) == len(HOSTILE), "a value split or ended a table row"
    for v, (as_text, as_code) in zip(HOSTILE, rows, strict=True):
        assert as_text == visible(v).strip()
        if "\\|" not in v:      # a backslash before a pipe in a code span gains one (both parsers agree)
            assert as_code == visible(v)


def test_hostile_values_as_headings_paragraphs_and_list_items() -> None:
    for v in HOSTILE:
        md = f"### {text(v)}\n\n**{text(v)}.** {text(v)}\n\n- {text(v, line_start=True)}\n\n> {text(v, line_start=True)}\n"
        parsed = render(md)
        assert_inert(parsed)
        assert [t for t, _ in parsed.tags] == ["h3", "p", "strong", "ul", "li", "blockquote", "p"], v


# Printable ASCII and the characters that matter: controls, Unicode line separators.
ALPHABET = st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs", "Cc"), max_codepoint=0x7f) | \
    st.sampled_from(["\u2028", "\u0085", "é", "→"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=ALPHABET, max_size=24), min_size=1, max_size=4))
def test_fuzz_cells_never_inject_or_split(values: list[str]) -> None:
    md = "\n".join(table(["a"] * len(values), "l" * len(values), [list(values), [code(v) for v in values]]))
    parsed = render(md)
    assert_inert(parsed)
    assert len(parsed.cells) == 3 and all(len(r) == len(values) for r in parsed.cells)
    for v, got in zip(values, parsed.cells[1], strict=True):
        assert got == visible(v).strip(" \t")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=30))
def test_fuzz_list_items_stay_one_item(value: str) -> None:
    parsed = render(f"- {text(value, line_start=True)}\n")
    assert_inert(parsed)
    assert [t for t, _ in parsed.tags][:2] == ["ul", "li"]
    assert [t for t, _ in parsed.tags].count("li") == 1


def test_markup_is_kept_and_plain_strings_are_escaped() -> None:
    (_, _, row, _) = table(["a", "b"], "ll", [[Markup("**yes**"), "**no**"]])
    assert row == "| **yes** | \\*\\*no\\*\\* |"


def _hostile_folder(root: Path) -> Path:
    """A report folder whose every name and value is hostile: capture, census, jetsam, a skipped file."""
    folder = root / "rep<img src=x onerror=alert(9)>"
    cap = folder / "run<svg onload=alert(8)>`x`"
    cap.mkdir(parents=True)
    c = SyntheticCapture(cap / "capture.mtc", "<script>alert(1)</script>\r| x |", module="mod<b>x</b>")
    sid = c.stack("lone[/]", "<img src=x onerror=alert(2)>", "a`b``c", "\x1b[2J\x1b]0;pwned\x07", "*em*")
    c.calibration("before", 1000, 1 << 20)
    for _ in range(3):
        c.alloc(sid, 65536)
    c.calibration("after", 1000 + 3 * 65536, 2 << 20)
    c.end(reason="exited <b>bold</b>\rsplit")
    (folder / "evil<script>alert(4).mtc").write_bytes(b"not a capture")
    census = {"kind": "census", "version": 1, "platform": "linux<i>",
              "device": {"id": "local", "name": "<iframe src=x>", "type": "local"}, "time": "`t`",
              "rows": [{"pid": 1, "name": "<script>alert(5)</script>", "status": "ok|x", "footprint": 4096,
                        "band": "<b>BAND</b>"}],
              "totals": {"processes": 1, "measured": 1, "vanished": 0, "denied": 0, "footprint": 4096},
              "errors": {}, "notes": ["# note <img src=x onerror=alert(6)>"]}
    (folder / "census-1.json").write_text(json.dumps(census))
    report = {"product": "iPhone<svg>", "build": "iOS `17`", "largestProcess": "<img src=x onerror=alert(7)>",
              "memoryStatus": {"pageSize": 16384, "memoryPages": {"free": 1}},
              "processes": [{"pid": 5, "name": "\x1b]0;title\x07<script>x</script>", "rpages": 100,
                             "reason": "per-process-limit<b>", "killDelta": 1}]}
    agg = J.aggregate([J.parse_report(json.dumps(report), "JetsamEvent-<x>.ips")],
                      [("bad<img src=x onerror=alert(10)>.ips", "broken `json`\r| row")])
    (folder / "jetsam-1.json").write_text(json.dumps(agg))
    return folder


def test_report_md_with_hostile_names_is_inert_when_rendered_with_html(tmp_path: Path) -> None:
    folder = _hostile_folder(tmp_path)
    build_report(folder)
    md = (folder / "REPORT.md").read_text(encoding="utf-8")
    parsed = render(md)
    assert_inert(parsed)
    shown = "".join(parsed.text)
    # Each hostile value is there, as the characters it is.
    for v in ("<script>alert(1)</script>", "<img src=x onerror=alert(2)>", "lone[/]", "a`b``c", "*em*",
              "rep<img src=x onerror=alert(9)>", "evil<script>alert(4).mtc", "<script>alert(5)</script>",
              "<iframe src=x>", "# note <img src=x onerror=alert(6)>", "\\x1b]0;title\\x07<script>x</script>",
              "bad<img src=x onerror=alert(10)>.ips", "\\x1b[2J\\x1b]0;pwned\\x07"):
        assert v in shown, v
    assert "\x1b" not in md and "\r" not in md
    # Every row of every table has as many cells as its header: no carriage return or pipe split one.
    assert parsed.tables and all(len({len(r) for r in t}) == 1 for t in parsed.tables), parsed.tables
    md_rows = [line for line in md.splitlines() if line.startswith("|") and not line.startswith("|---")]
    assert len(md_rows) == sum(len(t) for t in parsed.tables)
