"""The core's CModule, built once per source: the second run's gcc is the cache's copy.

Frida's external toolchain runs ``gcc ... module.c -o module.so`` inside the target on every run
(it loads no prebuilt module on Linux).  The host puts a stand-in for gcc first on the target's
PATH for that compile (frida_host.gcc_cache_shim, runtime/process.js withCompilerEnv): it keeps each
module by a hash of gcc's arguments and the source and hands a copy back next time (issue 21,
item 6: the compile was 0.1-0.25 s of every start).  Proved on the real CLI with a cache folder of
the test's own: the first run leaves one module there, the second takes it unchanged (the same
file: a miss would have replaced it), both count exactly, and the program's PATH is its own again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from memtrace.capture import RecordType, read_records

from ..conftest import run_memtrace  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


def _run(exe: Path, cache: Path, out: Path, path_file: Path) -> tuple[dict, dict]:
    import json

    proc = run_memtrace("malloc", "--json", "--device", "local", "--out", out, "--", exe, path_file,
                        env={"MEMTRACE_CACHE_DIR": str(cache), "PATH": "/usr/local/bin:/usr/bin:/bin"})
    recon = next(r.body for r in read_records(out) if r.type == RecordType.RECON)
    return json.loads(proc.stdout), recon["info"]


def test_the_second_run_takes_the_module_the_first_built(compile_c, tmp_path: Path) -> None:
    exe = compile_c("path_writer")
    cache = tmp_path / "cache"
    first, info = _run(exe, cache, tmp_path / "one", tmp_path / "path1")
    assert info["toolchain"] == "external" and info["precompiled"] is True, info
    [folder] = list(cache.glob("cmodule-gcc-*"))
    assert (folder / "gcc").is_file() and folder.stat().st_mode & 0o777 == 0o700
    [module] = list(folder.glob("*.so"))
    kept = module.stat()
    second, info = _run(exe, cache, tmp_path / "two", tmp_path / "path2")
    assert info["toolchain"] == "external" and info["precompiled"] is True, info
    assert list(folder.glob("*.so")) == [module] and not list(folder.glob(".*"))
    now = module.stat()
    assert (now.st_ino, now.st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns), "the module was built again"
    for s in (first, second):
        rows = {r["frames"][0]["function"]: (r["bytes"], r["count"]) for r in s["live_by_stack"] if r["frames"]}
        assert rows.get("main") == (100_000, 1000), rows
    # The compile's PATH was the compile's only: by main the program's PATH is the one it was given.
    for f in (tmp_path / "path1", tmp_path / "path2"):
        assert f.read_text().strip() == "/usr/local/bin:/usr/bin:/bin"
        assert str(folder) not in f.read_text()
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
