"""The core's CModule, built once per source, and no compiler run from the target.

Frida's external toolchain would run ``gcc ... module.c -o module.so`` inside the target on every
run.  The host builds that module itself, once per source, compiler and Frida version
(agentbuild.precompiled_module), and the agent loads its bytes (``new CModule(bytes, symbols)``):
the target forks no compiler at all.  When the module cannot be used (here: not the bytes the host
said), the agent takes the assembly the host compiled, which gcc assembles in the target -- through
the host's stand-in for gcc first on the target's PATH for that compile (frida_host.gcc_cache_shim,
runtime/process.js withCompilerEnv), which keeps each module by a hash of gcc's arguments and the
source and hands a copy back next time (issue 21, item 6: the compile was 0.1-0.25 s of every start).
Proved on the real CLI with a cache folder of the test's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memtrace.capture import RecordType, read_records

from ..children import kill_and_reap  # noqa: TID252
from ..conftest import run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


def _run(exe: Path, cache: Path, out: Path, path_file: Path) -> tuple[dict, dict]:
    proc = run_memtrace("malloc", "--json", "--device", "local", "--out", out, "--", exe, path_file,
                        env={"MEMTRACE_CACHE_DIR": str(cache), "PATH": "/usr/local/bin:/usr/bin:/bin"})
    recon = next(r.body for r in read_records(out) if r.type == RecordType.RECON)
    return json.loads(proc.stdout), recon["info"]


def test_the_second_run_takes_the_module_the_first_built(compile_c, tmp_path: Path) -> None:
    exe = compile_c("path_writer")
    cache = tmp_path / "cache"
    first, info = _run(exe, cache, tmp_path / "one", tmp_path / "path1")
    assert info["toolchain"] == "external" and info["precompiledAs"] == "module", info
    [module] = list(cache.glob("cmodule-*.so"))
    kept = module.stat()
    second, info = _run(exe, cache, tmp_path / "two", tmp_path / "path2")
    assert info["toolchain"] == "external" and info["precompiledAs"] == "module", info
    assert list(cache.glob("cmodule-*.so")) == [module]
    now = module.stat()
    assert (now.st_ino, now.st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns), "the module was built again"
    # No compiler ran from the target: the gcc stand-in (on its PATH for a compile) kept nothing.
    for folder in cache.glob("cmodule-gcc-*"):
        assert not list(folder.glob("*.so")), "a compile ran in the target"
    for s in (first, second):
        rows = {r["frames"][0]["function"]: (r["bytes"], r["count"]) for r in s["live_by_stack"] if r["frames"]}
        assert rows.get("main") == (100_000, 1000), rows
    # The program's PATH is the one it was given.
    for f in (tmp_path / "path1", tmp_path / "path2"):
        assert f.read_text().strip() == "/usr/local/bin:/usr/bin:/bin"


def test_a_module_that_is_not_the_hosts_falls_back_to_the_assembly(
        compile_c, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The module's file is not the bytes the host built (as a process in another mount namespace
    may see at that path): the agent refuses it and takes the assembly, which gcc assembles in the
    target through the stand-in -- the first run builds the stand-in's module, the second takes it
    unchanged -- and the program's PATH is its own again by main.  Both count exactly."""
    from memtrace.capture_loop import CaptureOptions, run_capture
    from memtrace.frida_host import FridaHost
    from memtrace.target import TargetSpec

    real = FridaHost._core_module

    def not_the_hosts(self: FridaHost, sources: list[str], builtins: dict) -> dict | None:
        ref = real(self, sources, builtins)
        return None if ref is None else {**ref, "sha256": "0" * 64}

    monkeypatch.setattr(FridaHost, "_core_module", not_the_hosts)
    cache = tmp_path / "cache"
    monkeypatch.setenv("MEMTRACE_CACHE_DIR", str(cache))
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")        # the target's, as the CLI's
    exe = compile_c("path_writer")
    kept = None
    for run in ("one", "two"):
        out = tmp_path / run
        target = TargetSpec(device="local", argv=[str(exe), str(tmp_path / f"path-{run}")])
        result = run_capture("malloc", target, CaptureOptions("malloc", out=out))
        assert result.ended == "target-exited", result.reason
        info = next(r.body for r in read_records(out) if r.type == RecordType.RECON)["info"]
        assert info["precompiledAs"] == "assembly", info
        assert "not the module the host built" in info["precompiledError"], info
        [folder] = list(cache.glob("cmodule-gcc-*"))
        [module] = list(folder.glob("*.so"))        # the stand-in kept the compile's module
        if kept is None:
            kept = module.stat()
        else:
            now = module.stat()
            assert (now.st_ino, now.st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns), "built again"
        assert (tmp_path / f"path-{run}").read_text().strip() == "/usr/local/bin:/usr/bin:/bin"
        shown = json.loads(run_memtrace("show", "--json", out).stdout)
        rows = {r["frames"][0]["function"]: (r["bytes"], r["count"]) for r in shown["live_by_stack"] if r["frames"]}
        assert rows.get("main") == (100_000, 1000), rows
    assert os.access(folder / "gcc", os.X_OK)


def test_the_sources_come_by_file_and_inline_when_a_file_is_wrong(compile_c, tmp_path: Path) -> None:
    # A program at the hold point reads the init's C sources and precompiled core from the cache
    # folder's texts/ (frida_host._texts_by_file: ~700 KB the rpc no longer carries); one that is
    # not what it should be (here: cut short) makes the agent ask for them inline.  Both count exactly.
    exe = compile_c("path_writer")
    cache = tmp_path / "cache"
    first, info = _run(exe, cache, tmp_path / "one", tmp_path / "path1")
    assert info["texts"] == "by file" and info["precompiled"] is True, info
    texts = sorted((cache / "texts").glob("*.txt"))
    assert len(texts) == 3, texts       # the core's sources, the process sources, the assembly
    for t in texts:
        t.write_bytes(t.read_bytes()[:-1])
    second, info = _run(exe, cache, tmp_path / "two", tmp_path / "path2")
    assert info["texts"] == "inline (a file unreadable in the target)" and info["precompiled"] is True, info
    for s in (first, second):
        rows = {r["frames"][0]["function"]: (r["bytes"], r["count"]) for r in s["live_by_stack"] if r["frames"]}
        assert rows.get("main") == (100_000, 1000), rows


def test_a_running_program_reads_the_sources_by_file_too(compile_c, tmp_path: Path) -> None:
    # Attached by --pid, a local program sees the host's files as well: the init's ~700 KB of texts
    # come from the cache folder, not through the rpc (issue 21: fixed cost; 82 -> 34 ms of init).
    proc = subprocess.Popen([str(compile_c("sleeping_threads")), "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        out = tmp_path / "c"
        run_memtrace("malloc", "--device", "local", "--quiet", "--pid", str(proc.pid), "--window", "1", "--out", out,
                     env={"MEMTRACE_CACHE_DIR": str(tmp_path / "cache")})
        info = next(r.body for r in read_records(out) if r.type == RecordType.RECON)["info"]
        assert info["texts"] == "by file" and info["precompiledAs"] == "module", info
    finally:
        kill_and_reap(proc)


def test_a_core_built_by_tinycc_is_said(compile_c, tmp_path: Path) -> None:
    # gcc and cc that fail, first on PATH (the host's build of the core and the target's compile
    # alike): the agent builds the core with Frida's TinyCC -- still exact, slower on every call --
    # and the capture says so, in a warning on the terminal and in the capture, not left to timing.
    exe = compile_c("path_writer")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("gcc", "cc"):
        (broken / name).write_text("#!/bin/sh\necho 'broken for the test' >&2\nexit 1\n")
        (broken / name).chmod(0o755)
    out = tmp_path / "out"
    proc = run_memtrace("malloc", "--json", "--device", "local", "--out", out, "--", exe, tmp_path / "path",
                        env={"MEMTRACE_CACHE_DIR": str(tmp_path / "cache"), "CC": "/usr/bin/gcc",
                             "PATH": f"{broken}:/usr/local/bin:/usr/bin:/bin"})
    info = next(r.body for r in read_records(out) if r.type == RecordType.RECON)["info"]
    assert info["toolchain"] == "internal" and info["toolchainError"], info
    said = [r.body["message"] for r in read_records(out) if r.type == RecordType.WARNING]
    assert any("built by Frida's TinyCC, not gcc" in m for m in said), said
    assert "built by Frida's TinyCC, not gcc" in proc.stderr
    summary = json.loads(proc.stdout)
    rows = {r["frames"][0]["function"]: (r["bytes"], r["count"]) for r in summary["live_by_stack"] if r["frames"]}
    assert rows.get("main") == (100_000, 1000), rows
