"""``memtrace diff`` across a rebuild: the executable's name changed, its families did not."""

from __future__ import annotations

from pathlib import Path

from memtrace.report.synthetic import SyntheticCapture
from memtrace.views.diff import diff


def capture(path: Path, module: str, blocks: int) -> None:
    c = SyntheticCapture(path, "app", module=module)
    sid = c.stack("simd_buffer_alloc", "main")
    for _ in range(blocks):
        c.alloc(sid, 16384)
    c.end(captured_s=1.0)


def test_a_rebuilt_executable_diffs_family_by_family(tmp_path: Path) -> None:
    capture(tmp_path / "base.mtc", "app", 2)
    capture(tmp_path / "new.mtc", "app-1.1", 5)          # renamed by the rebuild
    pair = diff(tmp_path / "base.mtc", tmp_path / "new.mtc")["pairs"][0]
    assert pair["families"] == [{"family": "other: simd_buffer_alloc",
                                 "bytes": {"base": 2 * 16384, "new": 5 * 16384, "delta": 3 * 16384},
                                 "count": {"base": 2, "new": 5, "delta": 3},
                                 "live_bytes": {"base": 2 * 16384, "new": 5 * 16384, "delta": 3 * 16384}}]
