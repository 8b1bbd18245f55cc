"""Golden: the checked-in synthetic captures -> REPORT.md, compared byte for byte.

Regenerate after an intended change (and review the diff):
    .venv/bin/python tests/data/report/make_captures.py
    .venv/bin/memtrace report tests/data/report/captures --out tests/data/report/expected
"""

from __future__ import annotations

from pathlib import Path

from memtrace.report import build_report

DATA = Path(__file__).resolve().parents[1] / "data" / "report"


def test_report_matches_golden(tmp_path: Path) -> None:
    result = build_report(DATA / "captures", out=tmp_path)
    expected = (DATA / "expected" / "REPORT.md").read_text(encoding="utf-8")
    assert (tmp_path / "REPORT.md").read_text(encoding="utf-8") == expected
    # The truncated capture is reported and listed: the exit status says so.
    assert result.exit_code == 1
    assert [s.path for s in result.skipped] == ["delta-truncated/capture.mtc"]


def test_parallel_workers_give_the_same_report_and_progress_per_capture(tmp_path: Path) -> None:
    seen: list[tuple[int, int, str, str]] = []
    build_report(DATA / "captures", out=tmp_path, jobs=2,
                 progress=lambda done, total, path, seconds, status: seen.append((done, total, path, status)))
    expected = (DATA / "expected" / "REPORT.md").read_text(encoding="utf-8")
    assert (tmp_path / "REPORT.md").read_text(encoding="utf-8") == expected
    assert [d for d, *_ in seen] == list(range(1, 8)) and {t for _, t, _, _ in seen} == {7}
    status = {path: st for _, _, path, st in seen}
    assert len(status) == 7 and status["delta-truncated/capture.mtc"] == "partly read"
    assert {st for p, st in status.items() if p != "delta-truncated/capture.mtc"} == {"ok"}
    # Each capture with stacks has its own page, linked from report.html.
    pages = sorted(p.name for p in (tmp_path / "report-flames").iterdir())
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert pages and all(f'href="report-flames/{name}"' in html for name in pages)
