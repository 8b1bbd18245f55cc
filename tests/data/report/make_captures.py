"""Synthetic captures with known ground truth for the report tests and the golden files.

    .venv/bin/python tests/data/report/make_captures.py     # rewrites tests/data/report/captures/

Deterministic: no timestamps, fixed addresses.  The numbers each target must show are in
``TRUTH`` and checked cell by cell by tests/unit/test_report.py.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "src"))

from memtrace.report.synthetic import CALLOC, SyntheticCapture  # noqa: E402

MiB = 1 << 20

TRUTH = {
    "alpha": {
        "gross": 10 * 16384 + 2 * MiB + 100 * 64 + 3 * 8192, "calls": 115,
        "in_use_delta": 2 * MiB + 2 * 8192 + 6400, "live_bytes": 2 * MiB + 2 * 8192, "live_count": 4,
        "families": {"image decode": 2 * MiB, "JSON parsing": 163840, "other: simd_buffer_alloc": 24576,
                     "(no stack: below the stack threshold)": 6400},
        "tiers": [(100, 6400), (0, 0), (0, 0), (3, 24576), (10, 163840), (2, 2 * MiB)],
    },
    "beta": {
        "gross": 1005 * 65536, "calls": 1005, "in_use_delta": 5 * 65536, "live_bytes": 5 * 65536, "live_count": 5,
        "churn": 201.0, "families": {"gzip/compression": 1000 * 65536, "network buffers": 5 * 65536},
    },
    "camera": {
        "surfaces": 4, "surface_bytes": 3 * 933888 + 8306688, "held_surfaces": 3,
        "transitions": {"0->1": 3, "1->0": 1, "0->2": 2, "2->0": 1},
        "transition_bytes": {"0->1": 6 * MiB, "1->0": 2 * MiB, "0->2": 2 * 65536, "2->0": 2 * MiB},
        "held": 6 * MiB + 2 * 65536 - 2 * MiB - 2 * MiB, "created": 3, "created_bytes": 6 * MiB,
        "madvise": {"7": 4}, "set_calls": 7, "get_calls": 2,
    },
}


def alpha(path: Path, window: float = 20.0, captured_s: float = 20.0) -> None:
    c = SyntheticCapture(path, "alpha", module="alpha", window=window)
    json_sid = c.stack("json_parse_document", "handle_request", "main")
    img = c.stack("image_decode_frame", "decode_loop", "main")
    simd = c.stack("simd_buffer_alloc", "main")
    c.calibration("before", 1_000_000, 40 * MiB)
    for _ in range(10):
        c.free(c.alloc(json_sid, 16384), 16384)
    for _ in range(2):
        c.alloc(img, MiB)
    for _ in range(100):
        c.alloc(None, 64)
    ptrs = [c.alloc(simd, 8192) for _ in range(3)]
    c.free(ptrs[0], 8192)
    c.calibration("after", 1_000_000 + TRUTH["alpha"]["in_use_delta"], 43 * MiB)
    c.end(captured_s=captured_s)


def beta(path: Path, label: str = "beta") -> None:
    c = SyntheticCapture(path, label, module=label)
    gz = c.stack("gzip_inflate_chunk", "worker")
    net = c.stack("net_receive_buffer", "worker")
    c.calibration("before", 500_000, 30 * MiB)
    for i in range(1000):
        c.free(c.alloc(gz, 65536), 65536)
        if i % 250 == 0:
            c.flush()           # several batches, as a live capture has
    for _ in range(5):
        c.alloc(net, 65536, CALLOC)
    c.calibration("after", 500_000 + 5 * 65536, 30 * MiB + 5 * 65536)
    c.end(captured_s=12.5)


def gamma(path: Path) -> None:
    c = SyntheticCapture(path, "gamma", module="gamma")
    c.calibration("before", 200_000, 10 * MiB)
    c.end(ended="launch-storm", reason="the target died 1.2 s after instrumentation at 150000 calls/s",
          captured_s=1.2)


def camera_iosurface(path: Path) -> None:
    c = SyntheticCapture(path, "camera", tracer="iosurface", module="camera")
    cfg = c.frames("camera_session_configure", "main")
    pool = c.frames("camera_pool_create_surface", "camera_capture_frame", "main")
    evs = [{"type": "surface", "id": i + 1, "surface": hex(0x1000 + i), "alloc_size": 933888, "width": 1280,
            "height": 720, "bytes_per_row": 1280, "format": "420v", "frames": cfg} for i in range(3)]
    evs.append({"type": "surface", "id": 4, "surface": hex(0x1003), "alloc_size": 8306688, "width": 1920,
                "height": 1080, "bytes_per_row": 7680, "format": "BGRA", "frames": pool})
    evs.append({"type": "release", "surface": hex(0x1000)})
    c.events(evs)
    c.end(captured_s=5.0)


def camera_purgeable(path: Path) -> None:
    c = SyntheticCapture(path, "camera", tracer="purgeable", module="camera")
    mk = c.frames("frame_cache_make_purgeable", "main")
    re_ = c.frames("frame_cache_reacquire", "main")
    nw = c.frames("nw_segment_empty", "net_loop")
    create = c.frames("frame_cache_create", "main")
    evs = [{"type": "create", "entry": "vm_allocate", "kr": 0, "bytes": 2 * MiB, "frames": create}] * 3
    evs += [{"type": "set", "entry": "vm_purgable_control", "old_state": 0, "new_state": 1, "bytes": 2 * MiB,
             "frames": mk}] * 3
    evs += [{"type": "set", "entry": "vm_purgable_control", "old_state": 2, "new_state": 0, "bytes": 2 * MiB,
             "frames": re_},
            {"type": "set", "entry": "vm_purgable_control", "old_state": 1, "new_state": 0, "bytes": 2 * MiB,
             "frames": re_}]
    evs += [{"type": "set", "entry": "mach_vm_purgable_control", "old_state": 0, "new_state": 2, "bytes": 65536,
             "frames": nw}] * 2
    evs += [{"type": "madvise", "entry": "madvise", "advice": 7, "len": 65536, "platform": "darwin",
             "frames": nw}] * 4
    evs.append({"type": "counts", "controls": {"vm_purgable_control": {"set": 5, "get": 2},
                                               "mach_vm_purgable_control": {"set": 2, "get": 0}}})
    c.events(evs)
    c.end(captured_s=5.0)


def build(folder: Path) -> None:
    """Every ground-truth capture, each in its own run folder like `memtrace ... --out` makes."""
    for name, fn in (("alpha-malloc", alpha), ("beta-malloc", beta), ("gamma-malloc", gamma),
                     ("camera-iosurface", camera_iosurface), ("camera-purgeable", camera_purgeable)):
        (folder / name).mkdir(parents=True)
        fn(folder / name / "capture.mtc")


def truncate(src: Path, dst: Path, keep: int) -> None:
    """A capture whose target (or disk) died mid-record: the last ``keep`` bytes missing."""
    data = src.read_bytes()
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data[:len(data) - keep])


def build_golden(folder: Path) -> None:
    """The golden set: the ground truth, a second capture of alpha (shown beside the first, never
    added to it) and one truncated capture (reported, noted, exit 1)."""
    build(folder)
    (folder / "alpha-malloc-rerun").mkdir(parents=True)
    alpha(folder / "alpha-malloc-rerun" / "capture.mtc", window=60.0, captured_s=45.0)
    tmp = folder / "_delta_full.mtc.tmp"
    beta(tmp, "delta")
    truncate(tmp, folder / "delta-truncated" / "capture.mtc", 40)
    tmp.unlink()


if __name__ == "__main__":
    out = HERE / "captures"
    shutil.rmtree(out, ignore_errors=True)
    build_golden(out)
    print(f"wrote {out}")
