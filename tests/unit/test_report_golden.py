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
