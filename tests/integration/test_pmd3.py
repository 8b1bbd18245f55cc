"""``--launch pmd3`` with fakes at the pymobiledevice3 boundary, every call held to pymobiledevice3's
real signatures (imported here: a change in the installed version fails these tests).

iOS 16 and earlier: lockdown over usbmux, the developer disk image mounted, DVT process control.
iOS 17+: the same through the RemoteXPC tunnel a running tunneld serves.  The app starts suspended
and is resumed through process control; every client is closed.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pymobiledevice3.exceptions import (
    AlreadyMountedError,
    DeveloperDiskImageNotFoundError,
    DvtException,
    NotPairedError,
    PasswordRequiredError,
    TunneldConnectionError,
)
from pymobiledevice3.lockdown import LockdownClient, create_using_usbmux
from pymobiledevice3.remote.remote_service_discovery import RemoteServiceDiscoveryService
from pymobiledevice3.services.dvt.instruments.dvt_provider import DvtProvider
from pymobiledevice3.services.dvt.instruments.process_control import ProcessControl
from pymobiledevice3.services.mobile_image_mounter import auto_mount
from pymobiledevice3.tunneld.api import get_tunneld_device_by_udid

from memtrace import ios, launchers
from memtrace.capture import RecordType, read_records
from memtrace.capture_loop import CaptureOptions, run_capture
from memtrace.errors import TargetError
from memtrace.target import TargetSpec
from memtrace.ui import SilentUI

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

# What each fake stands for: its calls must bind to these.
REAL = {
    "create_using_usbmux": create_using_usbmux, "get_tunneld_device_by_udid": get_tunneld_device_by_udid,
    "auto_mount": auto_mount, "DvtProvider": DvtProvider.__init__, "ProcessControl": ProcessControl.__init__,
    "launch": ProcessControl.launch, "resume": ProcessControl.resume,
    "lockdown.close": LockdownClient.close, "rsd.close": RemoteServiceDiscoveryService.close,
}


class Device:
    """The device the fakes stand for, and every call memtrace made into pymobiledevice3."""

    def __init__(self, version: str, *, tunneld: str = "up", mounted: bool = False, locked: bool = False,
                 image: bool = True, pid: int = 4242, paired: bool = True, mount_error: Exception | None = None,
                 launch: str = "ok") -> None:
        self.version, self.tunneld, self.mounted, self.locked, self.image, self.pid = (
            version, tunneld, mounted, locked, image, pid)
        self.paired, self.mount_error, self.launch = paired, mount_error, launch
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.closed: list[str] = []

    def call(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))

    def api(self) -> SimpleNamespace:
        dev = self

        class Client:
            def __init__(self, kind: str) -> None:
                self.kind = kind
                self.product_version = dev.version
                self.paired = dev.paired

            async def close(self) -> None:
                dev.call(f"{self.kind}.close", self)
                dev.closed.append(self.kind)

        async def fake_usbmux(*args: Any, **kwargs: Any) -> Client:
            dev.call("create_using_usbmux", *args, **kwargs)
            return Client("lockdown")

        async def fake_tunneld(*args: Any, **kwargs: Any) -> Client | None:
            dev.call("get_tunneld_device_by_udid", *args, **kwargs)
            if dev.tunneld == "down":
                raise TunneldConnectionError()
            if dev.tunneld == "undialable":
                # What pymobiledevice3 11.x does when no tunnel of the listed device connects.
                rsds: list[Client] = []
                return rsds[0]
            return None if dev.tunneld == "no-tunnel" else Client("rsd")

        async def fake_mount(*args: Any, **kwargs: Any) -> None:
            dev.call("auto_mount", *args, **kwargs)
            if dev.mount_error is not None:
                raise dev.mount_error
            if not dev.image:
                raise DeveloperDiskImageNotFoundError()
            if dev.mounted:
                raise AlreadyMountedError()
            dev.mounted = True

        class FakeDvt:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                dev.call("DvtProvider", self, *args, **kwargs)
                self.provider = args[0]

            async def __aenter__(self) -> FakeDvt:
                if not dev.paired:
                    raise NotPairedError()
                if dev.locked:
                    raise PasswordRequiredError("Device is password protected. Please unlock and retry")
                assert dev.mounted, "DVT needs the developer disk image"
                return self

            async def __aexit__(self, *exc: object) -> None:
                dev.closed.append("dvt")

        class FakeProcessControl:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                dev.call("ProcessControl", self, *args, **kwargs)

            async def __aenter__(self) -> FakeProcessControl:
                return self

            async def __aexit__(self, *exc: object) -> None:
                return None

            async def launch(self, *args: Any, **kwargs: Any) -> int:
                dev.call("launch", self, *args, **kwargs)
                if dev.launch == "hangs":
                    await asyncio.sleep(3600)
                if dev.launch == "locked-launch":
                    raise DvtException("RequestDenied: the request was denied by service delegate (SBMainWorkspace) "
                                       "for reason: Locked")
                if dev.launch == "not-dev-signed":
                    raise DvtException("Failed to get task for pid: the app lacks the get-task-allow entitlement")
                if dev.launch == "zero":
                    result = 0
                    assert result          # ProcessControl.launch asserts the pid it got
                return dev.pid

            async def resume(self, *args: Any, **kwargs: Any) -> None:
                dev.call("resume", self, *args, **kwargs)

        return SimpleNamespace(
            create_using_usbmux=fake_usbmux, get_tunneld_device_by_udid=fake_tunneld, auto_mount=fake_mount,
            DvtProvider=FakeDvt, ProcessControl=FakeProcessControl, AlreadyMountedError=AlreadyMountedError,
            DeveloperDiskImageNotFoundError=DeveloperDiskImageNotFoundError,
            PasswordRequiredError=PasswordRequiredError, TunneldConnectionError=TunneldConnectionError,
            NotPairedError=NotPairedError, DvtException=DvtException)

    def assert_real_signatures(self) -> None:
        for name, args, kwargs in self.calls:
            if name.split(".")[0] in ("frida", "agent"):
                continue        # the order log's own entries (Frida and the agent), not pymobiledevice3
            inspect.signature(REAL[name]).bind(*args, **kwargs)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Device:
    dev = Device(**request.param)
    monkeypatch.setattr(launchers, "pmd3_api", dev.api)
    return dev


@pytest.mark.parametrize("device", [{"version": "16.7.2"}], indirect=True)
def test_ios16_lockdown_image_and_a_suspended_launch(device: Device) -> None:
    pid = asyncio.run(launchers.pmd3_launch("UDID", "com.example.app"))
    assert pid == 4242
    assert device.names() == ["create_using_usbmux", "auto_mount", "DvtProvider", "ProcessControl", "launch",
                              "lockdown.close"]
    _, args, kwargs = device.calls[4]
    assert args[1:] == ("com.example.app",) and kwargs == {"kill_existing": True, "start_suspended": True}
    # Never pairs implicitly (pymobiledevice3's default would block on the Trust dialog forever).
    assert device.calls[0][2] == {"serial": "UDID", "autopair": False, "pair_timeout": 15.0}
    assert device.calls[2][1][1].kind == "lockdown"          # DVT over lockdown
    assert device.closed == ["dvt", "lockdown"]
    device.assert_real_signatures()


@pytest.mark.smoke
@pytest.mark.parametrize("device", [{"version": "17.5.1", "mounted": True}], indirect=True)
def test_ios17_goes_through_the_tunnel_and_closes_both_clients(device: Device) -> None:
    assert asyncio.run(launchers.pmd3_launch("UDID", "com.example.app")) == 4242
    assert device.names() == ["create_using_usbmux", "get_tunneld_device_by_udid", "auto_mount", "DvtProvider",
                              "ProcessControl", "launch", "rsd.close", "lockdown.close"]
    assert device.calls[1][1] == ("UDID",)
    assert device.calls[3][1][1].kind == "rsd"               # DVT over the tunnel's RSD
    device.assert_real_signatures()


@pytest.mark.parametrize("device", [{"version": "17.0", "tunneld": "down"}], indirect=True)
def test_ios17_without_tunneld_says_how_to_start_it(device: Device) -> None:
    with pytest.raises(TargetError, match=r"no tunneld answers: start one \(sudo python3 -m pymobiledevice3 "
                                          r"remote tunneld\)"):
        asyncio.run(launchers.pmd3_launch("UDID", "com.example.app"))
    assert device.closed == ["lockdown"]
    device.assert_real_signatures()


@pytest.mark.parametrize("device", [{"version": "18.1", "tunneld": "no-tunnel"}], indirect=True)
def test_ios17_tunneld_without_a_tunnel_to_the_device(device: Device) -> None:
    with pytest.raises(TargetError, match="tunneld is running but has no tunnel to UDID"):
        asyncio.run(launchers.pmd3_launch("UDID", "com.example.app"))
    assert device.closed == ["lockdown"]


@pytest.mark.parametrize("device", [{"version": "16.2", "locked": True}], indirect=True)
def test_a_locked_device_is_said_so(device: Device) -> None:
    with pytest.raises(TargetError, match="the device is locked"):
        asyncio.run(launchers.pmd3_launch("UDID", "com.example.app"))
    assert "launch" not in device.names() and device.closed == ["lockdown"]


@pytest.mark.parametrize("device", [{"version": "15.4", "image": False}], indirect=True)
def test_no_developer_disk_image(device: Device) -> None:
    with pytest.raises(TargetError, match="no developer disk image for iOS 15.4"):
        asyncio.run(launchers.pmd3_launch("UDID", "com.example.app"))
    assert device.closed == ["lockdown"]


@pytest.mark.parametrize("device", [{"version": "17.2", "tunneld": "down"}], indirect=True)
def test_frida_spawn_precheck_only_stops_for_a_locked_device(device: Device) -> None:
    asyncio.run(launchers._check_unlocked_usb("UDID"))           # no tunnel: not this check's business
    device.tunneld, device.mounted, device.locked = "up", True, True
    with pytest.raises(TargetError, match="the device is locked"):
        asyncio.run(launchers._check_unlocked_usb("UDID"))
    device.assert_real_signatures()


@pytest.mark.parametrize("delay", [0.0, 0.3])
@pytest.mark.parametrize("device", [{"version": "16.7"}], indirect=True)
def test_capture_launched_by_pmd3_is_resumed_in_the_order_a_device_needs(
        device: Device, delay: float, compile_c, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake DVT launch really starts the program suspended (a Frida spawn stands for
    posix_spawn's START_SUSPENDED) and its resume really resumes it.  At --attach-delay 0 a device's
    Frida holds the attached task at dyld's breakpoint until Frida's own resume: the order must be
    launch, attach, agent started, Frida resume -- and no DVT resume.  With a delay, DVT resumes it
    before the attach and Frida resumes nothing."""
    import frida

    from memtrace.frida_host import FridaHost

    local = frida.get_local_device()
    frida_resume = frida.core.Device.resume
    steady = str(compile_c("steady"))
    dev_api = device.api

    def api_spawning() -> SimpleNamespace:
        api = dev_api()
        fake_pc = api.ProcessControl

        class SpawningProcessControl(fake_pc):  # type: ignore[misc, valid-type]
            async def launch(self, *args: Any, **kwargs: Any) -> int:
                await super().launch(*args, **kwargs)
                device.pid = local.spawn([steady])
                return device.pid

            async def resume(self, *args: Any, **kwargs: Any) -> None:
                await super().resume(*args, **kwargs)
                frida_resume(local, args[0])

        api.ProcessControl = SpawningProcessControl
        return api

    monkeypatch.setattr(launchers, "pmd3_api", api_spawning)

    def frida_resume_logged(self: Any, pid: int, *args: Any) -> None:
        device.calls.append(("frida.resume", (pid,), {}))
        frida_resume(self, pid, *args)

    host_attach, host_rpc = FridaHost.attach, FridaHost.rpc

    def attach_logged(self: FridaHost) -> None:
        device.calls.append(("frida.attach", (self.pid,), {}))
        host_attach(self)

    def rpc_logged(self: FridaHost, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "start":
            device.calls.append(("agent.start", (), {}))
        return host_rpc(self, what, method, *args, **kwargs)

    monkeypatch.setattr(frida.core.Device, "resume", frida_resume_logged)
    monkeypatch.setattr(FridaHost, "attach", attach_logged)
    monkeypatch.setattr(FridaHost, "rpc", rpc_logged)
    result = run_capture("malloc", TargetSpec(device="local", app="com.example.steady", launch="pmd3"),
                         CaptureOptions(tracer="malloc", window=1.0, attach_delay=delay, out=tmp_path / "c"),
                         SilentUI())
    assert result.ended == "completed" and result.pid == device.pid
    order = [c[0] for c in device.calls if c[0] in ("launch", "resume", "frida.attach", "agent.start",
                                                     "frida.resume")]
    if delay == 0:
        assert order == ["launch", "frida.attach", "agent.start", "frida.resume"]
    else:
        assert order == ["launch", "resume", "frida.attach", "agent.start"]
    assert [c[1][-1] for c in device.calls if c[0] in ("resume", "frida.resume")] == [device.pid]
    launch = next(c for c in device.calls if c[0] == "launch")
    assert launch[2]["start_suspended"] is True
    # It ran once resumed: steady_tick's 16 KiB blocks were traced in the window.
    records = list(read_records(tmp_path / "c"))
    end = next(r.body for r in records if r.type == RecordType.END)
    assert end["launch"]["how"].startswith("pymobiledevice3")
    assert _steady_tick_mallocs(records) > 0
    # Every lockdown client memtrace opened was closed.
    assert device.names().count("create_using_usbmux") == device.closed.count("lockdown") == (1 if delay == 0 else 2)
    device.assert_real_signatures()


def _steady_tick_mallocs(records: list[Any]) -> int:
    from memtrace.analyze.malloc import summarize

    return sum(r.count for r in summarize(records).stack_rows(None)
               if any(f.function == "steady_tick" for f in r.frames))


@pytest.mark.parametrize("device", [{"version": "17.5", "mounted": True}], indirect=True)
def test_doctor_check_reaches_dvt_and_mounts_nothing(device: Device) -> None:
    check = ios.check_pmd3("UDID")
    assert check.ok and check.detail == "iOS 17.5: DVT process control reachable over tunnel"
    assert "auto_mount" not in device.names() and "launch" not in device.names()
    assert sorted(device.closed) == ["dvt", "lockdown", "rsd"]
    device.tunneld = "down"
    check = ios.check_pmd3("UDID")
    assert not check.ok and "no tunneld answers" in check.detail
    device.tunneld, device.locked = "up", True
    assert ios.check_pmd3("UDID") == ios.DeviceCheck("--launch pmd3", False, launchers.LOCKED_MESSAGE)
    device.assert_real_signatures()


@pytest.mark.parametrize("device", [{"version": "16.1", "mounted": False}], indirect=True)
def test_doctor_check_without_the_image(device: Device) -> None:
    check = ios.check_pmd3("UDID")
    assert not check.ok and "is the developer disk image mounted?" in check.detail


@pytest.mark.parametrize("device", [{"version": "16.4", "paired": False}], indirect=True)
def test_an_unpaired_host_is_told_how_to_pair_and_nothing_pairs(device: Device) -> None:
    with pytest.raises(TargetError, match=r"this host is not paired with the device: pair it once"):
        asyncio.run(launchers.pmd3_launch("UDID", "com.example.app"))
    assert device.calls[0][2]["autopair"] is False and device.closed == ["lockdown"]
    assert ios.check_pmd3("UDID").detail == launchers.NOT_PAIRED_MESSAGE
    device.assert_real_signatures()


@pytest.mark.parametrize("device", [{"version": "16.4", "launch": "hangs"}], indirect=True)
def test_a_launch_that_never_answers_ends_in_one_line(device: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(launchers.PMD3_TIMEOUTS, "launch", 0.2)
    with pytest.raises(TargetError, match=r"DVT launching com.example.app did not answer within 0.2 s"):
        asyncio.run(launchers.pmd3_launch("UDID", "com.example.app"))
    assert device.closed == ["dvt", "lockdown"]


@pytest.mark.parametrize("device", [{"version": "17.4", "tunneld": "undialable"}], indirect=True)
def test_a_listed_tunnel_that_cannot_be_dialled_is_not_list_index_out_of_range(device: Device) -> None:
    with pytest.raises(TargetError, match=r"tunneld lists UDID but its tunnel cannot be reached: restart tunneld"):
        asyncio.run(launchers.pmd3_launch("UDID", "com.example.app"))
    assert device.closed == ["lockdown"]


@pytest.mark.parametrize("device", [{"version": "17.2", "mount_error": None}], indirect=True)
def test_ios17_mount_without_apples_signing_server(device: Device) -> None:
    import requests

    device.mount_error = requests.exceptions.ConnectionError("HTTPConnectionPool(host='gs.apple.com', port=80)")
    with pytest.raises(TargetError, match=r"this host cannot reach Apple's signing server to mount the developer "
                                          r"disk image .*gs.apple.com"):
        asyncio.run(launchers.pmd3_launch("UDID", "com.example.app"))
    assert "launch" not in device.names() and sorted(device.closed) == ["lockdown", "rsd"]


@pytest.mark.parametrize("device", [{"version": "16.6", "launch": "not-dev-signed"},
                                    {"version": "16.6", "launch": "zero"}], indirect=True)
def test_dvt_refusing_an_app_says_it_must_be_development_signed(device: Device) -> None:
    with pytest.raises(TargetError, match=r"DVT refused to launch com.example.app.* -- the app must be "
                                          r"development-signed \(get-task-allow\) for DVT"):
        asyncio.run(launchers.pmd3_launch("UDID", "com.example.app"))
    assert device.closed == ["dvt", "lockdown"]


def test_jetsam_pull_and_doctor_lockdown_never_pair_implicitly(monkeypatch: pytest.MonkeyPatch) -> None:
    """ios.py's and doctor.py's lockdown clients: autopair off, pair timeout set, bound to the real
    factories' signatures (usbmux and TCP)."""
    import pymobiledevice3.lockdown as lockdown

    from memtrace import doctor

    calls: list[tuple[str, dict[str, Any]]] = []
    real = {"create_using_usbmux": create_using_usbmux, "create_using_tcp": lockdown.create_using_tcp}

    def fake(name: str) -> Any:
        async def create(**kwargs: Any) -> str:
            inspect.signature(real[name]).bind(**kwargs)
            calls.append((name, kwargs))
            return "client"
        return create

    monkeypatch.setattr(lockdown, "create_using_usbmux", fake("create_using_usbmux"))
    monkeypatch.setattr(lockdown, "create_using_tcp", fake("create_using_tcp"))
    asyncio.run(ios._default_lockdown(ios.DeviceTarget(udid="UDID")))
    asyncio.run(ios._default_lockdown(ios.DeviceTarget(host="10.0.0.2")))
    asyncio.run(doctor.lockdown_api()("UDID"))
    assert [(n, k["autopair"], k["pair_timeout"]) for n, k in calls] == [
        ("create_using_usbmux", False, 15.0), ("create_using_tcp", False, 15.0), ("create_using_usbmux", False, 15.0)]


def test_attached_resume_falls_back_to_the_launching_tool_when_frida_holds_nothing() -> None:
    """Once attached, Frida's resume first; if Frida holds no spawn instance for the pid (the task
    had booted before the attach), the launching tool's resume releases it."""
    import frida

    from memtrace.frida_host import FridaHost

    order: list[str] = []

    class FakeFridaDevice:
        def __init__(self, holds: bool) -> None:
            self.holds = holds

        def resume(self, pid: int) -> None:
            order.append(f"frida.resume {pid}")
            if not self.holds:
                raise frida.InvalidArgumentError("invalid PID")

    for holds in (True, False):
        order.clear()
        host = FridaHost(TargetSpec(device="usb", app="com.example.app", launch="pmd3"), 5.0,
                         device=FakeFridaDevice(holds))
        host.launched = launchers.Launched(77, 0.0, suspended=True, spawned=True, how="pmd3",
                                           resume=lambda: order.append("dvt.resume"))
        host.session = object()
        host.resume()
        assert order == (["frida.resume 77"] if holds else ["frida.resume 77", "dvt.resume"])
        assert host.launched.suspended is False


@pytest.mark.parametrize("device", [{"version": "16.6", "launch": "locked-launch"}], indirect=True)
def test_a_launch_refused_because_the_device_locked_says_so_not_signing(device: Device) -> None:
    with pytest.raises(TargetError, match=r"the device is locked; unlock it") as info:
        asyncio.run(launchers.pmd3_launch("UDID", "com.example.app"))
    assert "development-signed" not in str(info.value)
