"""The HTML pages in a real headless browser (Debian's chromium, driven by Playwright).

The demo workload is traced with --leaks, reported, and its flame graph opened: the leaking
function is on the page with its stack, search finds it, the tooltip gives bytes, count and
file:line, nothing is fetched from the network and the console stays clean.  A capture whose
functions are named like markup (``<script>``, ``|``) must stay text.

Set MEMTRACE_UPDATE_DOCS=1 to save the flame graph's screenshot as docs/flamegraph.png (README).
"""

from __future__ import annotations

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
    # The flame graph of the capture, under the report, with the leaked view available.
    flame = page.locator(".mt-flame").first
    flame.locator("select").select_option("leaked")
    assert "cache_insert_entry (workload)" in flame.locator(".mt-node").all_inner_texts()
    assert p.errors == [] and p.offline(), (p.errors, p.requests)


def test_flamegraph_page_zoom_search_tooltip(browser: Any, demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "flame.html"
    run_memtrace("flamegraph", demo / "workload-malloc", "-o", out, "--view", "leaked")
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
    # the floor) to the end, byte series on one scale.
    legend = page.locator(".mt-legend").inner_text()
    assert "tracked live (max 24.1 MB)" in legend and "allocator in use" in legend and "footprint" in legend
    assert "scale 0 to " in legend
    lines = page.locator("svg polyline")
    assert lines.count() == 3
    tracked = lines.nth(0).get_attribute("points").split()
    assert len(tracked) >= 2 and tracked[0] == "0.0,98.0" and tracked[-1].startswith("1000.0,")
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
    for page_path in (tmp_path / "flame.html", folder / "report.html"):
        p = Page(browser, page_path)
        page = p.page
        assert p.dialogs == [] and p.errors == [] and p.offline(), (p.dialogs, p.errors, p.requests)
        assert page.locator("script").count() == 2          # the page's data and its code: nothing injected
        assert f"{HOSTILE} (evil)" in page.locator(".mt-node").all_inner_texts()
        assert f"{PIPE} (evil)" in page.locator(".mt-node").all_inner_texts()
    # In report.html's tables, the | inside a name does not split its cell.
    page = Page(browser, folder / "report.html").page
    for table in page.locator("table").all():
        header = table.locator("tr").first.locator("th").count()
        for tr in table.locator("tr").all()[1:]:
            assert tr.locator("td").count() == header
    assert page.locator("td code", has_text=f"{PIPE} (evil)").count() >= 1
    assert page.locator("td code", has_text=HOSTILE).count() >= 1
