"""Stacks users can trust, on real ``-g`` programs: callers reached through glibc and libstdc++
(built without frame pointers) by the unwind tables, C++ callers demangled, file:line per frame,
rows keyed by the whole symbolized stack (an unrolled loop is one row, two paths through one
wrapper are two), and no frame reported twice.

The oracles are the programs' own sources (lines tagged ``@name``) and the frame-pointer walk
alone (``MEMTRACE_UNWIND=off``), which loses exactly the callers the tables bring back.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import RecordType, read_records
from memtrace.capture_loop import CaptureOptions, run_capture
from memtrace.frames import Frame
from memtrace.target import TargetSpec

from ..conftest import CFLAGS, PROGRAMS, ROOT, memtrace_json, run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

C_SRC = PROGRAMS / "libc_callers.c"
CXX_SRC = PROGRAMS / "cxx_callers.cpp"
STANDIN_SRC = PROGRAMS / "standin_paths.c"


def line_of(src: Path, tag: str) -> int:
    (n,) = [i for i, text in enumerate(src.read_text().splitlines(), 1) if f"@{tag}" in text]
    return n


def frames(row: dict[str, Any]) -> list[Frame]:
    return [Frame.from_json(f) for f in row["frames"]]


def functions(row: dict[str, Any]) -> list[str | None]:
    return [f["function"] for f in row["frames"]]


def rows_starting(rows: list[dict[str, Any]], *names: str) -> list[dict[str, Any]]:
    """Rows whose first frames are these functions."""
    return [r for r in rows if functions(r)[:len(names)] == list(names)]


def no_frame_twice(row: dict[str, Any]) -> bool:
    addrs = [(f["address"], f.get("inlined", False)) for f in row["frames"]]
    return all(a != b for a, b in zip(addrs, addrs[1:], strict=False))


def libc_debug_file() -> Path | None:
    """/usr/lib/debug's file for this machine's libc (libc6-dbg), when installed."""
    libc = next((p for p in (Path("/lib/x86_64-linux-gnu/libc.so.6"), Path("/lib/aarch64-linux-gnu/libc.so.6"))
                 if p.exists()), None)
    if libc is None:
        return None
    notes = subprocess.run(["readelf", "-n", str(libc)], capture_output=True, text=True).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", notes)
    if m is None:
        return None
    debug = Path("/usr/lib/debug/.build-id") / m.group(1)[:2] / f"{m.group(1)[2:]}.debug"
    return debug if debug.is_file() else None


# ---- C: strdup, a qsort callback, an unrolled loop --------------------------------------------


@pytest.fixture(scope="module")
def libc_callers(compile_c, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("libc_callers") / "cap"
    return memtrace_json("malloc", "--device", "local", "--window", "30", "--stack-threshold", "10000",
                         "--top", "20", "--out", out, "--", compile_c("libc_callers"))


@pytest.mark.slow
def test_strdup_caller_is_on_the_stack_with_its_file_and_line(libc_callers: dict[str, Any]) -> None:
    s = libc_callers
    assert s["ended"] == "target-exited"
    (row,) = [r for r in s["top_stacks"] if "copy_config_strings" in functions(r)]
    assert (row["count"], row["exact_bytes"]) == (10, 10 * 20000)
    strdup, caller, main = frames(row)[:3]
    assert (strdup.module, strdup.function) == ("libc.so.6", "__strdup")
    assert (caller.function, caller.module, caller.file and Path(caller.file).name, caller.line) == (
        "copy_config_strings", "libc_callers", "libc_callers.c", line_of(C_SRC, "strdup-call"))
    assert caller.label() == f"copy_config_strings (libc_callers) libc_callers.c:{line_of(C_SRC, 'strdup-call')}"
    assert main.function == "main"
    # Every frame object carries what --json promises.
    assert set(row["frames"][1]) >= {"function", "module", "offset", "file", "line", "address"}
    assert no_frame_twice(row)


def test_qsort_callback_reaches_the_function_that_sorted(libc_callers: dict[str, Any]) -> None:
    rows = rows_starting(libc_callers["top_stacks"], "by_value")
    assert sum(r["count"] for r in rows) >= 3        # glibc's merge sort calls back 3-5 times for 4 items
    for r in rows:
        names = functions(r)
        assert names[0] == "by_value" and frames(r)[0].line == line_of(C_SRC, "qsort-callback")
        assert "qsort_r" in names, names
        sort = names.index("sort_values")
        assert frames(r)[sort].line == line_of(C_SRC, "sort-call")
        assert names[sort + 1] == "main"
        assert no_frame_twice(r)


def test_unrolled_loop_on_one_line_is_one_row(libc_callers: dict[str, Any]) -> None:
    (row,) = rows_starting(libc_callers["top_stacks"], "unrolled_buffers")
    # Five call instructions (five return addresses, five stack ids), one source line: one row.
    assert (row["count"], row["exact_bytes"]) == (5, 5 * 30000)
    assert len(row["stack_ids"]) == 5
    assert frames(row)[0].line == line_of(C_SRC, "unrolled")


def test_libc_start_frames_are_named_from_the_debug_file(libc_callers: dict[str, Any]) -> None:
    if libc_debug_file() is None:
        pytest.skip("libc's debug file is not installed under /usr/lib/debug/.build-id (Debian: libc6-dbg): "
                    "__libc_start_call_main is a static function only it names")
    (row,) = rows_starting(libc_callers["top_stacks"], "unrolled_buffers")
    tail = frames(row)[2:]
    # Reached through glibc's tables: the frame-pointer walk stopped at the first of these.
    assert [(f.function, f.module) for f in tail] == [
        ("__libc_start_call_main", "libc.so.6"), ("__libc_start_main", "libc.so.6"), ("_start", "libc_callers")]
    assert Path(tail[0].file or "").name == "libc_start_call_main.h" and tail[0].line
    assert Path(tail[1].file or "").name == "libc-start.c" and tail[1].line


@pytest.mark.slow
def test_frame_pointers_alone_lose_the_strdup_caller(compile_c, tmp_path: Path) -> None:
    """The same program with the tables switched off: what the tables are for."""
    proc = run_memtrace("malloc", "--json", "--device", "local", "--window", "30", "--stack-threshold", "10000",
                        "--out", tmp_path / "cap", "--", compile_c("libc_callers"), env={"MEMTRACE_UNWIND": "off"})
    s = json.loads(proc.stdout)
    (row,) = rows_starting(s["top_stacks"], "__strdup")
    assert "copy_config_strings" not in functions(row)


@pytest.mark.slow
def test_a_program_built_without_frame_pointers_gets_whole_stacks(build_dir: Path, tmp_path: Path) -> None:
    """The compiler's default (-O2 omits frame pointers): the program's own table carries the walk."""
    exe = build_dir / "libc_callers_nofp"
    subprocess.run(["gcc", "-O2", "-g", "-fomit-frame-pointer", "-rdynamic", "-o", str(exe), str(C_SRC)], check=True)
    s = memtrace_json("malloc", "--device", "local", "--window", "30", "--stack-threshold", "10000",
                      "--out", tmp_path / "cap", "--", exe)
    recon = next(r for r in read_records(s["capture"]) if r.type == RecordType.RECON)
    assert "libc_callers_nofp" in recon.body["unwind"]["tables"]
    (row,) = rows_starting(s["top_stacks"], "__strdup")
    assert functions(row)[:3] == ["__strdup", "copy_config_strings", "main"]
    assert frames(row)[1].line == line_of(C_SRC, "strdup-call")
    (row,) = rows_starting(s["top_stacks"], "unrolled_buffers")
    assert (row["count"], functions(row)[1]) == (5, "main")
    callbacks = rows_starting(s["top_stacks"], "by_value")
    assert callbacks
    for r in callbacks:
        names = functions(r)
        assert names[names.index("sort_values") + 1] == "main"


def test_the_walk_compiled_by_tinycc_reaches_the_caller_too(compile_c, tmp_path: Path) -> None:
    """TinyCC is the compiler an iPhone's CModule has; on Linux it is the fallback."""
    result = run_capture("malloc", TargetSpec(device="local", argv=[str(compile_c("libc_callers"))]),
                         CaptureOptions(tracer="malloc", window=30, out=tmp_path / "cap",
                                        agent_config={"toolchain": "internal", "stackThreshold": 10000}))
    assert result.ended == "target-exited"
    recon = next(r for r in read_records(result.path) if r.type == RecordType.RECON)
    assert recon.body["info"]["toolchain"] == "internal"
    assert "libc.so.6" in recon.body["unwind"]["tables"]
    assert "libc_callers" in recon.body["unwind"]["frame_pointers"]
    s = summarize(read_records(result.path))
    (row,) = [r for r in s.stack_rows(None) if r.frames and r.frames[0].function == "__strdup"]
    assert [f.function for f in row.frames[:3]] == ["__strdup", "copy_config_strings", "main"]
    assert row.count == 10


# ---- C++: operator new, std::string -------------------------------------------------------------


@pytest.fixture(scope="module")
def cxx_callers(build_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    exe = build_dir / "cxx_callers"
    subprocess.run(["g++", *CFLAGS, "-o", str(exe), str(CXX_SRC)], check=True)
    out = tmp_path_factory.mktemp("cxx_callers") / "cap"
    return memtrace_json("malloc", "--device", "local", "--window", "30", "--stack-threshold", "10000",
                         "--out", out, "--", exe)


@pytest.mark.slow
def test_operator_new_caller_is_the_demangled_template_member(cxx_callers: dict[str, Any]) -> None:
    (row,) = [r for r in cxx_callers["top_stacks"] if "Pool<double>::fill(int, double)" in functions(r)]
    assert (row["count"], row["exact_bytes"]) == (4, 4 * 2000 * 8)
    new, fill, main = frames(row)[:3]
    assert new.function == "operator new(unsigned long)" and new.module.startswith("libstdc++")
    assert (fill.function, fill.file and Path(fill.file).name, fill.line) == (
        "Pool<double>::fill(int, double)", "cxx_callers.cpp", line_of(CXX_SRC, "new-call"))
    assert fill.short_function() == "Pool<double>::fill"
    assert main.function == "main"
    assert no_frame_twice(row)


def test_std_string_allocation_reaches_its_caller(cxx_callers: dict[str, Any]) -> None:
    (row,) = [r for r in cxx_callers["top_stacks"] if "build_label(int)" in functions(r)]
    assert row["count"] == 4
    names = functions(row)
    assert names[0] == "operator new(unsigned long)"
    label = frames(row)[names.index("build_label(int)")]
    assert label.line == line_of(CXX_SRC, "string-call")
    assert names[names.index("build_label(int)") + 1] == "main"


# ---- JavaScript-hooked tracers through the Darwin stand-in -------------------------------------


@pytest.fixture(scope="module")
def standin_paths(compile_c, demo_bin: Path) -> Path:
    return compile_c("standin_paths", "-I", str(ROOT / "demo" / "darwin"), f"-L{demo_bin}", "-lmtdarwin",
                     f"-Wl,-rpath,{demo_bin}")


def test_two_paths_through_one_purgeable_wrapper_stay_two_rows(standin_paths: Path, tmp_path: Path) -> None:
    s = memtrace_json("purgeable", "--device", "local", "--window", "30", "--out", tmp_path / "c", "--",
                      standin_paths)
    assert s["transitions"] == {"0->1": 5}
    rows = rows_starting(s["by_caller"], "cache_set_state")
    assert len(rows) == 2
    by_path = {functions(r)[1]: r for r in rows}
    assert {k: (r["count"], r["bytes"]) for k, r in by_path.items()} == {
        "image_cache_trim": (3, 3 * 16384), "font_cache_trim": (2, 2 * 16384)}
    for name, tag in (("image_cache_trim", "image-path"), ("font_cache_trim", "font-path")):
        wrapper, path = frames(by_path[name])[:2]
        assert wrapper.line == line_of(STANDIN_SRC, "wrapper")
        assert path.line == line_of(STANDIN_SRC, tag)
        assert functions(by_path[name])[2] == "main"


def test_unrolled_surface_creation_is_one_row(standin_paths: Path, tmp_path: Path) -> None:
    s = memtrace_json("iosurface", "--device", "local", "--window", "30", "--out", tmp_path / "c", "--",
                      standin_paths)
    assert s["surfaces"] == 5
    (row,) = s["by_stack"]
    assert row["count"] == 5
    assert functions(row)[:2] == ["make_surfaces", "main"]
    assert frames(row)[0].line == line_of(STANDIN_SRC, "unrolled-surfaces")
    assert no_frame_twice(row)


def test_scn_camera_callers_appear_once(demo_bin: Path, tmp_path: Path) -> None:
    """The hook's return address and the walk used to both report the caller (libunwind's
    backtrace from a call listener): each caller once, then main and glibc's start frames."""
    io = memtrace_json("iosurface", "--device", "local", "--window", "30", "--out", tmp_path / "io", "--",
                       demo_bin / "scn_camera")
    for row in io["by_stack"]:
        assert functions(row)[:2] == ["camera_pool_create_surface", "main"]
        assert no_frame_twice(row)
    pg = memtrace_json("purgeable", "--device", "local", "--window", "30", "--out", tmp_path / "pg", "--",
                       demo_bin / "scn_camera")
    rows = [r for r in pg["by_caller"] if r["entry"] == "IOSurfaceSetPurgeable"]
    assert {(functions(r)[0], r["count"]) for r in rows} == {("camera_pool_mark_purgeable", 6),
                                                              ("camera_pool_reclaim", 3)}
    for row in rows:
        assert functions(row)[1:3] == ["main", "__libc_start_call_main"]
        assert no_frame_twice(row)
