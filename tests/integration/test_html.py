"""The HTML pages in a real headless browser (Debian's chromium, driven by Playwright).

The demo workload is traced with --leaks, reported, and its flame graph opened: the leaking
function is on the page with its stack, search finds it, the tooltip gives bytes, count and
file:line, nothing is fetched from the network and the console stays clean.  A capture whose
functions are named like markup (``<script>``, ``|``) must stay text.

Set MEMTRACE_UPDATE_DOCS=1 to save the flame graph's screenshot as docs/flamegraph.png (README).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import ROOT, run_memtrace

from memtrace.report.synthetic import SyntheticCapture

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]
HOSTILE = "<script>alert('owned')</script>"
PIPE = "parse|split"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (.ci/run installs it with apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch_persistent_context(str(tmp_path_factory.mktemp("chromium-profile")),
                                                 executable_path=CHROMIUM, args=ARGS, headless=True,
                                                 viewport={"width": 1280, "height": 720})
        yield b
        b.close()


class Page:
    """A page with every request, console error, page error and dialog recorded."""

    def __init__(self, context: Any, path: Path) -> None:
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page = context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.route("**/*", self._route)
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)

    def _route(self, route: Any) -> None:
        self.requests.append(route.request.url)
        if route.request.url == self.url:
            route.continue_()
        else:
            route.abort()

    def offline(self) -> bool:
        return self.requests == [self.url]


@pytest.fixture(scope="module")
def demo(demo_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo-report")
    run_memtrace("malloc", "--device", "local", "--window", "30", "--leaks", "--quiet", "--out",
                 root / "workload-malloc", "--", demo_bin / "workload", timeout=180)
    run_memtrace("report", root)
    return root


@pytest.mark.slow
def test_demo_report_names_the_cache_leak_with_its_stack(demo: Path) -> None:
    md = (demo / "REPORT.md").read_text()
    leaks = md.split("## Leaks", 1)[1].split("\n## ", 1)[0]
    assert "| workload | 16 blocks, 64.0 KB |" in leaks
    assert "`cache_insert_entry (workload) workload.c:" in leaks and "`cache_thread (workload)" in leaks
    assert "- workload: malloc leaked 16 blocks, 64.0 KB, most at cache_insert_entry ← cache_thread" in md


def test_report_html_in_a_browser(browser: Any, demo: Path) -> None:
    p = Page(browser, demo / "report.html")
    page = p.page
    assert page.locator("h2", has_text="Leaks").count() == 1
    cells = page.locator("table td code", has_text="cache_insert_entry (workload)")
    assert cells.count() >= 1
    # report.html carries no flame data: a link per capture to its own page, which has the leaked view.
    assert page.locator("script").count() == 0 and (demo / "report.html").stat().st_size < 1 << 20
    links = page.locator("a.mt-flame-link")
    assert links.count() == 1 and "workload" in links.first.inner_text()
    assert p.errors == [] and p.offline(), (p.errors, p.requests)
    flame_page = Page(browser, demo / links.first.get_attribute("href"))
    flame = flame_page.page.locator(".mt-flame").first
    flame.locator("select").select_option("leaked")
    assert "cache_insert_entry (workload)" in flame.locator(".mt-node").all_inner_texts()
    assert flame_page.page.locator("a", has_text="the report").get_attribute("href") == "../report.html"
    assert flame_page.errors == [] and flame_page.offline(), (flame_page.errors, flame_page.requests)


def test_flamegraph_page_zoom_search_tooltip(browser: Any, demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "flame.html"
    # Nothing folded: the 64 KB leak is far under 0.1 % of the gross bytes, and search finds only
    # what the page has (test_large_flamegraph_page_is_small_and_renders covers folding).
    run_memtrace("flamegraph", demo / "workload-malloc", "-o", out, "--view", "leaked", "--min-fraction", "0")
    p = Page(browser, out)
    page = p.page
    nodes = page.locator(".mt-node")
    # The thread's entry through glibc (start_thread, and __clone3 where its unwind table reaches
    # it), then the demo's own frames.
    texts = nodes.all_inner_texts()
    assert texts[0] == "all" and texts[-2:] == ["cache_thread (workload)", "cache_insert_entry (workload)"]
    assert "start_thread (libc.so.6)" in texts and all(t.endswith("(libc.so.6)") for t in texts[1:-2])
    libc_roots = texts[1:-2]
    # The memory timeline above: from the window's start (nothing tracked yet: the line starts on
    # the floor) to the end; tracked live beside the allocator's in-use on one scale, drawn on top of
    # it, the footprint on its own scale; the peak marked.
    legends = page.locator(".mt-legend").all_inner_texts()
    assert "tracked live (max 24.1 MB)" in legends[0] and "allocator in use" in legends[0]
    assert "footprint" in legends[1] and "tracked live" not in legends[1]
    assert all("scale 0 to " in x for x in legends) and "peak 24.1 MB at " in legends[0]
    heap = page.locator("svg.mt-panel").first
    assert heap.locator("polyline").count() == 2 and heap.locator("line.mt-peak").count() == 1
    tracked = heap.locator("polyline").last
    assert tracked.get_attribute("data-series") == "tracked live"        # last drawn: on top
    # A short run: the window's start, the peak at its instant, every drain; the allocator's and the
    # footprint's lines reach the end (read at exit); a dot per point.
    points = tracked.get_attribute("points").split()
    ys = [float(pt.split(",")[1]) for pt in points]
    # The peak is a point of its own, at the instant the peak line marks (a drain may come before
    # it when the machine is slow: the order of points is the run's, not fixed).
    peak_x = heap.locator("line.mt-peak").get_attribute("x1")
    xs = [pt.split(",")[0] for pt in points]
    assert len(points) >= 3 and points[0] == "0.0,98.0" and peak_x in xs
    assert ys[xs.index(peak_x)] == min(ys)                                        # the peak, at its instant
    footprint = page.locator("svg.mt-panel").nth(1).locator("polyline").first
    assert footprint.get_attribute("points").split()[-1].startswith("1000.0,")
    assert heap.locator("circle").count() >= len(points)
    leak = page.locator(".mt-node", has_text="cache_insert_entry (workload)")
    leak.hover()
    tip = page.locator(".mt-tip").inner_text()
    assert "cache_insert_entry (workload)" in tip and "64.0 KB (65,536 B, 100.00%)" in tip
    assert "16 allocations" in tip and "workload.c:117" in tip
    # Search: the gross view, every match highlighted, the matched bytes said.
    page.locator("select").select_option("gross")
    page.locator("input[type=search]").fill("cache_insert")
    assert page.locator(".mt-match").all_inner_texts() == ["cache_insert_entry (workload)"]
    assert page.locator(".mt-bar .mt-note").inner_text().startswith("matched 64.0 KB")
    page.locator("input[type=search]").fill("")
    # Zoom into one thread's subtree: its ancestors stay above it, dimmed.
    page.locator(".mt-node", has_text="image_thread (workload)").click()
    assert page.locator(".mt-dim").all_inner_texts() == ["all", *libc_roots]
    box = page.locator(".mt-node", has_text="image_decode_frame (workload)").bounding_box()
    chart = page.locator(".mt-chart").bounding_box()
    assert box["width"] > 0.95 * chart["width"]         # the zoomed subtree fills the width
    page.locator("button", has_text="reset zoom").click()
    assert page.locator(".mt-dim").count() == 0
    # The peak view: what the core saw held at the peak, the image thread's kept 8 MB frames (and at
    # most one it is about to free) far above everything else.
    page.locator("select").select_option("peak")
    page.locator(".mt-node", has_text="image_decode_frame (workload)").hover()
    tip = page.locator(".mt-tip").inner_text()
    assert "24.0 MB (25,165,824 B" in tip and "3 allocations" in tip
    # The temporary view: blocks freed before their thread's next allocation.
    page.locator("select").select_option("temporary")
    assert "net_receive_buffer (workload)" in page.locator(".mt-node").all_inner_texts()
    page.locator("select").select_option("gross")
    assert not page.locator(".mt-tip").is_visible(), "a tooltip outlived the view it described"
    if os.environ.get("MEMTRACE_UPDATE_DOCS"):
        page.locator("input[type=search]").fill("cache_insert")
        page.screenshot(path=str(ROOT / "docs" / "flamegraph.png"), full_page=True)
    assert p.errors == [] and p.offline(), (p.errors, p.requests)


def hostile_capture(path: Path) -> None:
    c = SyntheticCapture(path, "hostile", module="evil")
    sid = c.stack(HOSTILE, PIPE, "main")
    c.calibration("before", 1000, 1 << 20)
    for _ in range(3):
        c.alloc(sid, 16384)
    c.calibration("after", 1000 + 3 * 16384, 2 << 20)
    c.end(captured_s=1.0)


@pytest.mark.slow
def test_hostile_symbol_names_stay_text(browser: Any, tmp_path: Path) -> None:
    folder = tmp_path / "hostile"
    (folder / "hostile-malloc").mkdir(parents=True)
    hostile_capture(folder / "hostile-malloc" / "capture.mtc")
    run_memtrace("report", folder)
    run_memtrace("flamegraph", folder / "hostile-malloc", "-o", tmp_path / "flame.html")
    pages = sorted((folder / "report-flames").glob("*.html"))
    assert len(pages) == 1
    for page_path in (tmp_path / "flame.html", pages[0]):
        p = Page(browser, page_path)
        page = p.page
        assert p.dialogs == [] and p.errors == [] and p.offline(), (p.dialogs, p.errors, p.requests)
        assert page.locator("script").count() == 2          # the page's data and its code: nothing injected
        assert f"{HOSTILE} (evil)" in page.locator(".mt-node").all_inner_texts()
        assert f"{PIPE} (evil)" in page.locator(".mt-node").all_inner_texts()
        assert page.locator(".mt-node", has_text=HOSTILE).first.get_attribute("title") == f"{HOSTILE} (evil)"
    report = Page(browser, folder / "report.html")
    assert report.dialogs == [] and report.errors == [] and report.page.locator("script").count() == 0
    # Escaped exactly once: the name reads as itself, never with an entity or a backslash showing.
    body = report.page.locator("body").inner_text()
    assert HOSTILE in body and "&lt;" not in body and "&amp;" not in body and "\\" not in body
    # In report.html's tables, the | inside a name does not split its cell.
    page = Page(browser, folder / "report.html").page
    for table in page.locator("table").all():
        header = table.locator("tr").first.locator("th").count()
        for tr in table.locator("tr").all()[1:]:
            assert tr.locator("td").count() == header
    assert page.locator("td code", has_text=f"{PIPE} (evil)").count() >= 1
    assert page.locator("td code", has_text=HOSTILE).count() >= 1


# ---- at scale: a capture with 131,072 distinct stacks ---------------------------------------------

LARGE_STACKS = 131_072


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    from memtrace.report.synthetic import write_large_capture

    folder = tmp_path_factory.mktemp("large") / "cc1plus-malloc"
    folder.mkdir()
    return folder, write_large_capture(folder / "capture.mtc", stacks=LARGE_STACKS)


def widest(nodes: Any) -> Any:
    """The widest of these boxes (a narrow one may be too thin to hover)."""
    widths = [b["width"] if (b := n.bounding_box()) else 0 for n in nodes.all()]
    return nodes.nth(widths.index(max(widths)))


@pytest.mark.slow
def test_large_flamegraph_page_is_small_and_renders(browser: Any, large: tuple[Path, dict[str, int]],
                                                    tmp_path: Path) -> None:
    import time

    folder, truth = large
    out = tmp_path / "flame.html"
    t0 = time.perf_counter()
    run_memtrace("flamegraph", folder, "-o", out, timeout=600)
    written = time.perf_counter() - t0
    size = out.stat().st_size
    t0 = time.perf_counter()
    p = Page(browser, out)
    page = p.page
    page.locator(".mt-node").first.wait_for()
    rendered = time.perf_counter() - t0
    # Measured, not asserted (a shared machine): the numbers go to the test's output.
    print(f"\n{LARGE_STACKS:,} stacks: page {size / 1e6:.2f} MB written in {written:.1f} s, rendered in {rendered:.2f} s")
    assert size <= 5 << 20
    assert p.errors == [] and p.offline(), (p.errors, p.requests)
    # Exact totals: the root is the capture's gross bytes, whatever was folded below it.
    page.locator(".mt-node", has_text="all").first.hover()
    assert f"({truth['bytes']:,} B, 100.00%)" in page.locator(".mt-tip").inner_text()
    # Small callees folded into "other" nodes, each saying how many it stands for.
    widest(page.locator(".mt-node.mt-other")).hover()
    assert "smaller callees folded together" in page.locator(".mt-tip").inner_text()
    # One box per function under a caller, its source lines in the tooltip; the long template name
    # shortened on the box, in full on hover.
    vec = widest(page.locator(".mt-node", has_text="std::vector<…>::_M_realloc_insert (cc1plus)"))
    assert vec.get_attribute("title").startswith("std::vector<std::__cxx11::basic_string<char,")
    vec.hover()
    tip = page.locator(".mt-tip").inner_text()
    assert tip.startswith("std::vector<std::__cxx11::basic_string<char") and tip.count("mreallocinsert.cc:") >= 2
    # The timeline: enough points to read, the peak marked; a dragged range redraws the flame graph
    # from the timeline's per-stack data.
    assert page.locator("svg.mt-panel").first.locator("circle").count() >= 40
    assert "peak " in page.locator(".mt-peak-label").inner_text()
    panel = page.locator("svg.mt-panel").first.bounding_box()
    page.mouse.move(panel["x"] + panel["width"] * 0.1, panel["y"] + 20)
    page.mouse.down()
    page.mouse.move(panel["x"] + panel["width"] * 0.5, panel["y"] + 20, steps=4)
    page.mouse.up()
    assert page.locator("select").input_value() == "@range"
    assert page.locator(".mt-bar .mt-note").inner_text().startswith("live at ")
    assert page.locator(".mt-node").count() > 1
    page.locator("select").select_option("gross")
    assert page.locator("select option[value='@range']").count() == 0
    assert p.errors == [], p.errors


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_report_of_many_large_captures_is_small(browser: Any, large: tuple[Path, dict[str, int]],
                                                tmp_path: Path) -> None:
    import shutil

    folder, _ = large
    many = tmp_path / "many"
    for i in range(3):
        shutil.copytree(folder, many / f"cc1plus{i}-malloc")
    proc = run_memtrace("report", many, "--out", tmp_path / "out", "--progress", timeout=900)
    progress = [ln for ln in proc.stderr.splitlines() if ln.startswith("report: [")]
    assert len(progress) == 3 and all(": ok (" in ln for ln in progress), proc.stderr
    html = tmp_path / "out" / "report.html"
    pages = sorted((tmp_path / "out" / "report-flames").glob("*.html"))
    print(f"\nreport of 3 x {LARGE_STACKS:,} stacks: report.html {html.stat().st_size / 1e6:.2f} MB, "
          f"pages {[round(p.stat().st_size / 1e6, 2) for p in pages]} MB")
    assert html.stat().st_size <= 10 << 20 and len(pages) == 3
    assert all(p.stat().st_size <= 5 << 20 for p in pages)
    p = Page(browser, html)
    assert p.errors == [] and p.offline() and p.page.locator("a.mt-flame-link").count() == 3


# ---- fds and threads: objects by stack --------------------------------------------------------------


@pytest.mark.parametrize(("tracer", "program", "view", "function"), [
    ("fds", "fd_leaker", "open", "open_config_files"),
    ("threads", "thread_leaker", "created", "leak_joinable"),
])
@pytest.mark.slow
def test_fds_and_threads_flame_graphs_count_objects(browser: Any, compile_c: Any, tmp_path: Path, tracer: str,
                                                    program: str, view: str, function: str) -> None:
    work = tmp_path / "files"
    work.mkdir()
    args = [work] if tracer == "fds" else []
    run_memtrace(tracer, "--device", "local", "--window", "30", "--quiet", "--out", tmp_path / "c", "--",
                 compile_c(program), *args, timeout=180)
    out = tmp_path / "flame.html"
    run_memtrace("flamegraph", tmp_path / "c", "-o", out)
    p = Page(browser, out)
    page = p.page
    assert p.errors == [] and p.offline(), (p.errors, p.requests)
    assert page.locator("select").input_value() == view
    node = page.locator(".mt-node", has_text=function).first
    node.hover()
    tip = page.locator(".mt-tip").inner_text()
    assert " B," not in tip and "objects" in tip             # counted, not weighed in bytes
    # The same counts for the other tools: folded stacks (the default view) and diff's views.
    folded = run_memtrace("export", tmp_path / "c", "--format", "collapsed").stdout.splitlines()
    total = sum(int(ln.rsplit(" ", 1)[1]) for ln in folded)
    summary = json.loads(run_memtrace("show", tmp_path / "c", "--json", "--top", "0").stdout)
    rows = summary["open_at_end"]["by_stack"] if tracer == "fds" else summary["created_by_stack"]
    assert total == sum(r["count"] for r in rows if r["frames"]) > 0
    if tracer == "threads":
        assert total == summary["created"]
    pair = json.loads(run_memtrace("diff", tmp_path / "c", tmp_path / "c", "--json").stdout)["pairs"][0]
    assert view in pair["views"] and pair["views"][view]["total"]["base"] == total
    # A view that does not apply: one line, non-zero exit, no page.
    bad = run_memtrace("flamegraph", tmp_path / "c", "-o", tmp_path / "x.html", "--view", "peak", check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "has no peak view" in bad.stderr
    assert not (tmp_path / "x.html").exists()
