"""The capture file under a full disk and damage, with real programs on Frida's local device.

Full disk (issue 10.6): on a small tmpfs memtrace must end the capture at its last complete record
with an END record that says why, exit non-zero with one line, and leave the target running
unharmed -- a launched one with --keep-running and a --pid one finish normally.  A disk full
before the capture starts is one line and nothing launched or attached.  Damage (issue 10.7): a
flip at any byte of a real capture is detected (with its byte offset) and never changes a number.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import run_memtrace
from tests.hostile_captures import scratch_dir

from memtrace.capture import FORMAT_VERSION, NO_END, CaptureInfo, RecordType, read_records
from memtrace.report import build_report

ERROR_LINE = ("memtrace: error: {path}: cannot write the capture: No space left on device (ENOSPC); it holds "
              "everything up to byte {at}; its END record says so; {lost} record(s), {lost_bytes} bytes, not "
              "written; tracing stopped there and memtrace detached from the target\n")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB filesystem (tmpfs) that fills up in a couple of seconds of tracing."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# Uncompressed agent records: churn's repetitive events compress ~50x, and these tests need the
# capture to fill the small disk within the target's run.
RAW = {"MEMTRACE_CAPTURE_ZLIB": "off"}


def wait_for(path: Path, timeout: float = 60) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


def check_full_disk_capture(cap: Path, stderr: str) -> None:
    """One line; the capture reads back to the failure, closed by an END record with the reason."""
    info = CaptureInfo(cap)
    records = list(read_records(cap, info))
    end = records[-1]
    err = end.body["capture_error"]
    assert stderr == ERROR_LINE.format(path=cap / "capture.mtc", at=err["at_byte"], lost=err["lost_records"],
                                       lost_bytes=err["lost_bytes"])
    assert end.type == RecordType.END and info.ended and not info.truncated
    assert err["error"] == "No space left on device (ENOSPC)" and err["lost_records"] >= 1
    assert info.stopped == f"the capture stopped early at byte {err['at_byte']}: No space left on device (ENOSPC)"
    batches = [r for r in records if r.type == RecordType.BATCH]
    assert len(batches) >= 2          # it captured until the disk was full, not nothing
    # After the failure point only what makes the records before it readable -- the names of their
    # stacks, held by the writer and put into the reserve (a local target's are named at the end) --
    # then the END, which ends the file.
    after = [r for r in records if r.offset >= err["at_byte"]]
    assert after[0].offset == err["at_byte"] and after[-1] is end
    assert {r.type for r in after[:-1]} <= {RecordType.SYMBOLS, RecordType.MODULES}
    assert any(r.type == RecordType.SYMBOLS for r in records)      # the stacks written are named
    assert (cap / "capture.mtc").stat().st_size == end.offset + len(json.dumps(end.body, separators=(",", ":"))) + 12
    assert sorted(p.name for p in cap.iterdir()) == ["capture.mtc"]     # the reserve was used and freed
    # export and report say it stopped early, and exit 1.
    r = run_memtrace("export", cap, check=False)
    assert r.returncode == 1 and json.loads(r.stdout.splitlines()[-1])["record"] == "truncated"
    result = build_report(cap.parent, out=cap.parent.parent / "report", write=False)
    assert result.exit_code == 1 and result.skipped[0].partial
    assert result.skipped[0].reason.startswith("the capture stopped early at byte")


@pytest.mark.slow
def test_full_disk_ends_the_capture_and_the_launched_target_finishes(
        small_disk: Path, tmp_path: Path, compile_c: Callable[..., Path]) -> None:
    churn = compile_c("churn")
    marker = tmp_path / "finished"
    cap = small_disk / "cap"
    # --events: one record per allocation, so the capture grows by megabytes a second.
    r = run_memtrace("malloc", "--device", "local", "--window", "60", "--events", "--keep-running", "--quiet", "--out", cap,
                     "--", churn, "8", marker, "20", check=False, env=RAW)
    assert r.returncode == 2, r.stderr
    check_full_disk_capture(cap, r.stderr)
    assert wait_for(marker).startswith("finished ")       # detached, it ran on to its normal end
    end = [x for x in read_records(cap) if x.type == RecordType.END][-1].body
    assert end["ended"] == "write-failed"


@pytest.mark.slow
def test_full_disk_detaches_from_a_pid_that_lives_on(small_disk: Path, tmp_path: Path,
                                                     compile_c: Callable[..., Path]) -> None:
    marker = tmp_path / "finished"
    target = subprocess.Popen([str(compile_c("churn")), "15", str(marker), "20"], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().startswith("ready")
        cap = small_disk / "cap"
        r = run_memtrace("malloc", "--device", "local", "--window", "60", "--events", "--quiet", "--out", cap,
                         "--pid", str(target.pid), check=False, env=RAW)
        assert r.returncode == 2, r.stderr
        check_full_disk_capture(cap, r.stderr)
        assert target.wait(timeout=60) == 0            # detached, it ran on to its normal end
        assert marker.read_text().startswith("finished ")
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()


def fill(disk: Path, leave: int) -> None:
    free = shutil.disk_usage(disk).free
    (disk / "filler").write_bytes(b"\0" * max(0, free - leave))


def test_a_disk_full_before_the_start_is_one_line_and_nothing_runs(small_disk: Path, tmp_path: Path,
                                                                  compile_c: Callable[..., Path]) -> None:
    churn = compile_c("churn")
    fill(small_disk, 8192)
    marker = tmp_path / "finished"
    cap = small_disk / "cap"
    r = run_memtrace("malloc", "--device", "local", "--window", "5", "--out", cap, "--", churn, "0", marker,
                     check=False)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"memtrace: error: {cap / 'capture.mtc'}: cannot start the capture: No space left "
                               f"on device (") and r.stderr.endswith(" bytes free on its disk)\n")
    assert r.stderr.count("\n") == 1
    assert not cap.exists()                         # nothing left behind
    time.sleep(1)
    assert not marker.exists()                      # and nothing was launched
    # --pid: never attached, so the process runs on untouched.
    target = subprocess.Popen([str(churn), "1", str(marker), "5"], stdout=subprocess.PIPE, text=True)
    assert target.stdout is not None and target.stdout.readline().startswith("ready")
    r = run_memtrace("malloc", "--device", "local", "--window", "5", "--out", cap, "--pid", str(target.pid),
                     check=False)
    assert r.returncode == 2 and "cannot start the capture: No space left on device" in r.stderr
    assert target.wait(timeout=60) == 0 and marker.read_text().startswith("finished ")


def test_a_full_disk_and_the_target_s_death_are_both_in_the_end(small_disk: Path,
                                                                  compile_c: Callable[..., Path]) -> None:
    """The target fills the disk, then allocates and exits 3: what memtrace writes after that fails,
    and the END (written into its reserve) keeps the death as the host read it (the exit status,
    from a pidfd) beside the write failure."""
    cap = small_disk / "cap"
    r = run_memtrace("malloc", "--device", "local", "--window", "60", "--events", "--quiet", "--out", cap,
                     "--", compile_c("disk_filler"), small_disk / "filler", check=False)
    assert r.returncode == 2, (r.stderr, _end_body(cap))
    assert "disk full" in r.stderr
    assert r.stderr.endswith("tracing stopped there and memtrace detached from the target\n")
    records = list(read_records(cap))
    end = records[-1]
    assert end.type == RecordType.END
    assert end.body["ended"] == "target-exited"
    assert end.body["reason"] == "the target exited on its own (exit status 3)"
    assert end.body["evidence"]["exit_status"] == {"exit_status": 3}
    assert end.body["capture_error"]["error"] == "No space left on device (ENOSPC)"
    assert end.body["capture_error"]["lost_records"] >= 1


def _end_body(cap: Path) -> object:
    """What the capture's END says (a failure's message)."""
    try:
        return [r.body for r in read_records(cap) if r.type == RecordType.END]
    except Exception as e:      # noqa: BLE001 -- a message, whatever the capture holds
        return f"unreadable: {e}"


@pytest.fixture(scope="module")
def real_captures(tmp_path_factory: pytest.TempPathFactory, compile_c: Callable[..., Path]) -> list[Path]:
    """Small real captures (format 2) of three tracers on one short program."""
    out = tmp_path_factory.mktemp("real")
    prog = compile_c("exit_code")
    caps = []
    for tracer in ("malloc", "threads", "fds"):
        run_memtrace(tracer, "--device", "local", "--window", "10", "--quiet", "--out", out / tracer, "--", prog)
        caps.append(out / tracer / "capture.mtc")
    return caps


@pytest.mark.slow
def test_every_flip_of_a_real_capture_is_detected_with_its_offset(real_captures: list[Path], tmp_path: Path) -> None:
    with scratch_dir(tmp_path) as scratch:
        flip_every_byte(real_captures, scratch)


def flip_every_byte(real_captures: list[Path], tmp_path: Path) -> None:
    for cap in real_captures:
        blob = cap.read_bytes()
        info = CaptureInfo(cap)
        records = list(read_records(cap, info))
        assert info.version == FORMAT_VERSION and info.problem is None
        starts = [r.offset for r in records]
        v = tmp_path / "v.mtc"
        for off in range(len(blob)):
            b = bytearray(blob)
            b[off] ^= 1 << (off % 8)
            v.write_bytes(b)
            info = CaptureInfo(v)
            try:
                got = list(read_records(v, info))
            except Exception as e:             # only the header: a CaptureError naming it
                assert off < 16 and type(e).__name__ == "CaptureError", (off, e)
                continue
            hit = max(s for s in starts if s <= off)        # the record the flip is in: damage, not a tear
            problem = info.problem or ""
            assert info.corrupt and problem.startswith(f"corrupt at byte {hit}: "), (off, problem)
            # Only the record hit is lost: the reader skips it (or skips a damaged header to the
            # next intact record) and reads every other one (issue 20.8).
            assert [r.offset for r in got] == [s for s in starts if s != hit], (off, problem)


def test_a_real_capture_cut_anywhere_never_tracebacks(real_captures: list[Path], tmp_path: Path) -> None:
    folder = tmp_path / "cut"
    folder.mkdir()
    for cap in real_captures:
        blob = cap.read_bytes()
        whole = len(list(read_records(cap)))
        step = max(1, len(blob) // 100)
        for cut in range(16, len(blob), step):
            (folder / "capture.mtc").write_bytes(blob[:cut])
            result = build_report(folder, write=False)
            assert result.exit_code == 1
            assert result.skipped[0].reason.startswith(("truncated at byte", "empty capture", NO_END))
        assert whole > 3


@pytest.mark.slow
def test_export_and_report_of_a_capture_killed_before_its_end(compile_c: Callable[..., Path], tmp_path: Path) -> None:
    """memtrace SIGKILLed in the window: no END record; export and report say so and exit 1."""
    out = tmp_path / "killed"
    mt = subprocess.Popen([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--quiet",
                           "--window", "60", "--out", str(out), "--", str(compile_c("steady"))],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    pid = None
    try:
        assert mt.stdout is not None
        ready = mt.stdout.readline()            # the target's own "ready <pid>", passed through
        assert ready.startswith("ready "), ready
        pid = int(ready.split()[1])
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if any(r.type == RecordType.BATCH for r in read_records(out)):
                break
            time.sleep(0.2)
    finally:
        mt.kill()
        mt.wait()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    r = run_memtrace("export", out, check=False)
    assert r.returncode == 1
    assert r.stderr.startswith(f"memtrace: warning: {out / 'capture.mtc'}: no END record")
    rep = run_memtrace("report", tmp_path, check=False)
    assert rep.returncode == 1 and "no END record" in rep.stderr
    assert "every capture in the folder was read in full" not in (tmp_path / "REPORT.md").read_text()


def test_one_real_batch_saying_live_minus_one_costs_that_batch_only(compile_c, tmp_path: Path) -> None:
    """Issue 27: one BATCH with ``live: -1`` and a valid checksum made 89 % of a real 5-minute
    --events capture unreadable.  Here a real --events capture of churn (every 16 KiB malloc and
    free a record with its stack) has one of its middle BATCH records rewritten so, checksum valid:
    the reader skips that record alone, names it in one warning, and reads everything after it to
    the END -- exactly what the capture says with that one record taken out."""
    from memtrace.capture import encode_record, header_bytes

    out = tmp_path / "c"
    run_memtrace("malloc", "--device", "local", "--events", "--window", "60", "--out", out, "--",
                 compile_c("churn"), "1.5", "", "20", timeout=180)
    records = list(read_records(out / "capture.mtc"))
    batches = [i for i, r in enumerate(records) if r.type == RecordType.BATCH]
    assert len(batches) >= 3, len(batches)
    bad = batches[len(batches) // 2]

    def write(path: Path, recs: list[tuple[Any, Any, bytes]]) -> Path:
        path.parent.mkdir(parents=True)
        path.write_bytes(header_bytes() + b"".join(encode_record(t, b, d) for t, b, d in recs))
        return path

    as_read = [(r.type, r.body, bytes(r.data)) for r in records]
    corrupt = list(as_read)
    corrupt[bad] = (RecordType.BATCH, {**records[bad].body, "live": -1}, bytes(records[bad].data))
    damaged = write(tmp_path / "damaged" / "capture.mtc", corrupt)
    without = write(tmp_path / "without" / "capture.mtc", as_read[:bad] + as_read[bad + 1:])
    shown = run_memtrace("show", "--json", damaged, check=False)
    assert shown.returncode == 1
    assert shown.stderr.count("\n") == 1 and "BATCH record.live: expected a non-negative integer, got -1; skipped " \
                                              "(the rest was read)" in shown.stderr, shown.stderr
    assert json.loads(shown.stdout)["ended"] == json.loads(run_memtrace("show", "--json", out).stdout)["ended"]

    def events(capture: Path) -> list[str]:
        """Every malloc and free the capture holds as an event, one export line each."""
        lines = run_memtrace("export", capture, check=False).stdout.splitlines()
        return [ln for ln in lines if ln.startswith(('{"record":"alloc"', '{"record":"free"'))]

    read, ref, whole = events(damaged), events(without), events(out / "capture.mtc")
    assert read == ref
    # The record taken out held some of churn's calls, and only some (before: 89 % lost).
    assert len(whole) * 0.5 < len(read) < len(whole), (len(read), len(whole))
