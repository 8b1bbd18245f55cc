"""doctor's verdicts, and its device checks against a fake USB device and a fake lockdown (the
boundaries nothing here can reach)."""

from __future__ import annotations

from typing import Any

import pytest

from memtrace import doctor, ios


@pytest.mark.parametrize(("scope", "euid", "cap", "status", "fragment"), [
    (None, 1000, 0, "ok", "no Yama"),
    ("0\n", 1000, 0, "ok", "ptrace_scope 0"),
    ("1\n", 1000, 0, "warn", "--pid/--name need root or CAP_SYS_PTRACE"),
    ("1\n", 0, 0, "ok", "running as root"),
    ("1\n", 1000, 1 << doctor.CAP_SYS_PTRACE, "ok", "running as CAP_SYS_PTRACE"),
    ("2\n", 1000, 0, "fail", "only root or CAP_SYS_PTRACE may attach"),
    ("2\n", 0, 0, "ok", "admin only"),
    ("3\n", 0, 0, "fail", "ptrace is disabled"),
])
def test_ptrace_verdict(scope: str | None, euid: int, cap: int, status: str, fragment: str) -> None:
    got, detail = doctor.ptrace_verdict(scope, euid, cap)
    assert got == status and fragment in detail


@pytest.mark.parametrize(("client", "server", "status"), [
    ("17.26.2", "17.26.2", "ok"), ("17.26.2", "17.1.0", "warn"), ("17.26.2", "16.5.9", "fail"),
])
def test_version_verdict(client: str, server: str, status: str) -> None:
    assert doctor.version_verdict(client, server)[0] == status


@pytest.mark.parametrize(("version", "import_error", "minimum", "status", "fragment"), [
    ("14.13.0", None, "14", "ok", "frida-tools 14.13.0"),
    ("15.0rc1", None, "14", "ok", "frida-tools 15.0rc1"),
    (None, None, "14", "fail", "pip install 'frida-tools>=14'"),
    ("13.7.1", None, "14", "fail", "older than memtrace needs"),
    ("14.13.0", "No module named 'frida_tools.application'", "14", "fail", "Reactor cannot be imported"),
])
def test_frida_tools_is_a_dependency(version: str | None, import_error: str | None, minimum: str,
                                     status: str, fragment: str) -> None:
    got, detail = doctor.frida_tools_verdict(version, import_error, minimum)
    assert got == status and fragment in detail


def test_frida_tools_check_here_and_with_its_reactor_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata
    import sys

    # memtrace's own metadata is where the minimum comes from (pyproject: frida-tools>=14).
    assert doctor._required_minimum("frida-tools") == "14"
    assert doctor._required_minimum("frida") == "17.0"       # not frida-tools' line, though it starts alike
    status, detail, version = doctor.frida_tools_check()
    assert (status, version) == ("ok", importlib.metadata.version("frida-tools")), detail
    monkeypatch.setitem(sys.modules, "frida_tools.application", None)     # import now raises ImportError
    status, detail, _ = doctor.frida_tools_check()
    assert status == "fail" and "Reactor cannot be imported" in detail


def recon(found: list[str], missing: list[str]) -> list[dict[str, Any]]:
    return [{"name": n, "status": "found"} for n in found] + [{"name": n, "status": "MISSING"} for n in missing]


def test_hook_verdicts() -> None:
    v = doctor.hook_verdict("malloc", recon(["malloc", "free"], []), [], "linux")
    assert (v.status, v.detail) == ("ok", "2 found, 0 missing, 0 fail to attach")
    v = doctor.hook_verdict("malloc", recon(["malloc", "free"], []), ["free"], "linux")
    assert v.status == "fail" and "cannot hook free" in v.detail
    assert [p["status"] for p in v.data["points"]] == ["found", "fails to attach"]
    v = doctor.hook_verdict("fds", recon(["open"], ["openat2"]), [], "linux")
    assert v.status == "warn" and "missing: openat2" in v.detail
    # A tracer with no hook point at all cannot work where it belongs...
    assert doctor.hook_verdict("malloc", recon([], ["malloc"]), [], "linux").status == "fail"
    assert doctor.hook_verdict("iosurface", recon([], ["IOSurfaceCreate"]), [], "darwin").status == "fail"
    # ...and a Darwin tracer off Darwin is expected to find nothing.
    assert doctor.hook_verdict("iosurface", recon([], ["IOSurfaceCreate"]), [], "linux").status == "skip"
    assert doctor.hook_verdict("purgeable", recon(["madvise"], ["vm_purgable_control"]), [], "linux").status == "skip"


class FakeDevice:
    def __init__(self, params: dict[str, Any], type_: str = "usb") -> None:
        self.params, self.type, self.id, self.name = params, type_, "00008101-000A", "iPhone"

    def query_system_parameters(self) -> dict[str, Any]:
        return self.params


IOS = {"os": {"id": "ios", "name": "iOS", "version": "16.5"}, "platform": "darwin", "arch": "arm64",
       "hardware": {"product": "iPhone13,2"}, "access": "full", "name": "iPhone"}


class FakeLockdown:
    def __init__(self, values: dict[tuple[str | None, str], Any]) -> None:
        self.values = values

    async def get_value(self, domain: str | None = None, key: str | None = None) -> Any:
        if (domain, key) not in self.values:
            raise KeyError(key)
        return self.values[(domain, key)]


def factory(values: dict[tuple[str | None, str], Any] | None, asked: list[str]):
    async def create(udid: str) -> FakeLockdown:
        asked.append(udid)
        if values is None:
            raise ConnectionError("no usbmuxd")
        return FakeLockdown(values)
    return create


def rows(report: doctor.Report) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.detail) for c in report.checks}


def test_jailbroken_usb_device_with_lockdown_and_developer_mode() -> None:
    asked: list[str] = []
    report = doctor.Report()
    platform = doctor.device_checks(report, FakeDevice(IOS), factory(
        {(None, "ProductType"): "iPhone13,2", (None, "ProductVersion"): "16.5",
         ("com.apple.security.mac.amfi", "DeveloperModeStatus"): True}, asked),
        dvt=lambda udid: ios.DeviceCheck("--launch pmd3", True, f"DVT reachable on {udid}"))
    assert platform == "darwin" and asked == ["00008101-000A"]
    r = rows(report)
    assert r["--launch pmd3"] == ("ok", "DVT reachable on 00008101-000A")
    assert r["OS and model"] == ("ok", "iOS 16.5 (darwin, arm64), iPhone13,2")
    assert r["jailbreak"][0] == "ok"
    assert r["lockdown"] == ("ok", "reachable: iPhone13,2, iOS 16.5")
    assert r["developer mode"] == ("ok", "on")
    assert report.ok


def test_jailed_device_without_developer_mode_and_old_ios() -> None:
    report = doctor.Report()
    doctor.device_checks(report, FakeDevice({**IOS, "access": "jailed"}), factory(
        {(None, "ProductType"): "iPhone10,6", (None, "ProductVersion"): "15.7",
         ("com.apple.security.mac.amfi", "DeveloperModeStatus"): False}, []))
    r = rows(report)
    assert r["jailbreak"][0] == "warn" and "not jailbroken" in r["jailbreak"][1]
    assert r["developer mode"][0] == "warn"
    report = doctor.Report()
    doctor.device_checks(report, FakeDevice(IOS), factory({(None, "ProductType"): "iPhone9,1",
                                                           (None, "ProductVersion"): "14.8"}, []))
    assert rows(report)["developer mode"][0] == "skip"


def test_unreachable_lockdown_is_a_warning() -> None:
    report = doctor.Report()
    doctor.device_checks(report, FakeDevice(IOS), factory(None, []))
    status, detail = rows(report)["lockdown"]
    assert status == "warn" and "no usbmuxd" in detail
    assert report.ok


def test_device_only_checks_inside_an_app_are_wired_and_warn_when_they_fail() -> None:
    seen: list[tuple[str, int]] = []

    def passing(device: Any, pid: int) -> ios.DeviceCheck:
        seen.append(("ca", pid))
        return ios.DeviceCheck("purgeable: Core Animation hooks", True, "6 overloads found")

    def failing(device: Any, pid: int) -> ios.DeviceCheck:
        seen.append(("pressure", pid))
        return ios.DeviceCheck("limit: memory-pressure source", False, "dispatch_source_create missing")

    def crashing(device: Any, pid: int) -> ios.DeviceCheck:
        raise RuntimeError("session detached")

    report = doctor.Report()
    doctor.darwin_target_checks(report, FakeDevice(IOS), 4242, (passing, failing, crashing))
    r = rows(report)
    assert seen == [("ca", 4242), ("pressure", 4242)]
    assert r["purgeable: Core Animation hooks"] == ("ok", "6 overloads found")
    assert r["limit: memory-pressure source"] == ("warn", "dispatch_source_create missing")
    assert r["crashing"] == ("warn", "session detached")
    assert report.ok        # a part MISSING on the device is a warning: the tracers still run


class Broken(FakeDevice):
    def query_system_parameters(self) -> dict[str, Any]:
        raise RuntimeError("connection closed")


def test_a_device_that_cannot_be_queried_fails() -> None:
    report = doctor.Report()
    assert doctor.device_checks(report, Broken(IOS, "remote"), factory(None, [])) is None
    assert rows(report)["system"] == ("fail", "cannot query the device: connection closed")
    assert not report.ok


def test_a_usb_device_without_frida_server_is_a_stock_iphone_not_a_failure() -> None:
    # No frida-server over USB: the jailbroken path is out; doctor goes on to the stock-iPhone checks.
    report = doctor.Report()
    assert doctor.device_checks(report, Broken(IOS), factory(None, [])) is None
    status, detail = rows(report)["frida-server"]
    assert status == "warn" and "no frida-server answers (connection closed)" in detail
    assert report.ok
