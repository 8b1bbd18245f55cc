"""``memtrace malloc --backend dvt`` on a stock iPhone, with fakes at pymobiledevice3's boundary.

Every call memtrace makes into pymobiledevice3 is held to the installed version's real signature
(``inspect.signature(...).bind``): a change in pymobiledevice3 fails these tests.  The fake
Allocations service streams bytes in the service's own wire format -- the record layout of
pymobiledevice3 11.45's ``AllocationEventParser``: key frames, delta frames, masked addresses,
records split across buffers -- and the REAL parser decodes them, so what reaches memtrace is what
a device's stream would give.  The capture is then read by the same analyzer, report and flame
graph as a Frida capture, with exact numbers.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from pymobiledevice3.exceptions import (
    AlreadyMountedError,
    DeveloperDiskImageNotFoundError,
    PasswordRequiredError,
    TunneldConnectionError,
)
from pymobiledevice3.lockdown import LockdownClient, create_using_usbmux
from pymobiledevice3.services.dvt.instruments.allocations import (
    MALLOC_EVENTS_MASK,
    VM_EVENTS_MASK,
    AllocationEventParser,
    Allocations,
)
from pymobiledevice3.services.dvt.instruments.dvt_provider import DvtProvider
from pymobiledevice3.services.dvt.instruments.leaks import Leaks, MemoryGraph
from pymobiledevice3.services.dvt.instruments.process_control import ProcessControl
from pymobiledevice3.services.dvt.instruments.sysmontap import Sysmontap
from pymobiledevice3.services.dvt.instruments.vm_tracking import VMRegion, VMSnapshot, VMTracking
from pymobiledevice3.services.mobile_image_mounter import MobileImageMounterService, auto_mount
from pymobiledevice3.services.os_trace import OsTraceService
from pymobiledevice3.tunneld.api import get_tunneld_device_by_udid

from memtrace.capture import RecordType, read_records
from memtrace.cli import cli, main
from memtrace.dvt import api as dvt_api_module
from memtrace.dvt.allocations import EventTranslator
from memtrace.tracers import get as get_tracer

REAL = {
    "create_using_usbmux": create_using_usbmux, "get_tunneld_device_by_udid": get_tunneld_device_by_udid,
    "auto_mount": auto_mount, "DvtProvider": DvtProvider.__init__, "ProcessControl": ProcessControl.__init__,
    "launch": ProcessControl.launch, "resume": ProcessControl.resume, "kill": ProcessControl.kill,
    "Allocations": Allocations.__init__, "launch_environment": Allocations.launch_environment,
    "attach": Allocations.attach, "Leaks": Leaks.__init__, "memory_graph": Leaks.memory_graph,
    "VMTracking": VMTracking.__init__, "snapshot": VMTracking.snapshot,
    "Sysmontap.create": Sysmontap.create, "iter_processes": Sysmontap.iter_processes,
    "OsTraceService": OsTraceService.__init__, "syslog": OsTraceService.syslog,
    "get_value": LockdownClient.get_value,
    "process_identifier_for_bundle_identifier": ProcessControl.process_identifier_for_bundle_identifier,
    "is_debuggable": ProcessControl.is_debuggable,
    "MobileImageMounterService": MobileImageMounterService.__init__,
    "is_image_mounted": MobileImageMounterService.is_image_mounted,
}
# One Sysmontap sample as pymobiledevice3 decodes it: attribute name -> value, per process.
SYSMON = [
    {"pid": 0, "name": "kernel_task", "physFootprint": 52_428_800, "memCompressed": 0, "memPurgeable": 0,
     "memResidentSize": 60_000_000, "ppid": 0},
    {"pid": 4711, "name": "Example", "physFootprint": 314_572_800, "memCompressed": 41_943_040,
     "memPurgeable": 8_388_608, "memResidentSize": 280_000_000, "ppid": 1},
    {"pid": 88, "name": "SpringBoard", "physFootprint": 104_857_600, "memCompressed": 10_485_760,
     "memPurgeable": 0, "memResidentSize": 120_000_000, "ppid": 1},
    {"pid": 99, "name": "zombie", "physFootprint": None, "ppid": 1},
]
APP = "/private/var/containers/Bundle/Application/0F0F/Example.app/Example"
APP_TEXT = (0x100000, 0x80000)              # S1's and S2's frames are in the app's __TEXT
FOUNDATION = "/System/Library/Frameworks/Foundation.framework/Foundation"


def region(start: int, size: int, path: str | None, rtype: str | None) -> VMRegion:
    return VMRegion(start=start, size=size, protection=5, max_protection=5, share_mode=1, user_tag=0,
                    is_submap=False, external_pager=False, pages_resident=1, pages_shared_now_private=0,
                    pages_swapped_out=0, pages_dirtied=0, ref_count=1, page_shift=14, path=path, type=rtype)

# ---- the service's wire format (pymobiledevice3 allocations.py) ------------------------------------

HEADER = struct.Struct("<dIIQQQQ")
MASK = 0x5555
KEY_FRAME, DELTA = 0x400000, 0x800000
MALLOC, REALLOC, FREE, CLASS_NAME = 16, 18, 19, 11
THREAD = 0x16F0A3000
S1 = (0x1000A0, 0x1000B0, 0x1000C0)         # innermost first
S2_INNER = 0x1F0001230                       # in Foundation; S2 = (S2_INNER, *S1[1:]) sent as a delta on S1's key frame
KEY_DEPTH = 512


def record(etype: int, address: int, size: int, frames: tuple[int, ...] = (), *, argument: int = 0,
           delta_start: int | None = None) -> bytes:
    if delta_start is None:
        flags, frame_word = etype | KEY_FRAME, len(frames)
    else:
        flags, frame_word = etype | DELTA, (len(frames) << 16) | delta_start
    if etype == REALLOC:
        argument ^= MASK
    body = HEADER.pack(1.0, flags, frame_word, address ^ MASK, argument, THREAD, size)
    return body + struct.pack(f"<{len(frames)}Q", *frames) + b"\0" * 8


def workload() -> tuple[bytes, dict[str, Any]]:
    """1000 x 4096 B under S1, 500 of them freed, 10 x 48 B under S2 (delta frames), one realloc
    of a live block to 8192 B, a class-name event; and what memtrace must find in it."""
    out = bytearray()
    blocks = [0x7000_0000 + i * 0x1000 for i in range(1000)]
    for a in blocks:
        out += record(MALLOC, a, 4096, S1)
    for a in blocks[:500]:
        out += record(FREE, a, 0)
    small = [0x6000_0000 + i * 0x40 for i in range(10)]
    for a in small:
        out += record(MALLOC, a, 48, (S2_INNER,), delta_start=KEY_DEPTH - len(S1))
    moved = 0x7800_0000
    out += record(REALLOC, moved, 8192, S1, argument=blocks[999])
    out += record(CLASS_NAME, small[0], 8, (int.from_bytes(b"NSString", "little"),))
    expect = {"malloc_calls": 1010, "malloc_bytes": 1000 * 4096 + 10 * 48, "realloc_calls": 1,
              "realloc_bytes": 8192, "free_calls": 500, "live_blocks": 510,
              "live_bytes": 499 * 4096 + 8192 + 480, "leaked": [moved, small[3], small[4]],
              "small": small}
    return bytes(out), expect


def chunks(data: bytes, size: int = 1000) -> list[bytes]:
    # Buffers end mid-record, as the device's do: the parser carries the rest over.
    return [data[i:i + size] for i in range(0, len(data), size)]


# ---- the fake device ------------------------------------------------------------------------------

class Device:
    def __init__(self, version: str = "16.7", stream: bytes = b"", ends: bool = False, pid: int = 4711,
                 leaked: list[int] | None = None, debuggable: bool = True,
                 footprints: tuple[int, ...] = (), log: tuple[tuple[int, str], ...] = (),
                 developer_mode: bool = True, tunneld: str = "up", mounted: bool = True,
                 app_pid: int = 4711, paired: bool = True) -> None:
        self.paired = paired
        self.footprints, self.log = footprints, log
        self.developer_mode, self.tunneld, self.mounted, self.app_pid = developer_mode, tunneld, mounted, app_pid
        self.version, self.stream, self.ends, self.pid = version, stream, ends, pid
        self.leaked = leaked or []
        self.debuggable = debuggable
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.closed: list[str] = []
        self.resumed: asyncio.Event | None = None

    def call(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))

    def gate(self) -> asyncio.Event:
        if self.resumed is None:
            self.resumed = asyncio.Event()      # made on the host's event loop, where it is awaited
        return self.resumed

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def assert_real_signatures(self) -> None:
        for name, args, kwargs in self.calls:
            inspect.signature(REAL[name]).bind(*args, **kwargs)

    def api(self) -> SimpleNamespace:
        dev = self

        class Client:
            udid = "00008110-FAKE"

            def __init__(self, kind: str) -> None:
                self.kind = kind
                self.product_version = dev.version
                self.product_type = "iPhone14,2"
                self.paired = dev.paired

            async def close(self) -> None:
                dev.closed.append(self.kind)

            async def get_value(self, *args: Any, **kwargs: Any) -> Any:
                dev.call("get_value", self, *args, **kwargs)
                return dev.developer_mode if kwargs.get("key") == "DeveloperModeStatus" else None

        async def usbmux(*args: Any, **kwargs: Any) -> Client:
            dev.call("create_using_usbmux", *args, **kwargs)
            return Client("lockdown")

        async def tunneld(*args: Any, **kwargs: Any) -> Client | None:
            dev.call("get_tunneld_device_by_udid", *args, **kwargs)
            if dev.tunneld == "down":
                raise TunneldConnectionError()
            if dev.tunneld == "broken":
                raise IndexError("list index out of range")
            return None if dev.tunneld == "no-tunnel" else Client("rsd")

        async def mount(*args: Any, **kwargs: Any) -> None:
            dev.call("auto_mount", *args, **kwargs)

        class Context:
            name = ""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                dev.call(self.name, self, *args, **kwargs)

            async def __aenter__(self) -> Any:
                return self

            async def __aexit__(self, *exc: object) -> None:
                dev.closed.append(self.name)

        class FakeDvt(Context):
            name = "DvtProvider"

        class FakeProcessControl(Context):
            name = "ProcessControl"

            async def launch(self, *args: Any, **kwargs: Any) -> int:
                dev.call("launch", self, *args, **kwargs)
                return dev.pid

            async def resume(self, *args: Any, **kwargs: Any) -> None:
                dev.call("resume", self, *args, **kwargs)
                dev.gate().set()

            async def kill(self, *args: Any, **kwargs: Any) -> None:
                dev.call("kill", self, *args, **kwargs)

            async def process_identifier_for_bundle_identifier(self, *args: Any, **kwargs: Any) -> int:
                dev.call("process_identifier_for_bundle_identifier", self, *args, **kwargs)
                return dev.app_pid

            async def is_debuggable(self, *args: Any, **kwargs: Any) -> bool:
                dev.call("is_debuggable", self, *args, **kwargs)
                return dev.debuggable

        class FakeMounter(Context):
            name = "MobileImageMounterService"

            async def is_image_mounted(self, *args: Any, **kwargs: Any) -> bool:
                dev.call("is_image_mounted", self, *args, **kwargs)
                return dev.mounted

        class FakeAllocations(Context):
            name = "Allocations"

            async def launch_environment(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
                dev.call("launch_environment", self, *args, **kwargs)
                return {"DYLD_INSERT_LIBRARIES": "/Developer/usr/lib/libBacktraceRecording.dylib"}

            async def attach(self, *args: Any, **kwargs: Any) -> None:
                dev.call("attach", self, *args, **kwargs)
                if not dev.debuggable:
                    raise RuntimeError("Failed to record the allocations of 4711: not debuggable")

            async def __aiter__(self) -> Any:
                parser = AllocationEventParser()      # the real decoder
                await dev.gate().wait()                # the app runs once it is resumed
                for buffer in chunks(dev.stream):
                    for event in parser.feed(buffer):
                        yield event
                    await asyncio.sleep(0)
                if not dev.ends:
                    await asyncio.Event().wait()      # the app lives on until the window ends

        class FakeVMTracking(Context):
            name = "VMTracking"

            async def snapshot(self, *args: Any, **kwargs: Any) -> VMSnapshot:
                dev.call("snapshot", self, *args, **kwargs)
                return VMSnapshot(regions=[region(0x1f0000000, 0x400000, FOUNDATION, "__TEXT"),
                                           region(*APP_TEXT, APP, "__TEXT"),
                                           region(APP_TEXT[0] + APP_TEXT[1], 0x4000, APP, "__DATA"),
                                           region(0x280000000, 0x100000, None, None)],
                                  total_size=0x600000, mach_absolute_time=1)

        class FakeSysmontap(Context):
            name = "Sysmontap"

            @classmethod
            async def create(cls, *args: Any, **kwargs: Any) -> FakeSysmontap:
                dev.call("Sysmontap.create", *args, **kwargs)
                return cls.__new__(cls)

            async def iter_processes(self, *args: Any, **kwargs: Any) -> Any:
                dev.call("iter_processes", self, *args, **kwargs)
                yield []                                   # a system-only row first, as the device sends
                if not dev.footprints:
                    yield [dict(e) for e in SYSMON]
                    return
                for fp in dev.footprints:                  # the app growing, a sample every 50 ms
                    yield [dict(SYSMON[0]), {**SYSMON[1], "physFootprint": fp}]
                    await asyncio.sleep(0.05)
                while True:                                # then it is gone (jetsammed)
                    yield [dict(SYSMON[0])]
                    await asyncio.sleep(0.05)

        class FakeOsTrace(Context):
            name = "OsTraceService"

            async def syslog(self, *args: Any, **kwargs: Any) -> Any:
                dev.call("syslog", self, *args, **kwargs)
                for pid, message in dev.log:
                    yield SimpleNamespace(pid=pid, message=message)
                await asyncio.Event().wait()

        class FakeLeaks(Context):
            name = "Leaks"

            async def memory_graph(self, *args: Any, **kwargs: Any) -> MemoryGraph:
                dev.call("memory_graph", self, *args, **kwargs)
                return MemoryGraph(data=None, leaked_count=len(dev.leaked), leaked_addresses=list(dev.leaked))

        return SimpleNamespace(
            create_using_usbmux=usbmux, get_tunneld_device_by_udid=tunneld, auto_mount=mount,
            DvtProvider=FakeDvt, ProcessControl=FakeProcessControl, Allocations=FakeAllocations, Leaks=FakeLeaks,
            VMTracking=FakeVMTracking, Sysmontap=FakeSysmontap, OsTraceService=FakeOsTrace,
            MobileImageMounterService=FakeMounter,
            DeviceInfo=None, MALLOC_EVENTS_MASK=MALLOC_EVENTS_MASK, VM_EVENTS_MASK=VM_EVENTS_MASK,
            AlreadyMountedError=AlreadyMountedError, DeveloperDiskImageNotFoundError=DeveloperDiskImageNotFoundError,
            PasswordRequiredError=PasswordRequiredError, TunneldConnectionError=TunneldConnectionError)


@pytest.fixture
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Device:
    dev = Device(**getattr(request, "param", {}))
    monkeypatch.setattr(dvt_api_module, "dvt_api", dev.api)
    return dev


def run(args: list[str]) -> Any:
    return CliRunner().invoke(cli, args, catch_exceptions=False)


# ---- the translator alone ---------------------------------------------------------------------------

def test_the_real_parser_and_the_translator_give_exact_counts() -> None:
    data, expect = workload()
    parser = AllocationEventParser()
    t = EventTranslator()
    for buffer in chunks(data, 777):
        for event in parser.feed(buffer):
            t.feed(event)
    c = t.counters
    from memtrace import layout

    calls, nbytes = layout.C_CALLS, layout.C_BYTES
    assert c[calls + layout.KINDS["malloc"]] == expect["malloc_calls"]
    assert c[nbytes + layout.KINDS["malloc"]] == expect["malloc_bytes"]
    assert c[calls + layout.KINDS["realloc"]] == 1 and c[nbytes + layout.KINDS["realloc"]] == 8192
    assert c[calls + layout.KINDS["free"]] == 500
    assert len(t.live) == expect["live_blocks"]
    assert sum(size for size, _ in t.live.values()) == expect["live_bytes"]
    assert t.other_events == 1
    # S1 and S2 interned once each; S2 rebuilt from S1's key frame by the parser.
    assert set(t.stacks) == {S1, (S2_INNER, *S1[1:])}
    payload, batch = t.take(100.0)
    assert payload["counters"] == c and payload["mode"] == "aggregate"
    # The peak: the 1000 blocks of 4096 B before any was freed, all under S1.
    assert payload["peak"]["bytes"] == 4096 * 1000 and payload["tracked"]["bytes"] == expect["live_bytes"]
    from memtrace.capture import AggRecord, PeakHeadRecord, PeakRecord, decode_agent_records

    records = list(decode_agent_records(batch))
    s1, s2 = t.stacks[S1], t.stacks[(S2_INNER, *S1[1:])]
    agg = {r.stack_id: r.values for r in records if isinstance(r, AggRecord)}
    assert agg[s1] == {"allocs": 1001, "bytes": 4096 * 1000 + 8192, "frees": 501, "freed_bytes": 4096 * 501,
                       "temp": 0, "temp_bytes": 0}
    assert agg[s2]["allocs"] == 10 and agg[s2]["bytes"] == 480 and agg[s2]["frees"] == 0
    (head,) = [r for r in records if isinstance(r, PeakHeadRecord)]
    assert (head.nstacks, head.bytes, head.count) == (1, 4096 * 1000, 1000)
    assert [(r.stack_id, r.bytes, r.count) for r in records if isinstance(r, PeakRecord)] == [(s1, 4096000, 1000)]
    # Nothing new: a sample for the timeline, no records.
    again, data = t.take(200.0)
    assert data == b"" and again["sample"]["tracked_bytes"] == expect["live_bytes"]


# ---- the whole command ------------------------------------------------------------------------------

@pytest.mark.smoke
@pytest.mark.parametrize("device", [{"stream": workload()[0]}], indirect=True)
def test_malloc_backend_dvt_gives_the_same_summary_as_a_frida_capture(device: Device, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    r = run(["malloc", "--backend", "dvt", "--app", "com.example.app", "--device", "usb", "--window", "1",
             "--out", str(out), "--json", "--top", "5"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert "launch-time recording through Instruments' Allocations service" in doc["recorded_by"]
    _, expect = workload()
    assert doc["calls"]["malloc"] == expect["malloc_calls"]
    assert doc["calls"]["realloc"] == 1 and doc["calls"]["free"] == 500
    assert doc["gross_bytes"] == expect["malloc_bytes"] + 8192
    assert doc["live"]["count"] == expect["live_blocks"] and doc["live"]["bytes"] == expect["live_bytes"]
    top, second = doc["top_stacks"][:2]
    # S1: the 1000 blocks of 4096 B and the realloc; S2: the ten 48 B blocks.
    assert (top["count"], top["bytes"]) == (1001, 4096000 + 8192) and (second["count"], second["bytes"]) == (10, 480)
    assert [f["address"] for f in top["frames"]] == [hex(a) for a in S1]
    assert [f["address"] for f in second["frames"]] == [hex(S2_INNER), *(hex(a) for a in S1[1:])]
    # The same views as a Frida capture: the exact peak with its composition, temporaries, a timeline.
    assert doc["mode"] == "aggregate"
    assert (doc["peak"]["bytes"], doc["peak"]["count"]) == (4096 * 1000, 1000) and doc["peak"]["exact"]
    assert doc["peak"]["by_stack"][0]["bytes"] == 4096 * 1000
    assert doc["temporary"] is not None and len(doc["timeline"]["t"]) >= 5
    # The timeline samples the fold as the stream arrives: a sample may fall before the frees (the
    # stream's pace is the machine's), never above the peak; the last one is the end's live bytes.
    tracked = doc["timeline"]["tracked_bytes"]
    assert max(tracked) <= doc["peak"]["bytes"] and tracked[-1] == expect["live_bytes"]
    # Frames land in the app's image, read from the VM Tracker's __TEXT regions.
    assert {f["module"] for f in top["frames"]} == {"Example"} and top["frames"][0]["offset"] == S1[0] - APP_TEXT[0]
    # Launch with the recording environment, suspended; attach; resume; kill at the end.
    names = device.names()
    # --device usb: the first device's UDID, then the session on it (iOS 16: lockdown, no tunnel).
    assert names[:7] == ["create_using_usbmux", "create_using_usbmux", "auto_mount", "DvtProvider", "ProcessControl",
                         "Allocations", "launch_environment"]
    assert device.calls[0][2]["serial"] is None and device.calls[1][2]["serial"] == "00008110-FAKE"
    assert all(c[2]["autopair"] is False for c in device.calls if c[0] == "create_using_usbmux")
    assert names.index("launch") < names.index("attach") < names.index("resume") < names.index("kill")
    launch = next(c for c in device.calls if c[0] == "launch")
    assert launch[1][1] == "com.example.app" and launch[2]["start_suspended"] is True
    assert launch[2]["environment"] == {"DYLD_INSERT_LIBRARIES": "/Developer/usr/lib/libBacktraceRecording.dylib"}
    device.assert_real_signatures()
    # The capture says how it was made, and ends like any other.
    records = list(read_records(out / "capture.mtc"))
    recon = next(r.body for r in records if r.type == RecordType.RECON)
    assert recon["info"]["backend"] == "dvt" and "launch-time" in recon["info"]["covers"]
    end = next(r.body for r in records if r.type == RecordType.END)
    assert end["ended"] == "completed"
    # The views read it: report and flame graph.
    assert run(["report", str(out), "--out", str(tmp_path / "report")]).exit_code == 0
    report = (tmp_path / "report" / "REPORT.md").read_text()
    assert "1,011 calls" in report and "510 survivors" in report
    assert "`Foundation+0x1230` ← `Example+0xb0` ← `Example+0xc0`" in report
    assert run(["flamegraph", str(out), "-o", str(tmp_path / "f.html")]).exit_code == 0
    assert (tmp_path / "f.html").stat().st_size > 1000


@pytest.mark.parametrize("device", [{"stream": workload()[0], "leaked": workload()[1]["leaked"]}], indirect=True)
def test_leaks_come_from_the_devices_memory_graph_with_the_recorded_stacks(device: Device, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    r = run(["malloc", "--backend", "dvt", "--app", "com.example.app", "--window", "1", "--leaks",
             "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    leaks = json.loads(r.stdout)["leaks"]
    assert leaks["leaked"]["blocks"] == 3 and leaks["leaked"]["bytes"] == 8192 + 48 + 48
    rows = {tuple(f["address"] for f in row["frames"][:1]): row for row in leaks["leaked"]["by_stack"]}
    assert rows[(hex(S1[0]),)]["bytes"] == 8192 and rows[(hex(S2_INNER),)]["blocks"] == 2
    assert leaks["reachable"]["blocks"] == 510 - 3
    graph = next(c for c in device.calls if c[0] == "memory_graph")
    assert graph[1][1] == 4711
    device.assert_real_signatures()


@pytest.mark.parametrize("device", [{"stream": workload()[0], "ends": True}], indirect=True)
def test_an_app_that_exits_ends_the_capture_with_everything_recorded(device: Device, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    r = run(["malloc", "--backend", "dvt", "--app", "com.example.app", "--window", "30", "--out", str(out),
             "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["calls"]["malloc"] == 1010
    end = next(r.body for r in read_records(out / "capture.mtc") if r.type == RecordType.END)
    assert end["ended"] != "completed" and "kill" not in device.names()


def one_line_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """memtrace's own entry point: a refusal is one line on stderr and a non-zero exit."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err.strip()
    assert err.startswith("memtrace: error: ") and "\n" not in err, err
    return err


@pytest.mark.parametrize("device", [{"debuggable": False}], indirect=True)
def test_an_app_that_is_not_development_signed_is_one_line(device: Device, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(["malloc", "--backend", "dvt", "--app", "com.example.app", "--window", "1",
                          "--out", str(tmp_path / "cap")], capsys)
    assert "development-signed" in err
    assert not (tmp_path / "cap").exists()      # nothing recorded: no stub capture left behind
    assert "kill" in device.names()             # and the app memtrace launched is not left suspended


@pytest.mark.parametrize("args, message", [
    (["--pid", "42"], "give --app"),
    (["--app", "com.example.app", "--events"], "--events does not apply"),
    (["--app", "com.example.app", "--device", "local"], "reached over USB"),
])
def test_combinations_dvt_cannot_do_are_refused(device: Device, tmp_path: Path, args: list[str],
                                                message: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(["malloc", "--backend", "dvt", *args, "--window", "1", "--out", str(tmp_path / "cap")],
                         capsys)
    assert message in err
    assert device.calls == []                   # refused before anything reached the device


def test_the_registry_entry_offers_dvt() -> None:
    tracer = get_tracer("malloc")
    assert tracer is not None and tracer.host is not None
    backend = next(o for o in tracer.options if o.name == "backend")
    assert "dvt" in backend.type.choices


# ---- census on a stock device --------------------------------------------------------------------------

@pytest.mark.parametrize("device", [{"stream": workload()[0]}], indirect=True)
def test_the_console_summary_says_what_the_recording_covers(device: Device, tmp_path: Path) -> None:
    r = run(["malloc", "--backend", "dvt", "--app", "com.example.app", "--window", "1", "--out", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "recorded by: launch-time recording through Instruments' Allocations service" in text
    assert "1,010" in text                      # malloc calls by kind


def test_census_on_a_stock_device_reads_every_footprint_from_sysmontap(device: Device) -> None:
    r = run(["census", "--device", "usb", "--source", "dvt", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = {row["pid"]: row for row in doc["rows"]}
    assert rows[4711]["footprint"] == 314_572_800 and rows[4711]["compressed"] == 41_943_040
    assert rows[4711]["purgeable_volatile"] == 8_388_608 and rows[4711]["rss"] == 280_000_000
    assert rows[4711]["band"] is None and rows[4711]["limit"] is None
    assert rows[99]["status"] == "partial" and rows[99]["footprint"] is None
    assert [row["pid"] for row in doc["rows"]][:3] == [4711, 88, 0]       # sorted by footprint
    assert doc["totals"]["footprint"] == 52_428_800 + 314_572_800 + 104_857_600
    assert doc["device"]["source"] == "sysmontap"
    assert "no jetsam bands or limits" in doc["notes"][0]
    device.assert_real_signatures()


def test_census_table_on_a_stock_device_says_what_is_missing(device: Device) -> None:
    r = run(["census", "--device", "usb", "--source", "dvt"])
    assert r.exit_code == 0, r.output
    assert "Example" in r.output and "compressed" in r.output
    assert "no jetsam bands or limits" in " ".join(r.output.split())


def test_census_auto_falls_back_to_instruments_when_no_frida_server_answers(
        device: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    from memtrace import census as census_module
    from memtrace import devices

    monkeypatch.setattr(devices, "resolve", lambda spec, timeout=5.0: SimpleNamespace(id="00008110-FAKE", type="usb"))

    def no_server(*args: Any) -> None:
        raise RuntimeError("unable to connect to remote frida-server: closed")

    monkeypatch.setattr(census_module, "census_device", no_server)
    r = run(["census", "--device", "usb", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert {row["pid"] for row in doc["rows"]} == {0, 4711, 88, 99}
    assert any("frida-server did not answer (unable to connect to remote frida-server: closed)" in n
               for n in doc["notes"])
    # The UDID Frida saw is the one Instruments is asked about: no second device lookup.
    # Never paired implicitly (pymobiledevice3's default would wait on a Trust dialog for ever).
    assert device.calls[0] == ("create_using_usbmux", (), {"serial": "00008110-FAKE", "autopair": False,
                                                            "pair_timeout": 15.0})


# ---- limit on a stock device ---------------------------------------------------------------------------

JETSAM_HISTORY = {
    # Two per-process-limit kills on this model (footprints 2800 and 3000 MiB in 16 KiB pages), one on another.
    "JetsamEvent-2026-11-30-101010.ips": ("iPhone14,2", [("Example", 179200), ("Other", 192000)]),
    "JetsamEvent-2026-11-29-090909.ips": ("iPhone12,1", [("Old", 120000)]),
}


def jetsam_report(product: str, kills: list[tuple[str, int]]) -> str:
    header = {"bug_type": "298", "timestamp": "2026-11-30 10:10:10.00 +0000", "os_version": "iPhone OS 17.5 (21F79)",
              "incident_id": "0"}
    body = {"product": product, "memoryStatus": {"pageSize": 16384},
            "processes": [{"pid": 100 + i, "name": n, "rpages": pages, "reason": "per-process-limit"}
                          for i, (n, pages) in enumerate(kills)]}
    return json.dumps(header) + "\n" + json.dumps(body)


@pytest.fixture
def crash_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device's crash-report folder (ios.py's factories), holding JETSAM_HISTORY."""
    from memtrace import ios

    class Lockdown:
        async def __aenter__(self) -> Lockdown:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

    class Manager:
        async def __aenter__(self) -> Manager:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        async def flush(self) -> None:
            return None

        async def ls(self, path: str, depth: int) -> list[str]:
            return [f"/{name}" for name in JETSAM_HISTORY]

        async def pull(self, out: str, entry: str, erase: bool, progress_bar: bool) -> None:
            name = entry.rsplit("/", 1)[-1]
            Path(out, name).write_text(jetsam_report(*JETSAM_HISTORY[name]))

    async def lockdown(target: Any) -> Lockdown:
        return Lockdown()

    monkeypatch.setattr(ios, "_default_lockdown", lockdown)
    monkeypatch.setattr(ios, "_default_manager", lambda lockdown: Manager())


MIB = 1 << 20


@pytest.mark.parametrize("device", [{
    "footprints": tuple(i * 100 * MIB for i in range(20, 31)),
    "log": ((4711, "Received memory warning."), (0, "memorystatus: killing_specific_process pid 4711 [Example] "
                                                    "(per-process-limit 100)"), (88, "unrelated line"))}],
    indirect=True)
def test_limit_on_a_stock_device_footprint_pressure_and_the_limit_from_history(
        device: Device, crash_reports: None) -> None:
    r = run(["limit", "--device", "usb", "--source", "dvt", "--pid", "4711", "--watch", "5", "--interval", "0.05",
             "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["platform"] == "darwin" and doc["source"] == "sysmontap" and doc["name"] == "Example"
    # The smallest per-process-limit kill on this model: 179200 pages of 16 KiB = 2800 MiB.
    assert doc["limit"] == 179200 * 16384 and "2 per-process-limit kill(s) on iPhone14,2" in doc["limit_source"]
    footprints = [s["footprint"] for s in doc["series"]]
    assert footprints == sorted(footprints) and set(footprints) <= {i * 100 * MIB for i in range(20, 31)}
    assert footprints[-1] >= 2500 * MIB          # it grew until it left the samples
    assert all(s["limit"] - s["footprint"] == s["available"] for s in doc["series"])
    assert "no longer in Sysmontap's samples" in doc["stopped"]
    events = [(e["event"], e["via"]) for e in doc["pressure_events"]]
    assert events == [("warning", "syslog"), ("jetsam", "syslog")]
    device.assert_real_signatures()


# ---- doctor on a stock device ---------------------------------------------------------------------------

def doctor_rows(report: Any) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.detail) for c in report.checks if c.section == "stock iPhone"}


@pytest.mark.parametrize("device", [{"version": "17.5"}], indirect=True)
def test_doctor_on_a_ready_stock_device(device: Device) -> None:
    from memtrace import doctor
    from memtrace.dvt.doctor import stock_checks

    report = doctor.Report()
    stock_checks(report, "00008110-FAKE", "com.example.app", api_factory=device.api)
    rows = doctor_rows(report)
    assert [status for status, _ in rows.values()] == ["ok"] * len(rows), rows
    assert rows["memtrace malloc --backend dvt --app"] == ("ok", "ready")
    assert "debuggable" in rows["app"][1] and rows["tunnel"][0] == "ok"
    # iOS 17: the image asked about is the personalized one, through the tunnel's RSD.
    mounted = next(c for c in device.calls if c[0] == "is_image_mounted")
    assert mounted[1][1] == "Personalized"
    mounter = next(c for c in device.calls if c[0] == "MobileImageMounterService")
    assert mounter[1][1].kind == "rsd"
    assert device.closed.count("rsd") == 1 and device.closed.count("lockdown") == 1
    device.assert_real_signatures()


@pytest.mark.parametrize("device, expect", [
    ({"version": "17.4", "tunneld": "down"}, {"tunnel": "sudo python3 -m pymobiledevice3 remote tunneld"}),
    ({"version": "16.6", "developer_mode": False}, {"developer mode": "Settings > Privacy & Security"}),
    ({"version": "16.6", "debuggable": False}, {"app": "development-signed"}),
    ({"version": "17.2", "tunneld": "broken"}, {"tunnel": "its tunnel cannot be reached"}),
    ({"version": "16.6", "paired": False}, {"lockdown": "pymobiledevice3 lockdown pair"}),
], indirect=["device"])
def test_doctor_names_the_fix_for_each_missing_piece(device: Device, expect: dict[str, str]) -> None:
    from memtrace import doctor
    from memtrace.dvt.doctor import stock_checks

    report = doctor.Report()
    stock_checks(report, "00008110-FAKE", "com.example.app", api_factory=device.api)
    rows = doctor_rows(report)
    for name, fix in expect.items():
        assert rows[name][0] == "warn" and fix in rows[name][1], rows[name]
        assert name in rows["memtrace malloc --backend dvt --app"][1]
    if "app" in expect:     # the device itself is fine: census and limit work, malloc waits for the app
        assert rows["memtrace census --source dvt"] == ("ok", "ready")
    device.assert_real_signatures()


def test_doctor_run_on_a_usb_device_without_frida_server(device: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    from memtrace import devices, doctor

    class NoServer:
        type, id, name = "usb", "00008110-FAKE", "iPhone"

        def query_system_parameters(self) -> dict[str, Any]:
            raise RuntimeError("unable to connect to remote frida-server")

    monkeypatch.setattr(devices, "resolve", lambda spec, timeout=5.0: NoServer())
    monkeypatch.setattr(doctor, "_lockdown_checks", lambda *a: None)
    report = doctor.run(None, "usb")
    rows = doctor_rows(report)
    assert rows["memtrace census --source dvt"] == ("ok", "ready")
    assert rows["memtrace malloc --backend dvt --app"][0] == "skip"
    assert report.ok and not any(c.section == "target" for c in report.checks)
