"""The launch check's ELF reading (launchers._has_interp, struct instead of pyelftools): a dynamic
program has a loader, a static one none, and a script, a short file or a damaged header says
nothing (the launch goes on and Frida's own error speaks)."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest

from memtrace.launchers import _has_interp


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_dynamic_and_static_programs(tmp_path: Path) -> None:
    src = tmp_path / "p.c"
    src.write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-o", str(tmp_path / "dyn"), str(src)], check=True)
    subprocess.run(["gcc", "-static", "-o", str(tmp_path / "st"), str(src)], check=True)
    for name, want in (("dyn", True), ("st", False)):
        with open(tmp_path / name, "rb") as f:
            assert _has_interp(f) is want, name
    blob = (tmp_path / "dyn").read_bytes()
    assert _has_interp(io.BytesIO(blob[:40])) is None                 # cut inside the ELF header
    assert _has_interp(io.BytesIO(blob[:64])) is None                 # program headers missing
    assert _has_interp(io.BytesIO(b"#!/bin/sh\necho hi\n")) is None   # a script
    bad = bytearray(blob)
    bad[4] = 7                                                         # no such ELF class
    assert _has_interp(io.BytesIO(bytes(bad))) is None
