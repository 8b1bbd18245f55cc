"""memtrace report on captures with known ground truth: every cell it touches, and robustness."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from memtrace.capture import FORMAT_VERSION, HEADER, NO_END, header_bytes
from memtrace.commands.report import command
from memtrace.errors import InputError
from memtrace.report import build_report
from memtrace.units import fmt_bytes

_spec = importlib.util.spec_from_file_location(
    "make_captures", Path(__file__).resolve().parents[1] / "data" / "report" / "make_captures.py")
assert _spec and _spec.loader
mc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mc)
TRUTH: dict[str, Any] = mc.TRUTH
MiB = 1 << 20


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, int]:
    folder = tmp_path_factory.mktemp("captures")
    mc.build(folder)
    result = build_report(folder)
    doc = json.loads((folder / "report.json").read_text())
    return doc, (folder / "REPORT.md").read_text(), result.exit_code


def target(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in doc["targets"] if t["target"] == name)


def row(md: str, first_cell: str, after: str = "") -> list[str]:
    """The cells of the first Markdown table row starting with first_cell (after a heading)."""
    text = md.split(after, 1)[1] if after else md
    for line in text.splitlines():
        if line.startswith(f"| {first_cell} |"):
            return [c.strip() for c in line.strip("|").split("|")]
    raise AssertionError(f"no row {first_cell!r}")


def test_exit_status_clean(report: tuple[dict[str, Any], str, int]) -> None:
    doc, md, rc = report
    assert rc == 0 and doc["skipped"] == []
    assert "None: every capture in the folder was read in full." in md


def test_malloc_numbers(report: tuple[dict[str, Any], str, int]) -> None:
    doc, md, _ = report
    for name in ("alpha", "beta"):
        m, truth = target(doc, name)["malloc"], TRUTH[name]
        assert m["gross_bytes"] == truth["gross"]
        assert m["alloc_calls"] == truth["calls"]
        assert m["in_use_delta"] == truth["in_use_delta"]
        assert m["live_bytes"] == truth["live_bytes"]
        assert m["live_count"] == truth["live_count"]
        assert {f["family"]: f["bytes"] for f in m["families"]} == truth["families"]
    assert target(doc, "beta")["malloc"]["churn_ratio"] == TRUTH["beta"]["churn"] == 201.0
    assert [(t["calls"], t["bytes"]) for t in target(doc, "alpha")["malloc"]["tiers"]] == TRUTH["alpha"]["tiers"]
    # Markdown cells carry the same numbers.
    cells = row(md, "beta", "### Churn vs net")
    assert cells == ["beta", fmt_bytes(1005 * 65536), "1,005", "12.5 s (window 20 s)", "+320.0 KB", "320.0 KB", "5",
                     "201.0×", "+320.0 KB"]
    cells = row(md, "alpha", "### Size tiers")
    assert cells == ["alpha", "100 / 6.2 KB", "0 / 0 B", "0 / 0 B", "3 / 24.0 KB", "10 / 160.0 KB", "2 / 2.0 MB"]
    assert row(md, "malloc", "### alpha") == ["malloc", "image decode", "2.0 MB", "2", "2.0 MB", "2"]


def test_panorama_row(report: tuple[dict[str, Any], str, int]) -> None:
    doc, md, _ = report
    cells = row(md, "beta", "## Panorama")
    assert cells[1] == "not traced"
    assert cells[2] == "62.8 MB / 12.5 s (window 20 s) · 1,005 calls"
    assert cells[3] == "in-use +320.0 KB · live 320.0 KB · 5 survivors"
    assert cells[5] == "gzip/compression 62.5 MB · network buffers 320.0 KB"
    assert cells[6] == "completed"
    assert cells[7] == "stacks 100.0 % · live 100.0 %"
    # A target that died before allocating keeps its row, with the reason.
    gamma = row(md, "gamma", "## Panorama")
    assert gamma[2].startswith("not measurable (launch-storm: the target died 1.2 s")
    assert gamma[6].startswith("launch-storm:")
    cam = row(md, "camera", "## Panorama")
    assert cam[1] == "10.6 MB (4 surfaces)" and cam[4] == "2.1 MB"
    assert cam[5] == "IOSurface: media/camera 10.6 MB"


def test_iosurface_chapter(report: tuple[dict[str, Any], str, int]) -> None:
    doc, md, _ = report
    s, truth = target(doc, "camera")["iosurface"], TRUTH["camera"]
    assert s["surfaces"] == truth["surfaces"] and s["bytes"] == truth["surface_bytes"]
    assert s["held_at_end"]["count"] == truth["held_surfaces"]
    assert {r["format"]: (r["count"], r["bytes"]) for r in s["by_format"]} == \
        {"420v": (3, 3 * 933888), "BGRA": (1, 8306688)}
    assert row(md, "BGRA") == ["BGRA", "1", "7.9 MB", "1920×1080 (7680 B/row, 7.9 MB)"]
    assert [f["family"] for f in s["families"]] == ["media/camera"]


def test_purgeable_chapter(report: tuple[dict[str, Any], str, int]) -> None:
    doc, md, _ = report
    p, truth = target(doc, "camera")["purgeable"], TRUTH["camera"]
    assert p["transitions"] == truth["transitions"]
    assert p["transition_bytes"] == truth["transition_bytes"]
    assert p["held_bytes"] == truth["held"] == 2 * MiB + 131072
    assert p["stolen"] == {"count": 1, "bytes": 2 * MiB}
    assert (p["created_purgeable"], p["created_bytes"]) == (truth["created"], truth["created_bytes"])
    assert p["madvise"] == truth["madvise"]
    assert (p["set_calls"], p["get_calls"]) == (truth["set_calls"], truth["get_calls"])
    assert row(md, "camera", "### Transition matrix") == [
        "camera", "3 (6.0 MB)", "1 (2.0 MB)", "2 (128.0 KB)", "1 (2.0 MB)", "7", "2", "1 (2.0 MB)", "3 (6.0 MB)",
        "2.1 MB"]
    callers = {(r["caller"], r["transition"]): r["count"] for r in p["by_caller"]}
    assert callers == {("frame_cache_make_purgeable", "0->1"): 3, ("frame_cache_reacquire", "2->0"): 1,
                       ("frame_cache_reacquire", "1->0"): 1, ("nw_segment_empty", "0->2"): 2}
    # madvise is its own line, never a transition.
    assert "madvise (the separate reusable-page line, not purgeable transitions): MADV_FREE_REUSABLE (7) ×4" in md


def test_findings_cite_numbers(report: tuple[dict[str, Any], str, int]) -> None:
    doc, md, _ = report
    f = {x["kind"]: x for x in doc["findings"]}
    churn = f["churn"]["items"]
    assert [i["target"] for i in churn] == ["beta", "alpha"]     # gamma is not measurable
    assert "churn 201.0×" in churn[0]["text"] and "the largest churn is beta" in f["churn"]["text"]
    dom = {i["target"]: (i["family"], i["bytes"], i["attributed_bytes"]) for i in f["dominant-family"]["items"]}
    assert dom["alpha"] == ("image decode", 2 * MiB, 2 * MiB + 163840 + 24576)
    assert dom["beta"] == ("gzip/compression", 1000 * 65536, 1005 * 65536)
    assert f["purgeable-held"]["items"][0]["held_bytes"] == 2 * MiB + 131072
    assert "- camera: 2.1 MB held VOLATILE/EMPTY at the end (0→1 6.0 MB + 0→2 128.0 KB − 1→0 2.0 MB − 2→0 2.0 MB)" in md


def test_same_target_runs_are_side_by_side_not_summed(tmp_path: Path) -> None:
    mc.beta(tmp_path / "run1.mtc")
    mc.beta(tmp_path / "run2.mtc")
    result = build_report(tmp_path)
    m = target(result.document, "beta")["malloc"]
    assert m["captures"] == 2 and [r["path"] for r in m["runs"]] == ["run1.mtc", "run2.mtc"]
    # Each run has its own figures: two 20 s windows are never one 40 s window.
    for r in m["runs"]:
        assert r["gross_bytes"] == TRUTH["beta"]["gross"] and r["window_s"] == 20.0 and r["captured_s"] == 12.5
        assert r["live_by_stack"][0]["count"] == 5 and len(r["live_by_stack"]) == 1
    md = result.markdown
    assert row(md, "beta (run1.mtc)", "### Churn vs net")[:4] == ["beta (run1.mtc)", fmt_bytes(1005 * 65536), "1,005",
                                                                 "12.5 s (window 20 s)"]
    assert row(md, "beta (run2.mtc)", "### Churn vs net")[3] == "12.5 s (window 20 s)"
    pano = row(md, "beta", "## Panorama")[2]
    assert pano == "<br>".join(["62.8 MB / 12.5 s (window 20 s) · 1,005 calls"] * 2)
    assert "40 s" not in md


def test_robustness_skipped_section_and_exit(tmp_path: Path) -> None:
    mc.alpha(tmp_path / "good.mtc")
    mc.truncate(tmp_path / "good.mtc", tmp_path / "cut" / "capture.mtc", 30)
    (tmp_path / "newer.mtc").write_bytes(header_bytes(FORMAT_VERSION + 1) + b"\0" * 8)
    (tmp_path / "garbage.mtc").write_bytes(b"this is not a capture at all")
    (tmp_path / "empty.mtc").write_bytes(header_bytes())
    (tmp_path / "census-bad.json").write_text("{not json")
    result = CliRunner().invoke(command, [str(tmp_path), "--out", str(tmp_path / "out")], standalone_mode=False)
    assert result.exception is None and result.return_value == 1
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    reasons = {s["path"]: (s["partial"], s["reason"]) for s in doc["skipped"]}
    assert reasons["newer.mtc"][1].startswith(f"capture format version {FORMAT_VERSION + 1} is newer")
    assert "bad magic" in reasons["garbage.mtc"][1]
    assert "empty capture" in reasons["empty.mtc"][1]
    assert reasons["cut/capture.mtc"][0] is True and "truncated at byte" in reasons["cut/capture.mtc"][1]
    assert "not a readable JSON document" in reasons["census-bad.json"][1]
    # The truncated capture is still reported with what was read, next to the good one.
    assert target(doc, "alpha")["malloc"]["captures"] == 2
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert "| garbage.mtc | no | not a memtrace capture (bad magic) |" in md


def test_empty_folder_is_an_error_not_an_empty_report(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no captures here")
    with pytest.raises(InputError, match="nothing to report: no capture"):
        build_report(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]     # no empty REPORT.md
    from tests.conftest import run_memtrace

    r = run_memtrace("report", tmp_path, check=False)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"memtrace: error: {tmp_path}: nothing to report: no capture (*.mtc) and no census/jetsam "
                        f"JSON document in this folder or below it\n")


def test_a_capture_without_end_is_reported_partly_and_said(tmp_path: Path) -> None:
    """Not "every capture read in full": a capture whose END record never came is listed as partly
    read, its numbers still reported, and the exit status is 1."""
    mc.alpha(tmp_path / "a.mtc")
    c = mc.SyntheticCapture(tmp_path / "cut.mtc", "beta")
    c.alloc(c.stack("beta_alloc", "main"), 65536)
    c.flush()
    c.writer.close()                            # closed without END: memtrace was killed
    result = CliRunner().invoke(command, [str(tmp_path)], standalone_mode=False)
    assert result.exception is None and result.return_value == 1
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["skipped"] == [{"path": "cut.mtc", "partial": True, "reason": f"{NO_END}; reported with the 5 "
                                                                              f"records read"}]
    assert target(doc, "beta")["malloc"]["gross_bytes"] == 65536
    md = (tmp_path / "REPORT.md").read_text()
    assert "every capture in the folder was read in full" not in md
    assert f"| cut.mtc | partly (reported with what was read) | {NO_END}; reported with the 5 records read |" in md


def test_unknown_tracer_is_listed_not_crashed(tmp_path: Path) -> None:
    c = mc.SyntheticCapture(tmp_path / "t.mtc", "zeta", tracer="gpu-memory")
    c.end()
    result = build_report(tmp_path, write=False)
    assert result.exit_code == 1
    assert "tracer 'gpu-memory'" in result.skipped[0].reason
    assert target(result.document, "zeta")["unanalyzed"] == [{"path": "t.mtc", "tracer": "gpu-memory"}]


def test_census_and_jetsam_documents_are_chapters(tmp_path: Path) -> None:
    mc.beta(tmp_path / "b.mtc")
    (tmp_path / "census.json").write_text(json.dumps({"kind": "census", "version": 1, "platform": "linux",
                                                      "device": {"name": "box"}, "rows": [], "totals": {}}))
    (tmp_path / "jetsam-x.json").write_text(json.dumps({"kind": "jetsam", "version": 1, "totals": {}, "reports": []}))
    result = build_report(tmp_path, write=False)
    assert "## Census" in result.markdown and result.exit_code == 0
    assert len(result.document["jetsam"]) == 1


def test_user_families_and_bad_rules(tmp_path: Path) -> None:
    mc.alpha(tmp_path / "a.mtc")
    rules = tmp_path / "rules.yaml"
    rules.write_text("families:\n  - name: SIMD scratch\n    symbols: ['simd_*']\n")
    doc = build_report(tmp_path, families=rules, write=False).document
    assert "SIMD scratch" in [f["family"] for f in target(doc, "alpha")["malloc"]["families"]]
    rules.write_text("families: [\n")
    result = CliRunner().invoke(command, [str(tmp_path), "--families", str(rules)], standalone_mode=False)
    assert result.exception is not None and str(rules) in str(result.exception)


def test_atomic_write_leaves_no_temp(tmp_path: Path) -> None:
    mc.alpha(tmp_path / "a.mtc")
    build_report(tmp_path)
    build_report(tmp_path)                      # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["REPORT.md", "a.mtc", "report-flames", "report.html",
                                                          "report.json"]
    assert [p.name for p in (tmp_path / "report-flames").iterdir()] == ["000-a.mtc.html"]


def test_header_constant_layout() -> None:
    # The robustness test forges headers through capture.py's own struct: same size as a real one.
    assert HEADER.size == struct.calcsize("<8sHHI")


def test_leaks_row_says_not_traced_or_not_scanned() -> None:
    from memtrace.report.aggregate import chapters
    from memtrace.report.chapters.leaks import markdown

    targets = [{"target": "server", "fds": [{"open_at_end": {"count": 3}}]},
               {"target": "app", "malloc": {"captures": 1, "runs": [{"path": "a", "leaks": None}]},
                "threads": [{"leaked": {"count": 2}}]}]
    rows = {line.split(" | ")[0].strip("| "): line for line in markdown(targets, chapters()) if line.startswith("| ")}
    assert rows["server"] == "| server | not traced | — | 3 | not traced |"
    assert rows["app"] == "| app | not scanned (no --leaks) | — | not traced | 2 |"
