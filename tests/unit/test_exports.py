"""Exports read back by parsers independent of the exporters; their totals equal the summary's.

The captures are the real ones stored under raw-data/ (the demo workload traced on this machine,
the camera demo's IOSurface and purgeable lines).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from tests.conftest import ROOT, run_memtrace

WORKLOAD = ROOT / "raw-data" / "workload-malloc"
SURFACES = ROOT / "raw-data" / "camera_surfaces-iosurface"
PURGEABLE = ROOT / "raw-data" / "camera_surfaces-purgeable"
WORKLOAD_V1 = ROOT / "tests" / "data" / "captures-v1" / "workload-malloc"     # memtrace 0.1: no peak, no leak scan


def summary(capture: Path) -> dict:
    return json.loads(run_memtrace("show", capture, "--json", "--top", "1000").stdout)


def export(capture: Path, fmt: str, *extra: str, binary: bool = False, tmp: Path | None = None) -> bytes | str:
    if binary:
        assert tmp is not None
        out = tmp / f"out.{fmt}"
        run_memtrace("export", capture, "--format", fmt, "-o", out, *extra)
        return out.read_bytes()
    return run_memtrace("export", capture, "--format", fmt, *extra).stdout


def test_collapsed_lines_add_up_to_gross_and_live_bytes() -> None:
    s = summary(WORKLOAD)
    for view, want in (("gross", s["gross_bytes"]), ("live", s["live"]["estimated_bytes"])):
        total = 0
        lines = str(export(WORKLOAD, "collapsed", "--view", view)).splitlines()
        for ln in lines:
            stack, value = ln.rsplit(" ", 1)       # flamegraph.pl's reading: the last field is the value
            total += int(value)
        assert total == want, view
    # The leak function of the demo is a stack of its own, root first.
    gross = str(export(WORKLOAD, "collapsed"))
    assert any(ln.split(";")[-1].startswith("json_parse_document (workload)") for ln in gross.splitlines())


def test_collapsed_with_lines_names_each_frames_file_and_line() -> None:
    plain = str(export(WORKLOAD, "collapsed")).splitlines()
    with_lines = str(export(WORKLOAD, "collapsed", "--lines")).splitlines()
    assert sum(int(ln.rsplit(" ", 1)[1]) for ln in with_lines) == sum(int(ln.rsplit(" ", 1)[1]) for ln in plain)
    leaf = [ln.rsplit(" ", 1)[0].split(";")[-1] for ln in with_lines]
    assert any(x.startswith("json_parse_document (workload) workload.c:") for x in leaf)
    assert not any("workload.c:" in ln for ln in plain)
    bad = run_memtrace("export", WORKLOAD, "--format", "pprof", "--lines", check=False)
    assert bad.returncode == 2 and "--lines applies to --format collapsed" in bad.stderr


def check_speedscope_schema(doc: dict) -> None:
    """speedscope's file-format-schema.json, the parts a sampled profile uses."""
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = doc["shared"]["frames"]
    assert all(isinstance(f["name"], str) for f in frames)
    assert all(isinstance(f.get("line", 0), int) and isinstance(f.get("file", ""), str) for f in frames)
    assert doc["profiles"]
    for p in doc["profiles"]:
        assert p["type"] == "sampled"
        assert p["unit"] in ("none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes")
        assert isinstance(p["name"], str)
        assert len(p["samples"]) == len(p["weights"])
        assert all(0 <= i < len(frames) for stack in p["samples"] for i in stack)
        assert p["endValue"] - p["startValue"] == sum(p["weights"])


@pytest.mark.slow
def test_speedscope_has_one_profile_per_view_with_the_summarys_totals() -> None:
    s = summary(WORKLOAD)
    doc = json.loads(export(WORKLOAD, "speedscope"))
    check_speedscope_schema(doc)
    by_view = {p["name"].rsplit("— ", 1)[1]: sum(p["weights"]) for p in doc["profiles"]}
    assert by_view == {"gross bytes": s["gross_bytes"], "live bytes": s["live"]["estimated_bytes"],
                       "leaked bytes": s["leaks"]["leaked"]["bytes"], "peak bytes": s["peak"]["bytes"],
                       "temporary bytes": s["temporary"]["bytes"]}
    # A capture of memtrace 0.1 has the first two views only.
    doc = json.loads(export(WORKLOAD_V1, "speedscope"))
    check_speedscope_schema(doc)
    assert {p["name"].rsplit("— ", 1)[1] for p in doc["profiles"]} == {"gross bytes", "live bytes"}


def pprof_classes() -> dict:
    """profile.proto's messages, declared here independently of memtrace.exports.pprof."""
    T = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="test_profile.proto", package="pp", syntax="proto3")
    spec = {
        "Profile": [("sample_type", 1, "ValueType"), ("sample", 2, "Sample"), ("mapping", 3, "Mapping"),
                    ("location", 4, "Location"), ("function", 5, "Function"), ("string_table", 6, T.TYPE_STRING),
                    ("period_type", 11, "ValueType"), ("period", 12, T.TYPE_INT64),
                    ("default_sample_type", 14, T.TYPE_INT64)],
        "Mapping": [("id", 1, T.TYPE_UINT64), ("memory_start", 2, T.TYPE_UINT64), ("memory_limit", 3, T.TYPE_UINT64),
                    ("filename", 5, T.TYPE_INT64)],
        "ValueType": [("type", 1, T.TYPE_INT64), ("unit", 2, T.TYPE_INT64)],
        "Sample": [("location_id", 1, T.TYPE_UINT64), ("value", 2, T.TYPE_INT64)],
        "Location": [("id", 1, T.TYPE_UINT64), ("mapping_id", 2, T.TYPE_UINT64), ("address", 3, T.TYPE_UINT64),
                     ("line", 4, "Line")],
        "Line": [("function_id", 1, T.TYPE_UINT64), ("line", 2, T.TYPE_INT64)],
        "Function": [("id", 1, T.TYPE_UINT64), ("name", 2, T.TYPE_INT64), ("filename", 4, T.TYPE_INT64)],
    }
    repeated = {"sample_type", "sample", "mapping", "location", "function", "string_table", "location_id", "value",
                "line"}
    for name, fields in spec.items():
        m = fd.message_type.add(name=name)
        for fname, num, typ in fields:
            f = m.field.add(name=fname, number=num,
                            label=T.LABEL_REPEATED if fname in repeated else T.LABEL_OPTIONAL)
            if isinstance(typ, str):
                f.type, f.type_name = T.TYPE_MESSAGE, f".pp.{typ}"
            else:
                f.type = typ
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"pp.{n}")) for n in spec}


@pytest.mark.parametrize("view,default", [("gross", "alloc_space"), ("live", "inuse_space")])
def test_pprof_is_a_go_heap_profile_and_adds_up(tmp_path: Path, view: str, default: str) -> None:
    s = summary(WORKLOAD)
    raw = gzip.decompress(export(WORKLOAD, "pprof", "--view", view, binary=True, tmp=tmp_path))
    prof = pprof_classes()["Profile"]()
    prof.ParseFromString(raw)
    st = list(prof.string_table)
    assert st[0] == ""
    # Go's heap profile: the four sample types in its order, the view picking the default.
    assert [(st[t.type], st[t.unit]) for t in prof.sample_type] == [
        ("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")]
    assert st[prof.default_sample_type] == default
    assert (st[prof.period_type.type], st[prof.period_type.unit]) == ("space", "bytes") and prof.period >= 1
    assert sum(x.value[1] for x in prof.sample) == s["gross_bytes"]
    assert sum(x.value[3] for x in prof.sample) == s["live"]["estimated_bytes"]
    assert sum(x.value[2] for x in prof.sample) == s["live"]["count"]
    # Mappings: the target's modules, each location in the one holding its address.
    mappings = {m.id: m for m in prof.mapping}
    assert any(st[m.filename].endswith("/workload") for m in mappings.values())
    locations = {loc.id: loc for loc in prof.location}
    mapped = [loc for loc in locations.values() if loc.mapping_id]
    assert mapped and all(mappings[loc.mapping_id].memory_start <= loc.address < mappings[loc.mapping_id].memory_limit
                          for loc in mapped)
    functions = {f.id: st[f.name] for f in prof.function}
    leaves = {functions[locations[x.location_id[0]].line[0].function_id] for x in prof.sample if x.value[3]}
    assert "image_decode_frame (workload)" in leaves


def test_go_tool_pprof_reads_every_sample_type(tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess

    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed (.ci/run installs golang-go)")
    s = summary(WORKLOAD)
    export(WORKLOAD, "pprof", "--view", "live", binary=True, tmp=tmp_path)
    env = {**os.environ, "HOME": str(tmp_path), "GOCACHE": str(tmp_path / "gocache"), "GOTOOLCHAIN": "local"}

    def top(index: str) -> str:
        return subprocess.run([go, "tool", "pprof", "-symbolize=none", "-raw", f"-sample_index={index}",
                               str(tmp_path / "out.pprof")], capture_output=True, text=True, env=env, timeout=300,
                              check=True).stdout

    raw = top("inuse_space")
    # -raw lists the sample types in the profile's order, then every sample's values and stack.
    assert "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes" in raw
    assert "image_decode_frame (workload)" in raw
    samples = raw.split("Samples:", 1)[1].split("Locations", 1)[0].splitlines()
    values = [[int(v) for v in ln.split(":")[0].split()] for ln in samples if ":" in ln]
    assert values and all(len(v) == 4 for v in values)
    assert sum(v[1] for v in values) == s["gross_bytes"] and sum(v[3] for v in values) == s["live"]["estimated_bytes"]


@pytest.mark.parametrize("view,types", [("peak", ("peak_space", "peak_objects")),
                                        ("temporary", ("temporary_space", "temporary_objects"))])
def test_pprof_other_views_weigh_their_own_bytes(tmp_path: Path, view: str, types: tuple[str, str]) -> None:
    s = summary(WORKLOAD)
    prof = pprof_classes()["Profile"]()
    prof.ParseFromString(gzip.decompress(export(WORKLOAD, "pprof", "--view", view, binary=True, tmp=tmp_path)))
    st = list(prof.string_table)
    assert [(st[t.type], st[t.unit]) for t in prof.sample_type] == [(types[0], "bytes"), (types[1], "count")]
    assert sum(x.value[0] for x in prof.sample) == s[view]["bytes"]


@pytest.mark.slow
def test_chrome_trace_has_counter_tracks_and_one_instant_per_event() -> None:
    doc = json.loads(export(WORKLOAD, "chrome-trace"))
    ev = doc["traceEvents"]
    assert all({"ph", "pid"} <= e.keys() and (e["ph"] == "M" or isinstance(e["ts"], int | float)) for e in ev)
    counters = {e["name"] for e in ev if e["ph"] == "C"}
    assert {"footprint", "allocator in-use", "tracked live blocks", "gross bytes allocated"} <= counters
    # The in-target timeline joins the same tracks: one name per quantity.
    stacks = {c for c in counters if c.startswith("live: ")}
    assert counters - stacks == {"footprint", "allocator in-use", "tracked live blocks", "gross bytes allocated",
                                 "tracked live bytes", "peak tracked bytes"}
    # A counter per top stack: the image decoder's frames held the most, and its track says so.
    assert "live: image_decode_frame (workload)" in stacks and len(stacks) <= 16
    decode = [e["args"]["value"] for e in ev if e["name"] == "live: image_decode_frame (workload)"]
    assert max(decode) == max(r["bytes"] for r in summary(WORKLOAD)["peak"]["by_stack"]
                              if r["frames"][0]["function"] == "image_decode_frame")
    surfaces = json.loads(export(SURFACES, "chrome-trace"))["traceEvents"]
    assert sum(1 for e in surfaces if e["ph"] == "i" and e["name"] == "surface") == summary(SURFACES)["surfaces"]
    purg = json.loads(export(PURGEABLE, "chrome-trace"))["traceEvents"]
    transitions = [e for e in purg if e["ph"] == "i" and e["name"] == "set"]
    assert transitions and all("new_state" in e["args"] for e in transitions)


def test_views_a_capture_lacks_are_refused_in_one_line() -> None:
    proc = run_memtrace("export", WORKLOAD_V1, "--format", "collapsed", "--view", "peak", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"memtrace: error: {WORKLOAD_V1 / 'capture.mtc'}: the peak view is not in this capture "
        "(recorded by a memtrace that did not keep it yet)"]
    proc = run_memtrace("export", WORKLOAD_V1, "--format", "collapsed", "--view", "leaked", check=False)
    assert "no leak scan in this capture" in proc.stderr


def test_show_prints_the_capture_summary_as_the_capture_did() -> None:
    out = run_memtrace("show", WORKLOAD).stdout
    assert "memtrace malloc · workload" in out and "top stacks by bytes" in out
    doc = summary(WORKLOAD)
    assert doc["tracer"] == "malloc" and doc["target"] == "workload" and doc["gross_bytes"] > 0
    for cap in (SURFACES, PURGEABLE):
        assert json.loads(run_memtrace("show", cap, "--json").stdout)["tracer"] in ("iosurface", "purgeable")


def test_show_refuses_what_is_not_a_capture(tmp_path: Path) -> None:
    bad = tmp_path / "x.mtc"
    bad.write_bytes(b"not a capture at all")
    proc = run_memtrace("show", bad, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"memtrace: error: {bad}: not a memtrace capture (bad magic)"


def test_jsonl_goes_to_the_file_named_by_o(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "records.jsonl"
    proc = run_memtrace("export", WORKLOAD, "--format", "jsonl", "-o", out)
    assert proc.stdout == ""
    lines = out.read_text().splitlines()
    assert lines == run_memtrace("export", WORKLOAD).stdout.splitlines()
    assert json.loads(lines[0])["record"] == "meta" and json.loads(lines[-1])["record"] == "end"
    assert [p.name for p in out.parent.iterdir()] == ["records.jsonl"]      # no temporary left behind
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    proc = run_memtrace("export", WORKLOAD, "-o", blocked / "x.jsonl", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"memtrace: error: -o {blocked / 'x.jsonl'}: cannot write: {blocked} is a file, not a folder"
