"""Census: the Linux scanner on a fake /proc tree, cgroup resolution, the pure analysis, iOS row mapping."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memtrace import census as C
from memtrace.analyze import census as A

MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / {root}/cgv1 rw,relatime - cgroup cgroup rw,memory
41 31 0:38 /ns {root}/cgv2 rw,relatime - cgroup2 cgroup2 rw
"""


def status(name: str, rss_anon_kb: int, swap_kb: int = 0, hwm_kb: int | None = None, kthread: bool = False) -> str:
    if kthread:
        return f"Name:\t{name}\nState:\tS (sleeping)\nPPid:\t2\nKthread:\t1\n"
    return (f"Name:\t{name}\nState:\tS (sleeping)\nPPid:\t1\nKthread:\t0\n"
            f"VmHWM:\t{hwm_kb or rss_anon_kb + 100} kB\nVmRSS:\t{rss_anon_kb + 50} kB\n"
            f"RssAnon:\t{rss_anon_kb} kB\nRssFile:\t50 kB\nRssShmem:\t0 kB\nVmSwap:\t{swap_kb} kB\n")


@pytest.fixture()
def fake_proc(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(MOUNTINFO.format(root=tmp_path))
    # cgroup v1: /app limited to 256 MiB, /app/sub unlimited (the parent's limit binds)
    v1 = tmp_path / "cgv1"
    (v1 / "app" / "sub").mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "app" / "memory.limit_in_bytes").write_text(f"{256 << 20}\n")
    (v1 / "app" / "memory.usage_in_bytes").write_text(f"{100 << 20}\n")
    (v1 / "app" / "sub" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    # cgroup v2 mounted from /ns: /ns/svc has memory.max 64 MiB
    v2 = tmp_path / "cgv2"
    (v2 / "svc").mkdir(parents=True)
    (v2 / "memory.max").write_text("max\n")
    (v2 / "svc" / "memory.max").write_text(f"{64 << 20}\n")
    (v2 / "svc" / "memory.current").write_text(f"{10 << 20}\n")

    def add(pid: int, text: str, cgroup: str = "0::/\n", adj: str = "0\n", rollup: str | None = None) -> None:
        d = proc / str(pid)
        d.mkdir()
        (d / "status").write_text(text)
        (d / "cgroup").write_text(cgroup)
        (d / "oom_score_adj").write_text(adj)
        (d / "smaps_rollup").write_text(rollup if rollup is not None else
                                        "Rss:  1000 kB\nPss:   800 kB\nLazyFree:  12 kB\n")

    add(1, status("init", 1000))
    add(2, status("kthreadd", 0, kthread=True))
    add(10, status("big", 64 * 1024, swap_kb=1024), cgroup="4:memory:/app/sub\n0::/\n", adj="300\n")
    add(11, status("svc", 2048), cgroup="0::/ns/svc\n", adj="-1000\n")
    add(12, status("gone", 10))
    add(13, status("secret", 10))
    add(14, status("closed-rollup", 20))
    (proc / "not-a-pid").mkdir()
    return proc


def test_scan_rows_footprint_band_and_limits(fake_proc: Path) -> None:
    rows, kthreads = C.LinuxScanner(fake_proc).scan()
    assert kthreads == 1
    by_pid = {r["pid"]: r for r in rows}
    assert sorted(by_pid) == [1, 10, 11, 12, 13, 14]
    big = by_pid[10]
    assert big["name"] == "big" and big["status"] == "ok"
    assert big["footprint"] == (64 * 1024 + 1024) * 1024  # RssAnon + VmSwap
    assert big["lifetime_max"] == (64 * 1024 + 100) * 1024
    assert big["pss"] == 800 * 1024 and big["reusable"] == 12 * 1024
    assert (big["priority"], big["band"]) == (300, "BACKGROUND")
    assert big["limit"] == 256 << 20 and big["limit_source"] == "cgroup v1:/app"
    svc = by_pid[11]
    assert svc["limit"] == 64 << 20 and svc["limit_source"] == "cgroup v2:/ns/svc"
    assert svc["band"] == "OOM_DISABLED"
    assert by_pid[1]["limit"] is None


def test_vanishing_and_denied_processes_do_not_stop_the_scan(fake_proc: Path) -> None:
    def reader(path: Path) -> str:
        if path.parent.name == "12" and path.name == "smaps_rollup":
            # The process exits between two reads: its whole directory goes away.
            shutil.rmtree(path.parent)
        if path.parent.name == "13":
            raise PermissionError(13, "Permission denied", str(path))
        if path.parent.name == "14" and path.name == "smaps_rollup":
            raise PermissionError(13, "Permission denied", str(path))
        return C.read_text(path)

    rows, _ = C.LinuxScanner(fake_proc, reader).scan()
    by_pid = {r["pid"]: r for r in rows}
    assert by_pid[12]["status"] == "vanished"
    assert by_pid[13]["status"] == "denied" and by_pid[13]["footprint"] is None
    assert by_pid[14]["status"] == "partial" and by_pid[14]["footprint"] == 20 * 1024
    assert by_pid[14]["pss"] is None
    assert by_pid[10]["status"] == "ok"  # later pids are still measured
    t = A.totals(rows)
    assert (t["vanished"], t["denied"]) == (1, 1)


def test_pid_directory_gone_before_first_read(fake_proc: Path) -> None:
    scanner = C.LinuxScanner(fake_proc)
    pids = scanner.pids()
    shutil.rmtree(fake_proc / "10")
    rows = [scanner.row(pid) for pid in pids]
    gone = [r for r in rows if r is not None and r["pid"] == 10]
    assert gone[0]["status"] == "vanished" and gone[0]["footprint"] is None


def test_zombie_is_listed_as_vanished(fake_proc: Path) -> None:
    (fake_proc / "12" / "status").write_text("Name:\tzombie\nState:\tZ (zombie)\nPPid:\t1\nKthread:\t0\n")
    row = C.LinuxScanner(fake_proc).row(12)
    assert row is not None and row["status"] == "vanished" and row["name"] == "zombie"


def test_cgroup_outside_the_namespace_root_has_no_limit(tmp_path: Path) -> None:
    mounts = C.parse_mountinfo(MOUNTINFO.format(root=tmp_path))
    assert [m.version for m in mounts] == [1, 2]
    result = C.cgroup_limit(mounts, {2: "/elsewhere/x"})
    assert result.limit is None


def test_parse_helpers() -> None:
    assert C.parse_kb_fields("VmRSS:\t  12 kB\nThreads:\t3\nBad: x kB\n") == {"VmRSS": 12 * 1024}
    assert C.parse_proc_cgroup("12:memory,cpu:/a\n0::/b\nbroken\n") == {1: "/a", 2: "/b"}


# --- analysis -------------------------------------------------------------------------------------


def test_bands_on_both_scales() -> None:
    legacy = A.DARWIN_BANDS_LEGACY
    assert A.darwin_band(10, legacy) == "FOREGROUND" and A.darwin_band(0, legacy) == "IDLE"
    assert A.darwin_band(21, legacy) == "MAX" and A.darwin_band(-1, legacy) == "DEFAULT"
    assert A.darwin_band(7, legacy) == "BAND_7"
    # xnu-8792+ (iOS 16-18): ten times larger, FREEZER and DRIVER_APPLE added.
    assert [A.darwin_band(p) for p in (0, 10, 30, 75, 100, 150, 160, 190, 210)] == [
        "IDLE", "AGING_BAND1", "BACKGROUND", "FREEZER", "FOREGROUND", "DRIVER_APPLE", "HOME", "CRITICAL", "MAX"]
    assert A.darwin_band(21) == "BAND_21"
    assert A.darwin_band(None) is None
    # Every band xnu names: 15 on both scales, the entitled bands 1-9 and INTERNAL on the new one.
    assert A.darwin_band(15, legacy) == "DRIVER_APPLE" and A.darwin_band(15) == "AGING_BAND1_STUCK"
    assert {A.darwin_band(p) for p in range(1, 10)} == {"ENTITLED"} and A.darwin_band(999) == "INTERNAL"
    assert [p for p in range(0, 22) if A.darwin_band(p, legacy).startswith("BAND_")] == [6, 7, 11, 14, 20]


@pytest.mark.parametrize("version, priorities, scaled", [
    ("15.7.1", [], False), ("16.0", [], True), ("17.5.1", [10], True), ("18.2", [], True),
    ("13.3.1", [21], False),
    (None, [0, 10, 21], False),          # no version: the legacy scale never passes 21
    (None, [0, 100, 210], True),
    ("", [None, 180], True),
])
def test_band_table_by_os_version(version: str | None, priorities: list, scaled: bool) -> None:
    table = A.darwin_band_table(version, priorities)
    assert table is (A.DARWIN_BANDS if scaled else A.DARWIN_BANDS_LEGACY)
    assert [A.linux_band(v) for v in (-1000, -500, 0, 100, 250, 400, 700, 1000)] == [
        "OOM_DISABLED", "PROTECTED", "DEFAULT", "VISIBLE", "PERCEPTIBLE", "BACKGROUND", "SERVICE", "CACHED"]


ROWS = [
    {"pid": 3, "name": "b", "footprint": 30, "lifetime_max": 90, "purgeable_volatile": 5,
     "purgeable_nonvolatile": 1, "priority": 10, "status": "ok"},
    {"pid": 1, "name": "C", "footprint": 50, "lifetime_max": 60, "purgeable_volatile": None,
     "purgeable_nonvolatile": None, "priority": 0, "status": "ok"},
    {"pid": 2, "name": "a", "footprint": None, "lifetime_max": None, "priority": None, "status": "vanished"},
]


@pytest.mark.parametrize("key, order", [
    ("footprint", [1, 3, 2]), ("lifetime_max", [3, 1, 2]), ("purgeable", [3, 1, 2]),
    ("name", [2, 3, 1]), ("pid", [1, 2, 3]), ("priority", [3, 1, 2]),
])
def test_sort_rows(key: str, order: list[int]) -> None:
    assert [r["pid"] for r in A.sort_rows(ROWS, key)] == order


def test_sort_rows_rejects_unknown_key() -> None:
    with pytest.raises(ValueError, match="unknown sort key"):
        A.sort_rows(ROWS, "size")


def test_totals() -> None:
    t = A.totals(ROWS)
    assert t["processes"] == 3 and t["measured"] == 2 and t["vanished"] == 1
    assert t["footprint"] == 80 and t["purgeable_volatile"] == 5 and t["graphics"] is None


def test_render_markdown() -> None:
    doc = {"kind": "census", "platform": "darwin", "time": "T", "device": {"name": "iPhone"},
           "rows": [dict(r, band=A.darwin_band(r["priority"], A.DARWIN_BANDS_LEGACY)) for r in ROWS],
           "notes": ["n|1"]}
    md = A.render_markdown(doc)
    assert md.startswith("## Census\n")
    assert "3 processes on iPhone (darwin, T); total footprint 80 B; 1 vanished and 0 denied" in md
    lines = md.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|---"))
    assert lines[first + 1].startswith("| 1 | C |")  # sorted by footprint
    assert "FOREGROUND (10)" in md and "n\\|1" in md


# --- iOS agent output mapping ----------------------------------------------------------------------


def test_rows_from_agent() -> None:
    result = {"rows": [
        {"pid": 1, "name": "launchd", "status": "ok", "footprint": 5 << 20, "lifetime_max": 9 << 20,
         "priority": 21, "limit": None, "state": 0, "reusable": 0, "purgeable_volatile": 0,
         "purgeable_nonvolatile": 0, "graphics": 0},
        {"pid": 300, "name": "MyApp", "status": "ok", "footprint": 200 << 20, "priority": 10,
         "limit": 2048 << 20, "state": 0x80},
        {"pid": 400, "status": "vanished"},
    ]}
    rows = C.rows_from_agent(result, names={300: "My App"}, os_version="15.4")
    assert [r["name"] for r in rows] == ["launchd", "My App", None]
    assert rows[0]["band"] == "MAX" and rows[1]["band"] == "FOREGROUND"
    assert rows[1]["limit"] == 2048 << 20 and rows[1]["limit_source"] == "memorystatus"
    assert rows[2]["status"] == "vanished" and rows[2]["footprint"] is None
    assert set(rows[0]) >= {"pid", "name", "footprint", "lifetime_max", "purgeable_volatile",
                            "purgeable_nonvolatile", "reusable", "graphics", "band", "limit", "status"}


def test_rows_from_agent_on_ios_16_and_later() -> None:
    result = {"rows": [{"pid": 1, "status": "ok", "priority": 210}, {"pid": 300, "status": "ok", "priority": 100},
                       {"pid": 301, "status": "ok", "priority": 10}]}
    assert [r["band"] for r in C.rows_from_agent(result, os_version="17.4")] == ["MAX", "FOREGROUND", "AGING_BAND1"]
    # An older frida-server that does not report the OS: the priorities decide.
    assert [r["band"] for r in C.rows_from_agent(result)] == ["MAX", "FOREGROUND", "AGING_BAND1"]


class _ParamsDevice:
    def __init__(self, params: object) -> None:
        self.params = params

    def query_system_parameters(self) -> object:
        if isinstance(self.params, Exception):
            raise self.params
        return self.params


def test_device_os_version() -> None:
    assert C.device_os_version(_ParamsDevice({"os": {"id": "ios", "version": "17.5.1"}})) == "17.5.1"
    assert C.device_os_version(_ParamsDevice({"os": {"id": "ios"}})) is None
    assert C.device_os_version(_ParamsDevice(RuntimeError("not supported"))) is None


def test_census_agent_source_uses_frida17_api_only() -> None:
    src = (Path(C.__file__).parent / "agents" / "census.js").read_text()
    assert "Module.findExportByName(" not in src and "Module.getExportByName(" not in src
    assert "DEVICE-UNVERIFIED" in src
    assert "const RI_PHYS_FOOTPRINT = 72;" in src and "const RI_LIFETIME_MAX_FOOTPRINT = 240;" in src
    assert "const PRIORITY_ENTRY_SIZE = 24;" in src
