"""JetsamEvent parsing, aggregation, rendering, the CLI, and --pull through a fake CrashReportsManager."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymobiledevice3.services.crash_reports import CrashReportsManager

from memtrace import ios
from memtrace.analyze import jetsam as J
from memtrace.commands.jetsam import command as jetsam_command

DATA = Path(__file__).resolve().parent.parent / "data" / "jetsam"
SEED_A = DATA / "JetsamEvent-2020-03-19-172345.ips"
SEED_B = DATA / "JetsamEvent-2020-03-19-173028.ips"
PAGE = 16384


# --- the two sample reports in tests/data/jetsam -----------------------------------------------


def test_seed_sample_a_killed_process_and_figures() -> None:
    r = J.parse_report(SEED_A.read_text(encoding="utf-8"), str(SEED_A))
    assert r.product == "iPhone8,2"
    assert r.os_version == "iPhone OS 13.3.1 (17D50)"
    assert r.timestamp == "2020-03-19 17:23:45.94 +0800"
    assert r.incident == "DA8AF66D-24E8-458C-8734-981866942168"
    assert r.page_size == PAGE and not r.page_size_assumed
    assert r.largest_process == "Test"
    assert [p.name for p in r.processes] == ["com.apple.Safari.SafeBrowsing.Se", "Test"]
    (killed,) = r.killed
    assert (killed.pid, killed.name, killed.reason) == (2384, "Test", "per-process-limit")
    assert killed.footprint == 92806 * PAGE
    assert killed.kill_delta == 2592
    assert killed.states == ["frontmost"]
    assert r.memory_pages["anonymous"] == 37140 and r.memory_pages["free"] == 2967
    assert r.memory_status["zoneMapCap"] == 744407040
    assert r.top(1)[0].name == "Test"


def test_seed_sample_b_unicode_process_name() -> None:
    r = J.parse_report(SEED_B.read_text(encoding="utf-8"), str(SEED_B))
    assert r.product == "iPhone12,3"
    (killed,) = r.killed
    assert killed.name == "杭城小刘" and killed.pid == 14206
    assert killed.footprint == 134278 * PAGE and killed.kill_delta == 4345
    assert r.processes[0].name == "wcd" and r.processes[0].lifetime_max == 171 * PAGE


def test_seed_samples_keep_their_comment_lines() -> None:
    # Published samples, verbatim (docs/domain/jetsam.md): the parser must cope with the "// ..." lines.
    for path in (SEED_A, SEED_B):
        text = path.read_text(encoding="utf-8")
        assert text.startswith('{"bug_type":"298"')
        assert "  // ...\n" in text


def test_aggregate_seed_limit_per_model() -> None:
    reports = [J.parse_report(p.read_text(encoding="utf-8"), str(p)) for p in (SEED_A, SEED_B)]
    agg = J.aggregate(reports)
    assert agg["kind"] == "jetsam" and agg["version"] == J.FORMAT_VERSION
    assert agg["totals"] == {"reports": 2, "skipped": 0, "kills": 2}
    assert agg["kills_by_reason"] == {"per-process-limit": 2}
    by_model = {row["product"]: row for row in agg["limit_by_model"]}
    assert by_model["iPhone8,2"]["footprint_max"] == 92806 * PAGE
    assert by_model["iPhone12,3"]["footprint_median"] == 134278 * PAGE
    assert by_model["iPhone8,2"]["processes"] == {"Test": 1}
    json.dumps(agg)  # the document must be JSON-serialisable as is


# --- reports written in the shapes of several iOS versions ---------------------------------------


def make_report(style: str, *, product: str = "iPhone10,6", killed_rpages: int = 90000,
                reason: str = "per-process-limit", name: str = "App") -> str:
    """A JetsamEvent in the field layout of a given iOS generation."""
    idle = {"pid": 101, "name": "daemonA", "rpages": 300, "lifetimeMax": 310, "states": ["daemon", "idle"],
            "fds": 20, "purgeable": 0, "coalition": 50, "uuid": "00000000-0000-0000-0000-000000000001"}
    victim: dict[str, Any] = {"pid": 202, "name": name, "rpages": killed_rpages, "lifetimeMax": killed_rpages,
                              "states": ["frontmost", "resume"], "reason": reason, "killDelta": 1234,
                              "fds": 60, "purgeable": 3, "age": 999, "cpuTime": 1.5}
    status: dict[str, Any] = {"compressorSize": 1000, "pageSize": PAGE, "uncompressed": 5000,
                              "zoneMapSize": 100, "zoneMapCap": 1000,
                              "memoryPages": {"active": 10, "wired": 20, "free": 30, "anonymous": 40}}
    header: dict[str, Any] | None = {"bug_type": "298", "timestamp": "2021-01-01 00:00:00.00 +0000",
                                     "os_version": "iPhone OS 14.4 (18D52)", "incident_id": "X"}
    body: dict[str, Any] = {"product": product, "build": "iPhone OS 14.4 (18D52)", "largestProcess": name,
                            "genCounter": 0, "memoryStatus": status}
    if style == "ios10":  # no one-line header, no pageSize, no genCounter
        header = None
        del status["pageSize"]
        del body["genCounter"]
        body["build"] = "iPhone OS 10.3.3 (14G60)"
    elif style == "ios12":  # header; no priority
        header["os_version"] = body["build"] = "iPhone OS 12.4 (16G77)"
    elif style == "ios15":  # priority, physicalPages, the odd "freeze_skip_reason:" key
        header["os_version"] = body["build"] = "iPhone OS 15.6 (19G71)"
        for p, prio in ((idle, 0), (victim, 10)):
            p["priority"] = prio
            p["physicalPages"] = {"internal": [p["rpages"] - 5, 5]}
            p["freeze_skip_reason:"] = "none"
        status["memoryPressure"] = False
    elif style == "ios17":  # header gains fields, body gains memoryStatus and top-level novelties
        header.update({"os_version": "iPhone OS 17.2 (21C62)", "roots_installed": 0, "name": "JetsamEvent"})
        body["build"] = "iPhone OS 17.2 (21C62)"
        for p, prio in ((idle, 0), (victim, 10)):
            p["priority"] = prio
            p["physicalPages"] = {"internal": [p["rpages"], 0]}
            p["csFlags"] = 0
        status["memoryPressureDetails"] = {"pagesReclaimed": 1}
        body["visibilityEndpoint"] = ["x"]
    body["processes"] = [idle, victim]
    text = json.dumps(body, indent=2)
    return text if header is None else json.dumps(header) + "\n" + text


@pytest.mark.parametrize("style", ["ios10", "ios12", "ios15", "ios17"])
def test_versions_parse_to_the_same_kill(style: str) -> None:
    r = J.parse_report(make_report(style), f"{style}.ips")
    (killed,) = r.killed
    assert killed.name == "App" and killed.reason == "per-process-limit"
    assert killed.footprint == 90000 * PAGE
    assert r.page_size_assumed == (style == "ios10")
    assert r.product == "iPhone10,6"
    if style in ("ios15", "ios17"):
        assert killed.priority == 10 and killed.physical_pages is not None
    else:
        assert killed.priority is None and killed.physical_pages is None


def test_version_of_os_from_header_or_build() -> None:
    assert J.parse_report(make_report("ios10"), "a").os_version == "iPhone OS 10.3.3 (14G60)"
    assert J.parse_report(make_report("ios17"), "b").os_version == "iPhone OS 17.2 (21C62)"


def test_aggregate_across_versions_and_models() -> None:
    reports = [J.parse_report(make_report("ios12", product="iPhone10,6", killed_rpages=n), f"r{n}")
               for n in (80000, 90000, 100000)]
    reports.append(J.parse_report(make_report("ios15", product="iPhone14,2", reason="vm-pageshortage",
                                              name="Other"), "p"))
    agg = J.aggregate(reports, skipped=[("bad.ips", "bad.ips: not JSON")])
    assert agg["totals"] == {"reports": 4, "skipped": 1, "kills": 4}
    assert agg["kills_by_reason"] == {"per-process-limit": 3, "vm-pageshortage": 1}
    (row,) = agg["limit_by_model"]  # vm-pageshortage kills say nothing about a per-process limit
    assert row["product"] == "iPhone10,6" and row["kills"] == 3
    assert (row["footprint_min"], row["footprint_median"], row["footprint_max"]) == (
        80000 * PAGE, 90000 * PAGE, 100000 * PAGE)
    assert agg["kills_by_process"][0] == {"name": "App", "kills": 3, "reasons": {"per-process-limit": 3},
                                          "max_footprint": 100000 * PAGE}
    assert agg["skipped"] == [{"source": "bad.ips", "reason": "bad.ips: not JSON"}]


# --- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, fragment", [
    ("", "empty file"),
    ('{"bug_type":"309","os_version":"x"}\n{"processes": []}', "bug_type 309"),
    ('{"bug_type":"298"}\n[1, 2]', "not an object"),
    ('{"bug_type":"298"}\n{"product": "x"}', "no 'processes' list"),
    ('{"bug_type":"298"}\n{"processes": [', "not valid JSON"),
    ("[" * 100000 + "]" * 100000, "report"),
])
def test_malformed_reports_raise_one_line_error(text: str, fragment: str) -> None:
    with pytest.raises(J.JetsamParseError) as info:
        J.parse_report(text, "some/JetsamEvent-1.ips")
    message = str(info.value)
    assert message.startswith("some/JetsamEvent-1.ips: ")
    assert fragment in message
    assert "\n" not in message


def test_strings_with_comment_markers_survive_cleaning() -> None:
    text = ('{"bug_type":"298"}\n{"product": "http://x,]", "processes": [\n'
            ' {"pid": 1, "name": "a//b", "rpages": 1},\n // a comment\n]}')
    r = J.parse_report(text, "c")
    assert r.product == "http://x,]" and r.processes[0].name == "a//b"


def test_odd_values_are_tolerated() -> None:
    body = {"memoryStatus": {"pageSize": "4096", "memoryPages": {"free": "12", "x": [1]}},
            "processes": [1, "x", {"pid": True, "rpages": -5, "name": 7, "states": "frontmost",
                                   "reason": "", "killDelta": 1e400}, {}]}
    r = J.parse_report(json.dumps(body), "odd")
    assert r.page_size == 4096 and r.memory_pages == {"free": 12}
    assert r.ignored_entries == 2
    first = r.processes[0]
    assert first.pid is None and first.rpages is None and first.footprint is None
    assert first.name == "7" and first.states == [] and first.reason is None
    assert r.killed == []


# --- fuzz ------------------------------------------------------------------------------------------


SEED_TEXTS = [SEED_A.read_text(encoding="utf-8"), SEED_B.read_text(encoding="utf-8"),
              make_report("ios10"), make_report("ios17")]


def _check_parse(text: str) -> None:
    try:
        r = J.parse_report(text, "fuzz.ips")
    except J.JetsamParseError as e:
        assert str(e).startswith("fuzz.ips: ") and "\n" not in str(e)
        return
    json.dumps(J.aggregate([r]))  # anything parsed must aggregate and serialise


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.sampled_from(SEED_TEXTS), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 40),
                                                        st.text(max_size=8)), max_size=6))
def test_fuzz_text_mutations(base: str, edits: list[tuple[int, int, str]]) -> None:
    text = base
    for pos, cut, insert in edits:
        pos %= len(text) + 1
        text = text[:pos] + insert + text[pos + cut:]
    _check_parse(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)


@pytest.mark.slow
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.sampled_from(["ios12", "ios15", "ios17"]), st.data())
def test_fuzz_structural_mutations(style: str, data: st.DataObject) -> None:
    header_line, _, body_text = make_report(style).partition("\n")
    body = json.loads(body_text)
    targets = [body, body["memoryStatus"], body["memoryStatus"]["memoryPages"], *body["processes"]]
    for _ in range(data.draw(st.integers(1, 6))):
        target = data.draw(st.sampled_from(targets))
        key = data.draw(st.sampled_from(sorted(target) + ["new"]))
        if data.draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = data.draw(json_values)
    _check_parse(header_line + "\n" + json.dumps(body))


# --- rendering and the command -----------------------------------------------------------------


def test_render_markdown_has_chapter_and_tables() -> None:
    reports = [J.parse_report(p.read_text(encoding="utf-8"), str(p)) for p in (SEED_A, SEED_B)]
    md = J.render_markdown(J.aggregate(reports, skipped=[("x|y.ips", "x|y.ips: broken")]))
    assert md.startswith("## Jetsam\n")
    assert "| iPhone8,2 | iPhone OS 13.3.1 (17D50) | 1 | 1.42 GB |" in md
    assert "x\\|y.ips" in md  # pipes in cells are escaped
    assert "### Kills by reason" in md and "| per-process-limit | 2 |" in md


def test_render_markdown_empty() -> None:
    md = J.render_markdown(J.aggregate([]))
    assert md.startswith("## Jetsam\n") and "0 JetsamEvent report(s), 0 kill(s)." in md


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(jetsam_command, args, standalone_mode=False, catch_exceptions=True)


def test_cli_folder_json_and_out_json(tmp_path: Path) -> None:
    out = tmp_path / "report" / "jetsam-1.json"
    res = _invoke([str(DATA), "--json", "--out-json", str(out)])
    assert res.exception is None, res.output
    assert res.return_value == 0
    doc = json.loads(res.stdout)
    assert doc["kind"] == "jetsam" and doc["totals"]["kills"] == 2
    assert json.loads(out.read_text(encoding="utf-8")) == doc
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp file left behind


def test_cli_skips_malformed_with_nonzero_exit(tmp_path: Path) -> None:
    bad = tmp_path / "JetsamEvent-broken.ips"
    bad.write_text('{"bug_type":"298"}\n{"processes": [', encoding="utf-8")
    res = _invoke([str(bad), str(SEED_A), "--json"])
    assert res.exception is None
    assert res.return_value == 1
    assert f"memtrace: skipped {bad}: report body is not valid JSON" in res.stderr
    doc = json.loads(res.stdout)
    assert doc["totals"] == {"reports": 1, "skipped": 1, "kills": 1}


def test_cli_no_reports_is_an_error(tmp_path: Path) -> None:
    res = _invoke([str(tmp_path)])
    assert isinstance(res.exception, J.InputError)
    assert "no JetsamEvent reports" in str(res.exception)


# --- --pull through a fake CrashReportsManager -------------------------------------------------


class FakeLockdown:
    def __init__(self) -> None:
        self.closed = False

    async def __aenter__(self) -> FakeLockdown:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.closed = True


class FakeCrashReportsManager:
    """Mirrors pymobiledevice3 11.x: async ctx manager, ``flush()``, ``ls(path, depth)``,
    ``pull(out, entry, ...)``; every call is recorded and held to the real signatures."""

    files = {
        "/JetsamEvent-2020-03-19-172345.ips": SEED_A.read_bytes(),
        "/Retired/JetsamEvent-2020-03-19-173028.ips": SEED_B.read_bytes(),
        "/MyApp-2020-03-19-1.ips": b"{}",
    }

    def __init__(self, lockdown: FakeLockdown) -> None:
        self.lockdown = lockdown
        self.pulled: list[str] = []
        self.closed = False
        self.calls: list[tuple[str, tuple, dict]] = []

    async def flush(self, *args: object, **kwargs: object) -> None:
        self.calls.append(("flush", args, kwargs))

    async def __aenter__(self) -> FakeCrashReportsManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.closed = True

    async def ls(self, *args: object, **kwargs: object) -> list[str]:
        self.calls.append(("ls", args, kwargs))
        return ["/Retired", *self.files]

    async def pull(self, *args: object, **kwargs: object) -> None:
        self.calls.append(("pull", args, kwargs))
        bound = inspect.signature(CrashReportsManager.pull).bind(self, *args, **kwargs)
        bound.apply_defaults()
        out, entry, erase = bound.arguments["out"], bound.arguments["entry"], bound.arguments["erase"]
        assert not erase
        self.pulled.append(entry)
        (Path(out) / entry.rsplit("/", 1)[-1]).write_bytes(self.files[entry])


def test_pull_copies_only_jetsam_reports(tmp_path: Path) -> None:
    made: list[FakeCrashReportsManager] = []
    lockdown = FakeLockdown()

    async def lockdown_factory(target: ios.DeviceTarget) -> FakeLockdown:
        assert target.udid == "abc"
        return lockdown

    def manager_factory(ld: FakeLockdown) -> FakeCrashReportsManager:
        made.append(FakeCrashReportsManager(ld))
        return made[-1]

    paths = ios.pull_jetsam_reports(ios.DeviceTarget(udid="abc"), tmp_path / "out",
                                    lockdown_factory=lockdown_factory, manager_factory=manager_factory)
    assert sorted(p.name for p in paths) == ["JetsamEvent-2020-03-19-172345.ips",
                                             "JetsamEvent-2020-03-19-173028.ips"]
    assert "/MyApp-2020-03-19-1.ips" not in made[0].pulled
    assert made[0].closed and lockdown.closed
    # Pending reports flushed into the folder before it is listed; every call fits pymobiledevice3's own.
    assert [c[0] for c in made[0].calls][:2] == ["flush", "ls"]
    for name, args, kwargs in made[0].calls:
        inspect.signature(getattr(CrashReportsManager, name)).bind(made[0], *args, **kwargs)


def test_pull_errors_become_one_line_target_errors(tmp_path: Path) -> None:
    async def no_device(target: ios.DeviceTarget) -> FakeLockdown:
        raise ConnectionError("No device connected\nsecond line")

    with pytest.raises(ios.TargetError) as info:
        ios.pull_jetsam_reports(ios.DeviceTarget(), tmp_path, lockdown_factory=no_device)
    assert str(info.value) == "cannot pull crash reports from usb: No device connected"


def test_cli_pull_parses_pulled_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def lockdown_factory(target: ios.DeviceTarget) -> FakeLockdown:
        assert (target.host, target.port) == ("10.0.0.2", None)
        return FakeLockdown()

    monkeypatch.setattr(ios, "_default_lockdown", lockdown_factory)
    monkeypatch.setattr(ios, "_default_manager", FakeCrashReportsManager)
    res = _invoke(["--pull", "--device", "remote:10.0.0.2", "--out", str(tmp_path / "pulled"), "--json"])
    assert res.exception is None, res.output
    doc = json.loads(res.stdout)
    assert doc["totals"]["reports"] == 2
    assert {r["product"] for r in doc["reports"]} == {"iPhone8,2", "iPhone12,3"}
    assert (tmp_path / "pulled" / "JetsamEvent-2020-03-19-172345.ips").read_bytes() == SEED_A.read_bytes()


def test_cli_pull_refuses_local_device() -> None:
    res = _invoke(["--pull", "--device", "local"])
    assert isinstance(res.exception, J.InputError) and "--pull needs an iOS device" in str(res.exception)


def test_a_folder_without_reports_is_named(tmp_path: Path) -> None:
    from tests.conftest import run_memtrace

    (tmp_path / "notes.txt").write_text("not a report")
    proc = run_memtrace("jetsam", tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"memtrace: error: no JetsamEvent reports (JetsamEvent*.ips) in {tmp_path}"


def test_a_device_that_stops_answering_mid_pull_ends_in_one_line(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every crash-report call is bounded: a listing that never answers is a one-line error."""
    import asyncio

    class Hanging(FakeCrashReportsManager):
        async def ls(self, *args: object, **kwargs: object) -> list[str]:
            await asyncio.sleep(3600)
            return []

    async def lockdown_factory(target: ios.DeviceTarget) -> FakeLockdown:
        return FakeLockdown()

    from memtrace import launchers

    monkeypatch.setitem(launchers.PMD3_TIMEOUTS, "lockdown", 0.2)
    with pytest.raises(ios.TargetError, match=r"^pymobiledevice3: listing crash reports did not answer "
                                              r"within 0.2 s"):
        ios.pull_jetsam_reports(ios.DeviceTarget(), tmp_path, lockdown_factory=lockdown_factory,
                                manager_factory=Hanging)
