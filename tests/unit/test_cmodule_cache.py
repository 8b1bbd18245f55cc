"""The CModule's assembly, compiled on the host once per source and compiler (agentbuild)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from memtrace.agentbuild import asm_as_c, precompiled_cmodule, precompiled_module

SOURCE = "int mt_answer (void) { return 42; }\n"


def _counting_headers() -> tuple[list[int], Callable[[], dict[str, str]]]:
    """Frida's CModule headers as a stand-in, and a list that grows each time they are asked for."""
    asked: list[int] = []

    def headers() -> dict[str, str]:
        asked.append(1)
        return {"glib.h": "typedef int gint;\n"}

    return asked, headers


def test_assembly_becomes_one_top_level_asm_statement() -> None:
    text = asm_as_c('\t.string "a\\\\b"\n\t.text\n')
    assert text == '__asm__ (\n  "\t.string \\"a\\\\\\\\b\\"\\n"\n  "\t.text\\n"\n);\n'


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_compiled_once_then_read_from_the_cache(tmp_path: Path) -> None:
    asked, headers = _counting_headers()
    first = precompiled_cmodule(SOURCE, {"HAVE_I386": True}, "17.0.0", headers, cache_dir=tmp_path)
    assert first is not None and first.startswith("__asm__ (") and "mt_answer" in first
    assert asked == [1] and len(list(tmp_path.glob("cmodule-*.c"))) == 1
    # A hit never asks for the headers, nor compiles: the same text.
    again = precompiled_cmodule(SOURCE, {"HAVE_I386": True}, "17.0.0", headers, cache_dir=tmp_path)
    assert again == first and asked == [1]
    # Another Frida version (other headers, other flags) is another entry.
    other = precompiled_cmodule(SOURCE, {"HAVE_I386": True}, "17.0.1", headers, cache_dir=tmp_path)
    assert other == first and asked == [1, 1] and len(list(tmp_path.glob("cmodule-*.c"))) == 2
    # The wrapper assembles: gcc takes it as the C file it is.
    c = tmp_path / "w.c"
    c.write_text(first)
    assert subprocess.run(["gcc", "-c", "-fPIC", "-o", str(tmp_path / "w.o"), str(c)]).returncode == 0


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_a_source_that_does_not_compile_gives_none(tmp_path: Path) -> None:
    assert precompiled_cmodule("this is not C", {}, "17.0.0", dict, cache_dir=tmp_path) is None
    assert not list(tmp_path.glob("cmodule-*.c"))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_the_module_is_built_once_a_shared_object_exporting_the_source(tmp_path: Path) -> None:
    asked, headers = _counting_headers()
    first = precompiled_module(SOURCE, {"HAVE_I386": True}, "17.0.0", headers, cache_dir=tmp_path)
    assert first is not None and first.parent == tmp_path and first.name.endswith(".so") and asked == [1]
    assert first.read_bytes()[:4] == b"\x7fELF"
    if shutil.which("nm") is not None:           # (binutils': there with gcc)
        nm = subprocess.run(["nm", "-D", "--defined-only", str(first)], capture_output=True, text=True)
        assert "mt_answer" in nm.stdout, nm.stdout + nm.stderr
    kept = first.stat()
    # A hit neither asks for the headers nor compiles: the same file, untouched.
    again = precompiled_module(SOURCE, {"HAVE_I386": True}, "17.0.0", headers, cache_dir=tmp_path)
    assert again == first and asked == [1] and (again.stat().st_ino, again.stat().st_mtime_ns) == (
        kept.st_ino, kept.st_mtime_ns)
    # Another Frida version is another entry; the assembly's entry of the same key sits beside it.
    other = precompiled_module(SOURCE, {"HAVE_I386": True}, "17.0.1", headers, cache_dir=tmp_path)
    assert other is not None and other != first and asked == [1, 1]
    asm = precompiled_cmodule(SOURCE, {"HAVE_I386": True}, "17.0.0", headers, cache_dir=tmp_path)
    assert asm is not None and (tmp_path / first.name.replace(".so", ".c")).is_file()
    assert precompiled_module("this is not C", {}, "17.0.0", dict, cache_dir=tmp_path) is None
    assert sorted(p.name for p in tmp_path.glob("cmodule-*.so")) == sorted([first.name, other.name])


def test_the_compiler_version_is_asked_once_per_gcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in gcc on PATH that counts its runs: its version is kept by the driver file's
    # identity, so a second key costs no run, and another gcc (here: the file rewritten) is asked.
    from memtrace.agentbuild import _compiler_version, cmodule_cache_key

    bin_dir, cache = tmp_path / "bin", tmp_path / "cache"
    bin_dir.mkdir()
    runs = tmp_path / "runs"
    gcc = bin_dir / "gcc"
    gcc.write_text(f"#!/bin/sh\necho x >> {runs}\necho 'fake gcc 1.0'\n")
    gcc.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert _compiler_version(cache) == "fake gcc 1.0"
    key = cmodule_cache_key(SOURCE, {}, "17.0.0", cache)
    assert _compiler_version(cache) == "fake gcc 1.0"
    assert runs.read_text() == "x\n"
    gcc.write_text(f"#!/bin/sh\necho x >> {runs}\necho 'fake gcc 2.0 (another build)'\n")
    assert _compiler_version(cache) == "fake gcc 2.0 (another build)"
    assert runs.read_text() == "x\nx\n"
    assert cmodule_cache_key(SOURCE, {}, "17.0.0", cache) not in (None, key)
