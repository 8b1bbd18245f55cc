"""A peer profiler's test programs, our own equivalents (issue 20, item 9), and --follow-children
with the compiler a followed target has (item 5 with TinyCC).

tests/programs/peer_kinds.cpp reaches every allocation entry a C++ program has -- operator new,
new[], aligned and nothrow new, aligned_alloc, posix_memalign, memalign, valloc, pvalloc, calloc,
realloc growing and realloc to 0 -- each from a function of its own with its own size: every one
is seen with that exact size and its function on the stack.  (Exceptions, longjmp, exit/_exit/
_Exit, thread-local destructors, fork with threads, fork + exec and dlopen are
test_see_everything.py's peer tests.)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memtrace.analyze.malloc import summarize
from memtrace.capture import RecordType, read_records
from memtrace.capture_loop import CaptureOptions, run_capture
from memtrace.frida_host import FridaHost
from memtrace.target import TargetSpec
from memtrace.ui import SilentUI

from ..conftest import ROOT, build_ctor_user, run_memtrace  # noqa: TID252

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux"),
              pytest.mark.slow]

# peer_kinds.cpp: the function, then (calls, bytes) and the innermost frames of its stack.
NEW = "operator new(unsigned long)"
EXPECTED = {
    "use_new()": (3, 3 * 1000, [NEW, "use_new()", "main"]),
    # operator new[] ends in a jump to operator new: it has no frame of its own to show.
    "use_new_array()": (2, 2 * 3000, [NEW, "use_new_array()", "main"]),
    # Before, this stack ended at libstdc++'s frame (aligned_alloc is hooked by Interceptor.replace:
    # the walk began in Frida's trampoline): the caller was lost.
    "use_new_aligned()": (2, 2 * 2560, ["operator new(unsigned long, std::align_val_t)", "use_new_aligned()", "main"]),
    "use_new_nothrow()": (1, 1500, [NEW, "operator new[](unsigned long, std::nothrow_t const&)", "use_new_nothrow()",
                                    "main"]),
    "use_aligned_alloc()": (1, 1600, ["use_aligned_alloc()", "main"]),
    "use_posix_memalign()": (1, 1700, ["use_posix_memalign()", "main"]),
    "use_memalign()": (1, 1800, ["use_memalign()", "main"]),
    "use_valloc()": (1, 1900, ["use_valloc()", "main"]),
    "use_pvalloc()": (1, 1950, ["use_pvalloc()", "main"]),
    "use_calloc()": (1, 7 * 311, ["use_calloc()", "main"]),
    "use_realloc_zero()": (1, 2100, ["use_realloc_zero()", "main"]),
    "use_realloc_grow()": (3, 2200 + 2300 + 2400, ["use_realloc_grow()", "main"]),
}


@pytest.fixture(scope="module")
def peer_kinds(build_dir: Path) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    exe = build_dir / "peer_kinds"
    subprocess.run(["g++", "-O1", "-g", "-fno-omit-frame-pointer", "-o", str(exe),
                    str(ROOT / "tests/programs/peer_kinds.cpp")], check=True)
    return exe


def _rows_by_our_function(records: list) -> dict[str, tuple[int, int, list[str]]]:
    """(calls, bytes, frames) summed per stack by the first frame that is one of peer_kinds' use_*."""
    out: dict[str, tuple[int, int, list[str]]] = {}
    for r in summarize(records).stack_rows(None):
        names = [f.function or "" for f in r.frames]
        ours = [n for n in names if n.startswith("use_")]
        if not ours:
            continue
        calls, nbytes, _ = out.get(ours[0], (0, 0, []))
        out[ours[0]] = (calls + round(r.count), nbytes + r.exact_bytes, names[:names.index(ours[0]) + 2])
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("toolchain", ["auto", "internal"])
def test_every_allocation_entry_with_its_exact_size_and_stack(peer_kinds: Path, tmp_path: Path, toolchain: str) -> None:
    # "auto": gcc (the host's precompiled core) on Linux; "internal": TinyCC, the compiler an
    # iPhone has and the one --follow-children uses.
    out = tmp_path / "c"
    result = run_capture("malloc", TargetSpec(device="local", argv=[str(peer_kinds)]),
                         CaptureOptions(tracer="malloc", out=out, agent_config={"toolchain": toolchain}),
                         SilentUI(passthrough=False))
    assert result.ended == "target-exited"
    records = list(read_records(out))
    recon = next(r.body for r in records if r.type == RecordType.RECON)
    assert recon["info"]["toolchain"] == ("internal" if toolchain == "internal" else "external")
    rows = _rows_by_our_function(records)
    assert {k: (c, b) for k, (c, b, _) in rows.items()} == {k: (c, b) for k, (c, b, _) in EXPECTED.items()}
    for name, (_, _, top) in EXPECTED.items():
        assert rows[name][2] == top, (name, rows[name][2])
    s = summarize(records).to_json()
    assert (s["calls"]["pvalloc"], s["calls"]["valloc"], s["calls"]["posix_memalign"], s["calls"]["calloc"]) == (1, 1, 1, 1)
    assert s["calls"]["memalign"] == 1 and s["calls"]["aligned_alloc"] == 3     # 1 + the 2 aligned news
    # realloc(p, 0) freed its block and returned NULL: not a failed call.
    assert all(v == 0 for v in s["failed"].values()), s["failed"]
    # Everything of ours was freed: what is live at the end is libstdc++'s and stdio's own.
    live_fns = {f["function"] for r in s["live_by_stack"] for f in r["frames"]}
    assert s["live"]["count"] > 0 and not {n for n in live_fns if n and n.startswith("use_")}, s["live_by_stack"]


# -- --follow-children: TinyCC compiles in each followed process -----------------------------------

@pytest.fixture(scope="module")
def ctor_user(build_dir: Path) -> Path:
    return build_ctor_user(build_dir)


def _child_of(out: Path) -> tuple[dict, list]:
    end = next(r.body for r in read_records(out / "capture.mtc") if r.type == RecordType.END)
    (child,) = end["children"]
    assert child["ended"] == "target-exited" and (out / child["capture"]).exists(), child
    return child, list(read_records(out / child["capture"]))


def _constructor_row(records: list) -> list[str]:
    rows = [r for r in summarize(records).stack_rows(None) if r.exact_bytes == 12345 and round(r.count) == 1]
    assert len(rows) == 1
    return [f.function or "" for f in rows[0].frames]


@pytest.mark.timeout(300)
def test_a_followed_child_is_traced_from_before_its_constructors(compile_c, ctor_user: Path,
                                                                 tmp_path: Path) -> None:
    # spawner posix_spawns ctor_user, whose library's constructor allocates 12,345 B before main:
    # the child waits at the hold until its agent (the core the host built, loaded as it is: no
    # compiler started, which would be one more child to follow) has its hooks in.
    out = tmp_path / "c"
    run_memtrace("malloc", "--device", "local", "--quiet", "--follow-children", "--out", out, "--",
                 compile_c("spawner"), ctor_user)
    child, records = _child_of(out)
    assert child["origin"] == "spawn" and child["path"] == str(ctor_user)
    frames = _constructor_row(records)
    assert frames[0] == "ctor_lib_init" and "_dl_init" in frames
    infos = [r.body["info"] for r in read_records(out / "capture.mtc") if r.type == RecordType.RECON]
    infos += [r.body["info"] for r in records if r.type == RecordType.RECON]
    assert [(i["toolchain"], i["precompiledAs"]) for i in infos] == [("external", "module")] * 2, infos


@pytest.mark.timeout(300)
def test_follow_children_never_follows_its_own_compiler(compile_c, ctor_user: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Asked for the external toolchain, a followed process would start gcc, a child held and
    # followed in turn, whose agent starts gcc... (seen: hundreds of captures in a minute).
    # Without the host's module (here: none to give) TinyCC compiles instead, and the capture says why.
    monkeypatch.setattr(FridaHost, "_core_module", lambda self, sources, builtins: None)
    out = tmp_path / "c"
    result = run_capture("malloc", TargetSpec(device="local", argv=[str(compile_c("spawner")), str(ctor_user)]),
                         CaptureOptions(tracer="malloc", out=out, follow_children=True,
                                        agent_config={"toolchain": "external"}),
                         SilentUI(passthrough=False))
    assert result.ended == "target-exited"
    assert sorted(p.name for p in out.glob("*.mtc")) == sorted(["capture.mtc", _child_of(out)[0]["capture"]])
    child, records = _child_of(out)
    assert _constructor_row(records)[0] == "ctor_lib_init"
    for capture in (out / "capture.mtc", out / child["capture"]):
        info = next(r.body["info"] for r in read_records(capture) if r.type == RecordType.RECON)
        assert info["toolchain"] == "internal" and "follow-children" in info["toolchainError"], info
