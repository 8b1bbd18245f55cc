"""System frames of an iOS capture named from the device's shared-cache symbols (symbols/device.py).

The DeviceSupport tree is built here: a dylib (clang + ld64.lld; lld links a dylib at __TEXT 0,
where a split shared-cache image has its unslid cache address), put where the device has it (``Symbols/usr/lib/libmt.dylib``); pymobiledevice3's
own ``DeviceSupportSymbols`` reads it.  The module "on the device" reaches the host as name, load
address and the UUID the agent read from its header -- no file of it on this machine.  The fetch
runs against fakes bound to pymobiledevice3's real signatures.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pymobiledevice3.cli.developer.fetch_symbols import fetch_symbols_download_task
from pymobiledevice3.services.dvt.instruments.device_support_symbols import find_device_support_symbols

from memtrace import launchers
from memtrace.errors import TargetError
from memtrace.symbols import Symbolizer, device

from .test_pmd3 import Device
from .test_symbols import NO_SYSTEM_DIRS
from .test_symbols_macho import LIB_SRC, TOOLS, device_modules, return_address, run, text_vmaddr, uuid_of

LOADED = 0x1A2B40000              # where "the device" mapped it (slid)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    missing = [n for n in ("clang", "ld64.lld", "llvm-objdump", "llvm-dwarfdump") if TOOLS[n] is None]
    if missing:
        pytest.skip(f"Mach-O fixtures need {', '.join(missing)} (Debian: clang, lld, llvm; .ci/run installs them)")
    out = tmp_path_factory.mktemp("devsym")
    obj = out / "lib.o"
    run(TOOLS["clang"], "-target", "arm64-apple-ios15.0", "-O1", "-c", LIB_SRC, "-o", obj)
    root = out / "Symbols"
    lib = root / "usr" / "lib" / "libmt.dylib"
    lib.parent.mkdir(parents=True)
    run(TOOLS["ld64.lld"], "-arch", "arm64", "-platform_version", "ios", "15.0", "15.0", "-dylib",
        "-install_name", "/usr/lib/libmt.dylib", "-o", lib, obj)
    return root, lib


def test_system_frames_named_by_uuid_from_the_device_tree(tree: tuple[Path, Path], tmp_path: Path) -> None:
    root, lib = tree
    ra = LOADED + return_address(lib, "mt_caller", "mt_leaf") - text_vmaddr(lib)
    symbols = device.DeviceSymbols(root, index_dir=tmp_path / "index")
    assert len(symbols) == 1
    modules = device_modules("libmt.dylib", "/usr/lib/libmt.dylib", LOADED)
    named = Symbolizer(modules, [], arch="arm64", ids={"libmt.dylib": (uuid_of(lib),)},
                       system_dirs=NO_SYSTEM_DIRS, device_symbols=symbols)
    assert named.row(ra) == [hex(ra), "libmt.dylib", ra - LOADED, "mt_caller", None, None]
    # Another UUID (another OS build's library): not named from this tree.
    other = Symbolizer(modules, [], arch="arm64", ids={"libmt.dylib": ("0BADC0DE-0000-4000-8000-000000000000",)},
                       system_dirs=NO_SYSTEM_DIRS, device_symbols=symbols)
    assert other.row(ra)[3] is None
    assert symbols.named == 1


def test_fetch_goes_through_pmd3_once_and_returns_the_symbols_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = Device("17.4", mounted=True)
    monkeypatch.setattr(launchers, "pmd3_api", dev.api)
    where = tmp_path / "iPhone15,2 17.4 (21E219)" / "Symbols"
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    async def fake_download(*args: Any, **kwargs: Any) -> None:
        inspect.signature(fetch_symbols_download_task).bind(*args, **kwargs)
        calls.append(("download", args, kwargs))
        where.mkdir(parents=True, exist_ok=True)

    def fake_find(*args: Any, **kwargs: Any) -> Path | None:
        inspect.signature(find_device_support_symbols).bind(*args, **kwargs)
        calls.append(("find", args, kwargs))
        return where if where.is_dir() else None

    monkeypatch.setattr(device, "pmd3_symbols_api", lambda: SimpleNamespace(
        fetch_symbols_download_task=fake_download, find_device_support_symbols=fake_find))
    assert device.fetch("UDID") == where
    assert [c[0] for c in calls] == ["download", "find"]
    assert calls[0][1][0].kind == "rsd"                 # iOS 17: through the tunnel
    assert sorted(dev.closed) == ["lockdown", "rsd"]
    dev.assert_real_signatures()

    async def hanging(*args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(device, "pmd3_symbols_api", lambda: SimpleNamespace(
        fetch_symbols_download_task=hanging, find_device_support_symbols=fake_find))
    with pytest.raises(TargetError, match="fetching the shared-cache symbols did not answer within 0.2 s"):
        device.fetch("UDID", timeout=0.2)


def test_memtrace_symbolize_with_device_symbols_names_a_frame_the_agent_never_named(
        tree: tuple[Path, Path], tmp_path: Path) -> None:
    """A capture made with the window's symbolization left to the host: the system frame has no
    row name; ``memtrace symbolize --device-symbols`` names it from the module's UUID."""
    from memtrace.capture import CaptureWriter, RecordType, StackRecord, encode_agent_records, read_records

    from ..conftest import run_memtrace  # noqa: TID252

    root, lib = tree
    ra = LOADED + return_address(lib, "mt_caller", "mt_leaf") - text_vmaddr(lib)
    cap = tmp_path / "ios" / "capture.mtc"
    cap.parent.mkdir()
    with CaptureWriter(cap) as w:
        w.write(RecordType.META, {"tracer": "malloc", "target": {"label": "Demo"}})
        w.write(RecordType.RECON, {"symbols": [], "device": {"type": "usb", "arch": "arm64", "platform": "darwin"}})
        w.write(RecordType.MODULES, {"modules": [{"name": "libmt.dylib", "path": "/usr/lib/libmt.dylib",
                                                  "base": hex(LOADED), "size": 0x10000, "uuid": uuid_of(lib)}]})
        w.write(RecordType.BATCH, {"t": 1}, encode_agent_records(3, [StackRecord(3, 0, (ra,))]))
        w.write(RecordType.END, {"ended": "completed"})
    run_memtrace("symbolize", cap.parent, "--device-symbols", root, "--json")
    rows = [r for rec in read_records(cap) if rec.type == RecordType.SYMBOLS for r in rec.body["rows"]]
    assert rows == [[hex(ra), "libmt.dylib", ra - LOADED, "mt_caller", None, None]]


def test_doctor_says_whether_the_devices_symbols_are_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from memtrace import ios

    dev = Device("16.7", mounted=True)
    monkeypatch.setattr(launchers, "pmd3_api", dev.api)
    where = tmp_path / "iPhone14,5 16.7 (20H19)" / "Symbols"

    def fake_find(*args: Any, **kwargs: Any) -> Path | None:
        inspect.signature(find_device_support_symbols).bind(*args, **kwargs)
        return where if where.is_dir() else None

    monkeypatch.setattr(device, "pmd3_symbols_api", lambda: SimpleNamespace(
        fetch_symbols_download_task=None, find_device_support_symbols=fake_find))
    check = ios.check_device_symbols("UDID")
    assert not check.ok and check.detail == ("not on this machine: memtrace symbolize CAPTURE --fetch-device-symbols "
                                             "UDID fetches them once for this OS build")
    where.mkdir(parents=True)
    assert ios.check_device_symbols("UDID") == ios.DeviceCheck("shared-cache symbols", True, str(where))
    assert dev.closed == ["lockdown", "lockdown"]
    dev.assert_real_signatures()


def test_at_the_end_of_a_capture_the_host_names_what_it_can_and_the_agent_only_the_rest(
        tree: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote iOS capture whose device's symbols are on this machine already (found by model,
    version and build, as Xcode keeps them): nothing is symbolized before the window closes; then
    the host names the system frame by its module's UUID and the agent is asked only for the app's."""
    import shutil as sh

    from memtrace.stacks_seen import StacksSeen

    root, lib = tree
    monkeypatch.setenv("HOME", str(tmp_path))
    info = {"os": {"id": "ios", "version": "16.5", "build": "20F66"}, "hardware": {"product": "iPhone13,2"}}
    assert device.local_tree(info) is None
    here = tmp_path / "Library/Developer/Xcode/iOS DeviceSupport/iPhone13,2 16.5 (20F66)/Symbols"
    sh.copytree(root, here)
    assert device.local_tree(info) == here
    assert device.local_tree({**info, "os": {"id": "linux", "version": "6.1", "build": "x"}}) is None

    stacks = StacksSeen(want_families=False)
    stacks.device_tree = device.local_tree(info)
    app_base = 0x104A30000
    stacks.modules([{"name": "libmt.dylib", "path": "/usr/lib/libmt.dylib", "base": hex(LOADED), "size": 0x10000,
                     "uuid": uuid_of(lib)},
                    {"name": "Demo", "path": "/var/containers/Bundle/Application/X/Demo.app/Demo",
                     "base": hex(app_base), "size": 0x10000}])
    ra_sys = LOADED + return_address(lib, "mt_caller", "mt_leaf") - text_vmaddr(lib)
    ra_app = app_base + 0x1234
    stacks.pending = [ra_sys, ra_app]
    asked: list[list[int]] = []

    def agent(chunk: list[int]) -> list[list[Any]]:
        asked.append(list(chunk))
        return [[hex(a), "Demo", a - app_base, "app_function", None, None] for a in chunk]

    assert stacks.symbolize(agent, final=False) == [] and asked == []      # the window is open
    out = stacks.symbolize(agent, final=True)
    assert [by for _, by in out] == ["host: device symbols", "agent"]
    assert out[0][0] == [[hex(ra_sys), "libmt.dylib", ra_sys - LOADED, "mt_caller", None, None]]
    assert asked == [[ra_app]] and stacks.pending == []
