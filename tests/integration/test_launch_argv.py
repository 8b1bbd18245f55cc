"""A program memtrace launches gets its argument vector exactly as a shell would give it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from tests.conftest import run_memtrace

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


def test_a_program_found_on_path_keeps_the_argv0_it_was_called_by(compile_c, tmp_path: Path) -> None:
    """`memtrace malloc -- NAME`: NAME is looked up on PATH, and the program's argv[0] is NAME, not
    the path found (Frida's default).  A program that reads argv[0] -- a multi-call binary, jq
    working out its origin -- must run traced as it runs untraced."""
    exe = compile_c("argv_echo")
    env = {"PATH": f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    by_name = run_memtrace("malloc", "--device", "local", "--quiet", "--out", tmp_path / "a", "--",
                           "argv_echo", "one two", "", env=env)
    assert by_name.stdout.splitlines() == ["argv[0]=argv_echo", "argv[1]=one two", "argv[2]="]
    # A path is passed as written, relative or not.
    relative = os.path.relpath(exe)
    by_path = run_memtrace("malloc", "--device", "local", "--quiet", "--out", tmp_path / "b", "--", relative)
    assert by_path.stdout.splitlines() == [f"argv[0]={relative}"]
