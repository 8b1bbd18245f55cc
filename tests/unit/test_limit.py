"""limit: /proc parsers, the device spec, the watch loop, and the iOS probe against a fake Frida device."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from memtrace import devices
from memtrace import limit as L
from memtrace.agentbuild import AGENT_DIR, build_agent
from memtrace.commands.limit import command as limit_command
from memtrace.errors import InputError, TargetError
from memtrace.frida_host import load_agent

LIMITS = """\
Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max data size             1073741824           unlimited            bytes
Max address space         unlimited            unlimited            bytes
Max open files            1024                 4096                 files
"""


def test_parse_limits() -> None:
    parsed = L.parse_limits(LIMITS)
    assert parsed["Max data size"] == 1 << 30
    assert parsed["Max address space"] is None
    assert parsed["Max open files"] == 1024


@pytest.mark.parametrize("text, expected", [
    ("auto", devices.DeviceSpec("auto")), ("local", devices.DeviceSpec("local")), ("usb", devices.DeviceSpec("usb")),
    ("id:00008030-001A", devices.DeviceSpec("id", udid="00008030-001A")),
    ("remote:10.0.0.2", devices.DeviceSpec("remote", host="10.0.0.2")),
    ("remote:10.0.0.2:27043", devices.DeviceSpec("remote", host="10.0.0.2", port=27043)),
])
def test_parse_device_spec(text: str, expected: devices.DeviceSpec) -> None:
    assert devices.parse_device_spec(text) == expected


@pytest.mark.parametrize("text", ["bluetooth", "id:", "remote:", "remote::1"])
def test_parse_device_spec_rejects(text: str) -> None:
    with pytest.raises(InputError):
        devices.parse_device_spec(text)


def _fake_proc(tmp_path: Path, data_limit: int | None) -> Path:
    proc = tmp_path / "proc"
    d = proc / "42"
    d.mkdir(parents=True)
    (proc / "self").mkdir()
    (proc / "self" / "mountinfo").write_text("")
    (proc / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    (d / "status").write_text("Name:\tapp\nVmSize:\t300000 kB\nVmData:\t200000 kB\nVmRSS:\t50000 kB\n"
                              "RssAnon:\t40000 kB\nVmSwap:\t1000 kB\n")
    (d / "cgroup").write_text("0::/\n")
    text = LIMITS if data_limit is None else LIMITS.replace("1073741824", str(data_limit))
    (d / "limits").write_text(text)
    return proc


def test_linux_sample_picks_the_tightest_bound(tmp_path: Path) -> None:
    doc = L.linux_sample(42, _fake_proc(tmp_path, data_limit=300000 * 1024))
    assert doc["name"] == "app" and doc["footprint"] == 41000 * 1024
    assert [b["name"] for b in doc["bounds"]] == ["RLIMIT_DATA", "MemAvailable"]
    assert doc["binding"] == "RLIMIT_DATA"
    assert doc["available"] == (300000 - 200000) * 1024
    assert doc["limit"] == doc["footprint"] + doc["available"]


def test_linux_sample_memavailable_is_last_resort(tmp_path: Path) -> None:
    doc = L.linux_sample(42, _fake_proc(tmp_path, data_limit=1 << 50))
    assert doc["binding"] == "MemAvailable" and doc["available"] == 4000000 * 1024


def test_linux_sample_missing_process(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="pid 7: no such process"):
        L.linux_sample(7, _fake_proc(tmp_path, None))


def test_watch_series_with_fake_clock() -> None:
    now = [0.0]
    values = iter(range(100, 1000, 100))

    def sample() -> dict[str, Any]:
        v = next(values)
        return {"footprint": v, "available": 1000 - v, "limit": 1000}

    def sleep(s: float) -> None:
        now[0] += s

    series, stopped = L.watch_series(sample, seconds=2.5, interval=1.0, clock=lambda: now[0], sleep=sleep)
    assert stopped is None
    assert [s["t"] for s in series] == [0.0, 1.0, 2.0, 2.5]
    assert [s["footprint"] for s in series] == [100, 200, 300, 400]
    assert all(s["footprint"] + s["available"] == s["limit"] for s in series)


# --- iOS path through a fake Frida device -------------------------------------------------------


@pytest.mark.parametrize("target, root, expected", [
    # A managed app under its limit: os_proc_available_memory is meaningful; root's limit wins.
    ({"footprint": 300, "available": 700}, {"managed": True, "active": 1000, "limit": 1000},
     {"available": 700, "available_source": "os_proc_available_memory", "limit": 1000, "limit_source": "memorystatus"}),
    # A managed app over its limit: 0 means exactly that.
    ({"footprint": 1200, "available": 0}, {"managed": True, "active": 1000},
     {"available": 0, "available_source": "os_proc_available_memory", "limit": 1000, "limit_source": "memorystatus"}),
    # An unmanaged daemon: 0 is no answer; the memorystatus limit gives what is left.
    ({"footprint": 300, "available": 0}, {"managed": False, "active": None, "limit": 800},
     {"available": 500, "available_source": "memorystatus limit - footprint", "limit": 800,
      "limit_source": "memorystatus"}),
    # Root could not read anything: 0 stays unknown, and so does the limit.
    ({"footprint": 300, "available": 0}, {"errors": {"attach": "denied"}},
     {"available": None, "available_source": None, "limit": None, "limit_source": None}),
    # In the background (state without kMemorystatusActive) xnu applies the inactive limit ...
    ({"footprint": 300, "available": 0}, {"managed": True, "active": 1000, "inactive": 600, "state": 0x008},
     {"available": 0, "limit": 600, "limit_source": "memorystatus", "limit_kind": "inactive"}),
    # ... in the foreground the active one.
    ({"footprint": 300, "available": 700}, {"managed": True, "active": 1000, "inactive": 600, "state": 0x088},
     {"available": 700, "limit": 1000, "limit_source": "memorystatus", "limit_kind": "active"}),
    # ... but a non-zero answer is the iOS 13+ identity.
    ({"footprint": 300, "available": 200}, None,
     {"available": 200, "limit": 500, "limit_source": "footprint + os_proc_available_memory"}),
])
def test_combine(target: dict[str, Any], root: dict[str, Any] | None, expected: dict[str, Any]) -> None:
    got = L.combine({"t": 1.0, "errors": {}, **target}, root)
    assert {k: got[k] for k in expected} == expected
    assert got["os_proc_available_memory"] == target["available"]


class FakeLimitExports:
    def __init__(self, script: FakeScript) -> None:
        self.script = script
        self.footprint = 300 << 20
        self.warned = False

    def watch(self) -> list[str]:
        self.script.watching = True
        return ["dispatch_source(warn|critical|proc-limit-warn|proc-limit-critical)"]

    def unwatch(self) -> bool:
        self.script.unwatched = True
        return True

    def sample(self) -> dict[str, Any]:
        self.footprint += 100 << 20
        if self.script.watching and self.footprint >= 600 << 20 and not self.warned:
            self.warned = True
            # what the agent's dispatch source sends on a proc-limit warning
            self.script.emit({"type": "send", "payload": {
                "type": "limit:pressure", "t": 1.0, "via": "dispatch_source",
                "event": "proc-limit-warn", "bits": 16, "footprint": self.footprint,
                "available": (1400 << 20) - self.footprint}})
        return {"t": 0, "footprint": self.footprint, "available": (1400 << 20) - self.footprint, "errors": {}}


class FakeCensusExports:
    """The census agent in frida-server (root): memorystatus answers there."""

    def memlimit(self, pid: int) -> dict[str, Any]:
        assert pid == 777
        return {"pid": pid, "active": 1400 << 20, "active_fatal": True, "inactive": 1400 << 20,
                "inactive_fatal": True, "managed": True, "priority": 100, "limit": 1400 << 20, "state": 0,
                "errors": {}}


class FakeScript:
    def __init__(self, source: str, name: str | None) -> None:
        self.source = source
        self.name = name
        self.watching = False
        self.unwatched = False
        self.handlers: dict[str, Any] = {}
        self.exports_sync: Any = FakeCensusExports() if name == "memtrace-census" else FakeLimitExports(self)
        self.unloaded = False

    def on(self, signal: str, handler: Any) -> None:
        self.handlers[signal] = handler

    def emit(self, message: dict[str, Any]) -> None:
        self.handlers["message"](message, None)

    def load(self) -> None:
        assert "rpc.exports" in self.source

    def unload(self) -> None:
        self.unloaded = True


class FakeSession:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.script: FakeScript | None = None
        self.detached = False

    def create_script(self, source: str, name: str | None = None) -> FakeScript:
        self.script = FakeScript(source, name)
        return self.script

    def on(self, signal: str, handler: Any) -> None:
        pass

    def detach(self) -> None:
        self.detached = True


class FakeProcess:
    def __init__(self, pid: int, name: str) -> None:
        self.pid, self.name = pid, name


class FakeUsbDevice:
    type = "usb"
    name = "iPhone"
    id = "fake-udid"

    def __init__(self) -> None:
        self.sessions: dict[int, FakeSession] = {}

    def enumerate_processes(self) -> list[FakeProcess]:
        return [FakeProcess(1, "launchd"), FakeProcess(777, "MyApp")]

    def attach(self, pid: int) -> FakeSession:
        assert pid in (0, 777)     # the target, and frida-server's system session for memorystatus
        self.sessions[pid] = FakeSession(pid)
        return self.sessions[pid]


def test_cli_limit_ios_watch_records_pressure(monkeypatch: pytest.MonkeyPatch) -> None:
    device = FakeUsbDevice()
    monkeypatch.setattr("memtrace.devices.resolve", lambda spec: device)
    now = [0.0]

    def fake_watch(sample: Any, seconds: float, interval: float) -> Any:
        return L.watch_series(sample, seconds, interval, clock=lambda: now[0],
                              sleep=lambda d: now.__setitem__(0, now[0] + d))

    monkeypatch.setattr("memtrace.commands.limit.watch_series", fake_watch)
    res = CliRunner().invoke(limit_command, ["--name", "MyApp", "--device", "usb", "--watch", "2",
                                             "--interval", "1", "--json"], standalone_mode=False)
    assert res.exception is None, res.output
    doc = json.loads(res.stdout)
    assert doc["platform"] == "darwin" and doc["pid"] == 777
    assert doc["limit"] == 1400 << 20 and doc["limit_source"] == "memorystatus"
    assert doc["memlimit"]["active_fatal"] is True and doc["managed"] is True
    assert doc["series"][0]["footprint"] + doc["series"][0]["available"] == doc["series"][0]["limit"]
    assert [s["t"] for s in doc["series"]] == [0.0, 1.0, 2.0]
    assert [s["footprint"] >> 20 for s in doc["series"]] == [500, 600, 700]
    (event,) = doc["pressure_events"]
    assert event["event"] == "proc-limit-warn" and event["footprint"] == 600 << 20
    target, root = device.sessions[777], device.sessions[0]
    assert target.script is not None and root.script is not None
    assert target.script.name == "memtrace-limit" and root.script.name == "memtrace-census"
    # The dispatch source is cancelled before its script goes; both scripts unloaded, both sessions detached.
    assert target.script.unwatched and target.script.unloaded and target.detached
    assert root.script.unloaded and root.detached
    # The scripts are the agents as agentbuild bundles them (comments do not survive bundling:
    # the DEVICE-UNVERIFIED mark is checked in the module itself).
    assert target.script.source == build_agent("limit").source
    assert root.script.source == build_agent("census").source
    assert "Module.findExportByName(" not in target.script.source
    assert "DEVICE-UNVERIFIED" in (AGENT_DIR / "limit.js").read_text()


def test_cli_limit_needs_one_target() -> None:
    res = CliRunner().invoke(limit_command, ["--device", "local"], standalone_mode=False)
    assert isinstance(res.exception, InputError)


def test_limit_agent_loads_in_frida17_on_linux() -> None:
    frida = pytest.importorskip("frida")
    session, script = load_agent(frida.get_local_device(), 0, "limit")
    try:
        sample = script.exports_sync.sample()
        hooks = script.exports_sync.watch()
    finally:
        script.unload()
        session.detach()
    # No Darwin exports on Linux: every figure is missing and said so, nothing throws.
    assert sample["footprint"] is None and sample["available"] is None
    assert set(sample["errors"]) == {"task_info", "os_proc_available_memory"}
    assert hooks == []
