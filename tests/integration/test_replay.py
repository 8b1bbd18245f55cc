"""The record-source seam (issue 24): a capture replayed through the capture loop by
memtrace.replay.ReplaySource -- a backend with no Frida in it -- gives a capture with the same
records and the same exact numbers, and ends as a target that exited."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import FILE_NAME, RecordType, read_records
from memtrace.capture_loop import CaptureLoop, CaptureOptions, run_capture
from memtrace.errors import InputError
from memtrace.replay import ReplaySource
from memtrace.target import TargetSpec
from memtrace.tracers import get as get_tracer
from memtrace.ui import SilentUI


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_replayed_capture_has_the_same_records_and_numbers(compile_c, tmp_path: Path) -> None:
    exe = str(compile_c("pattern"))
    first = run_capture("malloc", TargetSpec(device="local", argv=[exe]),
                        CaptureOptions("malloc", window=30, out=tmp_path / "live"))
    assert first.ended == "target-exited"
    tracer = get_tracer("malloc")
    assert tracer is not None and first.pid is not None
    source = ReplaySource(first.path)
    again = CaptureLoop(source, tracer, TargetSpec(device="local", pid=first.pid, launch="none"),
                        CaptureOptions("malloc", out=tmp_path / "replayed"), SilentUI()).run()
    assert again.path == tmp_path / "replayed" / FILE_NAME
    assert again.ended == "target-exited" and again.pid == first.pid

    live, replayed = list(read_records(first.path)), list(read_records(again.path))

    def sent(records: list) -> list[tuple[RecordType, bytes]]:
        return [(r.type, r.data) for r in records if r.type in (RecordType.BATCH, RecordType.MODULES,
                                                               RecordType.RESULT)]

    assert sent(replayed) == sent(live) and len(sent(live)) > 1
    meta = next(r.body for r in replayed if r.type == RecordType.META)
    assert meta["host"]["replay_of"] == str(first.path) and "frida" not in meta["host"]

    a, b = summarize(live).to_json(top=20), summarize(replayed).to_json(top=20)
    for key in ("calls", "gross_bytes", "tiers", "live", "dropped"):
        assert a[key] == b[key], key
    # The pattern program's exact numbers (test_malloc's), through the replay.
    assert b["calls"]["malloc"] == 1000 + 500 + 10 + 1 and b["calls"]["calloc"] == 20
    assert b["live"]["count"] == 415
    stacks = [s for s in b["top_stacks"] if s["frames"] and s["frames"][0]["function"] == "alloc_4k_batch"]
    assert [(s["count"], s["bytes"]) for s in stacks] == [(1000, 4096 * 1000)]


def test_a_file_without_meta_and_recon_is_refused(tmp_path: Path) -> None:
    from memtrace.capture import CaptureWriter

    w = CaptureWriter(tmp_path / FILE_NAME)
    w.write(RecordType.WARNING, {"message": "only this"})
    w.close()
    with pytest.raises(InputError, match="no META and RECON records"):
        ReplaySource(tmp_path / FILE_NAME)
