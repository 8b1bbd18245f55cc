"""The hold before constructors is used only where it was verified (x86-64): elsewhere it refuses
with one line the capture keeps, and the program is spawned as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtrace import hold


@pytest.mark.parametrize("machine", ["aarch64", "arm64"])
def test_an_unverified_architecture_is_refused_in_one_line(machine: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hold.ENV_TRY_UNVERIFIED, raising=False)
    lib, why = hold.library(tmp_path, machine=machine)
    assert lib is None and why is not None and "\n" not in why
    assert "ARCH-UNVERIFIED" in why and hold.ENV_TRY_UNVERIFIED in why
    assert not list(tmp_path.iterdir())           # nothing built


def test_an_unknown_architecture_has_no_hold(tmp_path: Path) -> None:
    assert hold.library(tmp_path, machine="riscv64") == (None, "no hold library for riscv64")
