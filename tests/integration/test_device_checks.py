"""The device checks ``memtrace doctor`` runs on an iPhone (memtrace.ios), on the Linux stand-in: each
passes against a program that has the Darwin entries and fails, saying what is missing, against one
that has not."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import frida
import pytest

from memtrace import ios

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")
DARWIN = Path(__file__).resolve().parents[2] / "demo" / "darwin"


@contextmanager
def spawned(program: Path) -> Iterator[int]:
    device = frida.get_local_device()
    pid = device.spawn([str(program)], stdio="pipe")
    try:
        yield pid
    finally:
        with suppress(frida.ProcessNotFoundError):
            device.kill(pid)


def test_ca_hooks(demo_bin: Path, compile_c) -> None:
    device = frida.get_local_device()
    with spawned(demo_bin / "scn_ca_backing") as pid:
        check = ios.check_ca_hooks(device, pid)
    assert check.ok, check.detail
    assert "_ZN2CA6Render5Shmem9new_shmemEjm (libmtdarwin.so)" in check.detail
    with spawned(compile_c("steady")) as pid:
        check = ios.check_ca_hooks(device, pid)
    assert not check.ok and "no CA::Render::Shmem symbol found" in check.detail


def test_pressure_source(demo_bin: Path, compile_c) -> None:
    device = frida.get_local_device()
    prog = compile_c("standin_limit", "-I", str(DARWIN), "-L", str(demo_bin), "-lmtmalloc", "-lmtdarwin",
                     f"-Wl,-rpath,{demo_bin}")
    with spawned(prog) as pid:
        check = ios.check_pressure_source(device, pid)
    assert check.ok and check.detail.startswith("dispatch_source(warn|critical")
    with spawned(compile_c("steady")) as pid:
        check = ios.check_pressure_source(device, pid)
    assert not check.ok


def test_iosurface_hooks(demo_bin: Path, compile_c) -> None:
    device = frida.get_local_device()
    with spawned(demo_bin / "scn_camera") as pid:
        check = ios.check_iosurface_hooks(device, pid)
    assert check.ok and check.detail == "all found"
    with spawned(compile_c("steady")) as pid:
        check = ios.check_iosurface_hooks(device, pid)
    assert not check.ok
    assert check.detail == ("missing: IOSurfaceCreate, IOSurfaceClientCreateChild, IOSurfaceClientLookup, "
                            "IOSurfaceClientRetain, IOSurfaceClientRelease, IOSurfaceClientGetID, "
                            "IOSurfaceClientGetWidth, IOSurfaceClientGetHeight, IOSurfaceClientGetBytesPerRow, "
                            "IOSurfaceClientGetPixelFormat")


def test_runtime_facts(demo_bin: Path, compile_c) -> None:
    """On the stand-in: task_info answers memtrace's exact count (93 words asked, the stand-in's 89
    filled: an older revision, as an older kernel says); an ELF image has no LC_UUID and Linux no
    OSMemoryBarrier, and the check says both, one line."""
    device = frida.get_local_device()
    with spawned(demo_bin / "scn_camera") as pid:
        check = ios.check_runtime_facts(device, pid)
    assert not check.ok
    assert check.detail == ("scn_camera: no LC_UUID in memory (not a Mach-O image?); OSMemoryBarrier: missing "
                            "(the C core's barriers on arm64 need it under TinyCC); "
                            "task_info(TASK_VM_INFO, 93): 89 words filled (an older revision)")


def test_an_unreachable_target_is_a_failed_check_not_a_crash() -> None:
    check = ios.check_iosurface_hooks(frida.get_local_device(), 999_999_999)
    assert not check.ok and "cannot attach to pid 999999999" in check.detail
