"""Views that read sections helper summaries add (peak, temporary, a timeline), on synthetic
summaries of the documented shapes; and the same views on a capture that lacks them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.conftest import ROOT

from memtrace.analyze.malloc import MallocSummary
from memtrace.reporters.html import flame_data, json_script, markdown_html, short_name
from memtrace.tracers import get
from memtrace.views import load
from memtrace.views.profile import profile, timeline

FRAMES = [{"function": "decode_tile", "module": "app", "offset": 16, "address": "0x1010", "file": "tile.c",
           "line": 42}, {"function": "main", "module": "app", "offset": 32, "address": "0x1020"}]


class NewerSummary(MallocSummary):
    """A malloc summary with the sections a newer analyzer adds (documented shapes)."""

    def to_json(self, capture: str | None = None, top: int = 10) -> dict[str, Any]:
        j = super().to_json(capture, top)
        j["peak"] = {"bytes": 3 << 20, "t": 1.5, "by_stack": [{"bytes": 3 << 20, "count": 3, "frames": FRAMES}]}
        j["temporary"] = {"calls": 500, "bytes": 1 << 20, "by_stack": [{"bytes": 1 << 20, "count": 500,
                                                                          "frames": FRAMES[1:]}]}
        return j


def loaded(summary: Any) -> SimpleNamespace:
    return SimpleNamespace(summary=summary, tracer=get("malloc"), path=Path("synthetic/capture.mtc"))


def test_peak_and_temporary_views_from_the_documented_shapes() -> None:
    s = NewerSummary()
    s.timeline = [{"t": 0.0, "footprint": 1 << 20, "in_use": 1000}, {"t": 1.0, "footprint": 3 << 20, "in_use": 5000}]
    p = profile(loaded(s), "peak")
    assert p.missing is None and p.total_bytes == 3 << 20 and p.total_count == 3
    assert [f.function for f in p.samples[0].frames] == ["decode_tile", "main"]
    t = profile(loaded(s), "temporary")
    assert t.total_count == 500 and t.total_bytes == 1 << 20
    tl = timeline(loaded(s))
    assert tl == {"t": [0.0, 1.0], "series": {"allocator in use": [1000, 5000], "footprint": [1 << 20, 3 << 20]},
                  "unit": "bytes", "source": "summary"}
    # A capture whose first drain came after the start begins at the window's start, from the
    # "before" calibration: nothing tracked yet, the allocator and footprint as they were read.
    s.timeline = [{"t": 0.05, "tracked_bytes": 4096, "tracked_blocks": 1, "in_use": 9000, "footprint": 3 << 20}]
    s.calibration = {"before": {"allocator": {"in_use": 1000}, "footprint": {"footprint": 1 << 20}}}
    assert timeline(loaded(s)) == {"t": [0.0, 0.05], "series": {"tracked live": [0, 4096],
                                                              "allocator in use": [1000, 9000],
                                                              "footprint": [1 << 20, 3 << 20]},
                                   "unit": "bytes", "source": "summary"}
    data = flame_data(loaded(s), "peak")
    nodes = data["views"]["peak"]["nodes"]
    # Root, then main, then decode_tile: each row (parent, name, where, bytes, count, folded).
    rows = [nodes[i:i + 6] for i in range(0, len(nodes), 6)]
    assert [(data["names"][r[1]], data["wheres"][r[2]], r[0], r[3], r[4]) for r in rows] == [
        ("all", "", -1, 3 << 20, 3), ("main (app)", "", 0, 3 << 20, 3), ("decode_tile (app)", "tile.c:42", 1, 3 << 20, 3)]


def test_a_capture_without_them_says_not_in_this_capture() -> None:
    real = load(ROOT / "tests" / "data" / "captures-v1" / "workload-malloc")
    for view in ("peak", "temporary"):
        p = profile(real, view)
        assert p.samples == [] and "not in this capture" in (p.missing or "")
    assert "no leak scan" in (profile(real, "leaked").missing or "")
    data = flame_data(real)
    assert data["views"]["peak"]["missing"] and len(data["views"]["gross"]["nodes"]) > 6


def test_embedded_json_cannot_close_its_script_element() -> None:
    text = json_script({"name": "</script><script>alert(1)</script><!--"}, "f")
    body = text[text.index(">") + 1:-len("</script>")]
    assert "<" not in body and ">" not in body


def test_markdown_html_escapes_and_keeps_escaped_pipes_in_their_cell() -> None:
    md = "| a | b |\n|---|---:|\n| `x\\\\|y` | <img src=x> |\n"
    out = markdown_html(md)
    assert "<td><code>x|y</code></td>" in out and '<td class="r">&lt;img src=x&gt;</td>' in out


def test_report_html_escapes_names_exactly_once_and_shortens_long_templates() -> None:
    from memtrace.reporters.markdown import code, table, text

    name = "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >::_M_mutate"
    md = "\n".join(table(["stack", "note"], "ll", [[code(f"{name} (app)"), text("a <b> & c_d_ **not bold** |x|")]]))
    out = markdown_html(md)
    short = "std::__cxx11::basic_string&lt;…&gt;::_M_mutate (app)"
    full = name.replace("<", "&lt;").replace(">", "&gt;")
    assert f'<code title="{full} (app)">{short}</code>' in out
    assert "<td>a &lt;b&gt; &amp; c_d_ **not bold** |x|</td>" in out
    assert "\\" not in out and "&amp;lt;" not in out and "&amp;amp;" not in out
    # Short names and comparison operators are left alone.
    assert short_name("operator<<(std::ostream&, Foo const&) (libfoo.so)") == \
        "operator<<(std::ostream&, Foo const&) (libfoo.so)"
    assert short_name("std::vector<int, std::allocator<int> >::_M_realloc_insert") == \
        "std::vector<…>::_M_realloc_insert"


def test_the_leak_scans_unread_memory_in_words() -> None:
    from memtrace.analyze.leaks import skipped_text
    from memtrace.units import fmt_bytes, plural

    assert [plural(1, "thread"), plural(2, "thread"), plural(1024, "block")] == ["1 thread", "2 threads", "1,024 blocks"]
    assert skipped_text({"stacks_of_no_stopped_thread": 3 << 20, "unreadable": 0, "candidates_over_capacity": 12,
                         "scanning_thread_stack": 4096}, fmt_bytes) == [
        "stacks below the stopped threads' stack pointers, and stacks no thread runs on (Frida's own) 3.0 MB",
        "12 blocks over the table's capacity", "the scanning thread's own stack 4.0 KB"]
    from memtrace.analyze.leaks import examined_text

    scan = {"examined": 5248, "tracked_blocks": 5220, "before_tracing_blocks": 28, "complete": True,
            "not_examined": {"over_capacity": 0, "undecided_darwin_logger": 0},
            "allocator": {"main_arena_found": True, "walk_errors": 0}}
    assert examined_text(scan) == ("5,248 blocks; 5,220 traced, 28 allocated before tracing; "
                                   "every live heap block examined")
    scan["not_examined"]["over_capacity"] = 7
    scan["allocator"] = {"main_arena_found": True, "walk_errors": 1, "unwalked_bytes": 4096}
    assert examined_text(scan).endswith("NOT every block: 7 beyond the scan's table; 1 heap walk(s) stopped at an "
                                        "inconsistent chunk (4,096 bytes not walked)")


def test_show_sorts_the_stack_table_by_bytes_calls_or_live(tmp_path: Path) -> None:
    import json

    from tests.conftest import run_memtrace

    from memtrace.report.synthetic import SyntheticCapture

    c = SyntheticCapture(tmp_path / "c.mtc", "app")
    many, big = c.stack("many_small", "main"), c.stack("one_big", "main")
    ptrs = [c.alloc(many, 8192) for _ in range(6)]       # 48 KB in 6 calls, all freed
    for p in ptrs:
        c.free(p, 8192)
    c.alloc(big, 65536)                                  # 64 KB in 1 call, live
    c.alloc(big, 65536)
    c.end(captured_s=1.0)

    def top(*sort: str) -> list[str]:
        doc = json.loads(run_memtrace("show", tmp_path / "c.mtc", "--json", *sort).stdout)
        return [r["frames"][0]["function"] for r in doc["top_stacks"]]

    assert top() == top("--sort", "bytes") == ["one_big", "many_small"]
    assert top("--sort", "calls") == ["many_small", "one_big"]
    assert top("--sort", "live") == ["one_big"]
    text = run_memtrace("show", tmp_path / "c.mtc", "--sort", "calls").stdout
    assert text.index("top stacks by calls") < text.index("live at end, by stack")
    bad = run_memtrace("show", ROOT / "tests/data/report/captures/camera-iosurface", "--sort", "calls", check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--sort orders malloc's stack table" in bad.stderr
