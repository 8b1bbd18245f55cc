"""`memtrace report raw-data/`: numbers in REPORT.md/report.json = the analyzers' own = demo/README.md.

The same holds for the version-1 captures memtrace 0.1 wrote of the same programs (tests/data/captures-v1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memtrace.analyze.iosurface import summarize as ios_summarize
from memtrace.analyze.malloc import summarize
from memtrace.capture import read_records
from memtrace.report import build_report
from memtrace.units import fmt_bytes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["raw-data", "tests/data/captures-v1"])
def raw(request: pytest.FixtureRequest) -> Path:
    return ROOT / request.param


@pytest.fixture(scope="module")
def doc(raw: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("rawreport")
    result = build_report(raw, out=out)
    assert result.exit_code == 0, result.skipped
    return json.loads((out / "report.json").read_text()), (out / "REPORT.md").read_text()


def target(d: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in d["targets"] if t["target"] == name)


@pytest.mark.parametrize("name", ["json_service", "image_decoder", "gpu_serializer", "workload", "camera_surfaces"])
def test_malloc_numbers_equal_the_analyzer(raw: Path, doc: tuple[dict[str, Any], str], name: str) -> None:
    d, md = doc
    s = summarize(read_records(raw / f"{name}-malloc")).to_json()
    m = target(d, name)["malloc"]
    assert m["gross_bytes"] == s["gross_bytes"]
    assert m["alloc_calls"] == s["alloc_calls"]
    assert m["live_bytes"] == s["live"]["bytes"] and m["live_count"] == s["live"]["count"]
    assert m["in_use_delta"] == s["coverage"]["allocator"]["in_use_delta"]
    line = next(x for x in md.splitlines() if x.startswith(f"| {name} |") and "calls" in x)
    assert f"{fmt_bytes(s['gross_bytes'])} / " in line and f"{s['alloc_calls']:,} calls" in line


def fam(d: dict[str, Any], name: str) -> dict[str, dict[str, int]]:
    return {f["family"]: f for f in target(d, name)["malloc"]["families"]}


def test_documented_fingerprints(doc: tuple[dict[str, Any], str]) -> None:
    d, md = doc
    # demo/README.md: deflate_response malloc 65536 x600; http_read_request calloc 16384 x600;
    # response_cache_store 8192 x12 live at end.
    js = fam(d, "json_service")
    assert (js["gzip/compression"]["bytes"], js["gzip/compression"]["count"]) == (600 * 65536, 600)
    assert (js["network buffers"]["bytes"], js["network buffers"]["count"]) == (600 * 16384, 600)
    assert (js["caches"]["live_bytes"], js["caches"]["live_count"]) == (12 * 8192, 12)
    # image_decoder: 40 x 4 MiB frames + jpeg 5760 x640 (unstacked) + png 8192/32768/131072 x40.
    im = fam(d, "image_decoder")
    assert im["image decode"]["bytes"] == 40 * 4194304 + 40 * (8192 + 32768 + 131072)
    assert (im["caches"]["live_bytes"], im["caches"]["live_count"]) == (10 * 262144, 10)
    # gpu_serializer: mtl_command_buffer_encode 65536 x300 + mtl_buffer_create 262144 x8.
    gpu = fam(d, "gpu_serializer")
    assert gpu["Metal/GPU"]["bytes"] == 300 * 65536 + 8 * 262144
    assert gpu["Metal/GPU"]["live_bytes"] == 8 * 262144
    # workload: image_decode_frame 1/2/4/8 MiB x6 each.
    assert fam(d, "workload")["image decode"]["bytes"] == 6 * (1 + 2 + 4 + 8) * (1 << 20)
    assert "json_service: gzip/compression" in md


def test_iosurface_numbers(raw: Path, doc: tuple[dict[str, Any], str]) -> None:
    d, md = doc
    s = ios_summarize(read_records(raw / "camera_surfaces-iosurface")).to_json()
    t = target(d, "camera_surfaces")["iosurface"]
    # demo/README.md: 6 x 933888 + 2 x 8306688 = 22216704 B in 8 surfaces.
    assert t["bytes"] == s["bytes"] == 22216704 and t["surfaces"] == s["surfaces"] == 8
    assert "21.2 MB (8 surfaces)" in md
    assert [f["family"] for f in t["families"]] == ["media/camera"]
