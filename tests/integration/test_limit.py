"""``memtrace limit`` on real Linux processes whose rlimits / cgroup the test sets."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.children import wait_exit

from memtrace import census as C
from memtrace.limit import linux_sample, watch_series

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")

MIB = 1024 * 1024
SLEEPER = "import sys, time; print('ready', flush=True); time.sleep(600)"
# Grows by 8 MiB per line read on stdin, so the test decides when the footprint moves.
GROWER = ("import sys\nchunks = []\nprint('ready', flush=True)\nfor _ in sys.stdin:\n"
          "    chunks.append(bytearray(8 * 1024 * 1024)); chunks[-1][::4096] = b'x' * (8 * 256)\n"
          "    print('grown', flush=True)\n")


def _spawn(code: str, preexec: object = None) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         preexec_fn=preexec)  # type: ignore[arg-type]
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


@pytest.fixture()
def rlimited() -> Iterator[tuple[subprocess.Popen[str], int]]:
    limit = 1536 * MIB

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))

    p = _spawn(SLEEPER, preexec)
    yield p, limit
    p.kill()
    p.wait()


def test_rlimit_as_is_reported_and_binding(rlimited: tuple[subprocess.Popen[str], int]) -> None:
    proc, limit = rlimited
    doc = linux_sample(proc.pid)
    bounds = {b["name"]: b for b in doc["bounds"]}
    assert bounds["RLIMIT_AS"]["limit"] == limit
    vm_size = C.parse_kb_fields(Path(f"/proc/{proc.pid}/status").read_text())["VmSize"]
    assert bounds["RLIMIT_AS"]["available"] == limit - vm_size
    mem_available = C.parse_kb_fields(Path("/proc/meminfo").read_text())["MemAvailable"]
    if mem_available > limit:
        assert doc["binding"] == "RLIMIT_AS"
        assert doc["limit"] == doc["footprint"] + limit - vm_size
    assert "RLIMIT_DATA" not in bounds  # unlimited bounds are not listed


def test_cli_limit_json(rlimited: tuple[subprocess.Popen[str], int]) -> None:
    proc, limit = rlimited
    src = str(Path(__file__).resolve().parents[2] / "src")
    res = subprocess.run([sys.executable, "-m", "memtrace.cli", "limit", "--pid", str(proc.pid), "--device",
                          "local", "--json"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": src})
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["kind"] == "limit" and doc["pid"] == proc.pid
    assert {b["name"]: b["limit"] for b in doc["bounds"]}["RLIMIT_AS"] == limit


def test_watch_series_follows_growth() -> None:
    p = _spawn(GROWER)
    assert p.stdin is not None and p.stdout is not None
    try:
        grown = 0

        def sample() -> dict[str, object]:
            nonlocal grown
            s = linux_sample(p.pid)
            if grown < 3:  # grow between samples: the series must show each step
                p.stdin.write("\n")
                p.stdin.flush()
                assert p.stdout.readline().strip() == "grown"
                grown += 1
            return s

        series: list[dict[str, object]] = []
        stopped = None
        for _ in range(4):
            part, stopped = watch_series(sample, seconds=0, interval=0.01)
            series.extend(part)
        assert stopped is None
        footprints = [s["footprint"] for s in series]
        steps = [b - a for a, b in zip(footprints, footprints[1:], strict=False)]
        assert len(steps) == 3
        assert all(7 * MIB <= d <= 9 * MIB for d in steps), steps
        assert all(s["limit"] is not None and s["available"] is not None for s in series)
    finally:
        p.kill()
        p.wait()


def test_watch_stops_when_the_process_exits() -> None:
    p = _spawn(SLEEPER)
    calls = 0

    def sample() -> dict[str, object]:
        nonlocal calls
        calls += 1
        if calls == 3:
            p.kill()
            p.wait()
        return linux_sample(p.pid)

    series, stopped = watch_series(sample, seconds=60, interval=0.01)
    assert len(series) == 2
    assert stopped is not None and f"pid {p.pid}" in stopped


def _own_memory_cgroup() -> tuple[Path, int] | None:
    """A directory we may create a child cgroup in, and the cgroup version."""
    cgroups = C.parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    for mount in sorted(C.parse_mountinfo(Path("/proc/self/mountinfo").read_text()), key=lambda m: -m.version):
        path = cgroups.get(mount.version)
        if path is None:
            continue
        d = C._cgroup_dir(mount, path)
        limit_file = "memory.max" if mount.version == 2 else "memory.limit_in_bytes"
        if d is not None and (d / limit_file).exists() and os.access(d, os.W_OK):
            return d, mount.version
    return None


@pytest.fixture()
def cgrouped() -> Iterator[tuple[subprocess.Popen[str], int]]:
    own = _own_memory_cgroup()
    if own is None:
        pytest.skip("no writable memory cgroup")
    parent, version = own
    child = parent / f"memtrace-test-{os.getpid()}"
    limit = 300 * MIB
    try:
        child.mkdir()
        (child / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(str(limit))
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup: {e}")
    p = _spawn(SLEEPER)
    try:
        (child / "cgroup.procs").write_text(str(p.pid))
        yield p, limit
    finally:
        p.kill()
        p.wait()
        child.rmdir()


def test_cgroup_limit_is_reported_and_binding(cgrouped: tuple[subprocess.Popen[str], int]) -> None:
    proc, limit = cgrouped
    doc = linux_sample(proc.pid)
    bounds = {b["name"]: b for b in doc["bounds"]}
    assert bounds["cgroup"]["limit"] == limit
    # v1 does not move existing charges with the process (move_charge_at_immigrate=0): usage may be 0.
    assert 0 <= bounds["cgroup"]["used"] < limit
    assert bounds["cgroup"]["available"] == limit - bounds["cgroup"]["used"]
    assert doc["binding"] == "cgroup"
    row = C.LinuxScanner().row(proc.pid)
    assert row is not None and row["limit"] == limit and row["limit_source"].startswith("cgroup v")


# --- the iOS agent on the Darwin stand-in ----------------------------------------------------------


def test_limit_agent_pressure_source_and_available_memory_on_the_stand_in(compile_c, demo_bin: Path) -> None:
    """The limit agent's own DISPATCH_SOURCE_TYPE_MEMORYPRESSURE source sees WARN, CRITICAL and the
    proc-limit notes, which libdispatch (iOS 17/18) never forwards to malloc_memory_event_handler
    (registered for MSL status only, as the stand-in does); os_proc_available_memory's 0 of an
    unmanaged process is passed on as it is, for the host to weigh with root's limits."""
    import frida

    from memtrace.frida_host import load_agent

    darwin = Path(__file__).resolve().parents[2] / "demo" / "darwin"
    prog = compile_c("standin_limit", "-I", str(darwin), "-L", str(demo_bin), "-lmtmalloc", "-lmtdarwin",
                     f"-Wl,-rpath,{demo_bin}")
    p = subprocess.Popen([str(prog)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdin is not None and p.stdout.readline().strip() == "ready"

    def say(line: str) -> list[str]:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(line + "\n")
        p.stdin.flush()
        out = []
        while (reply := p.stdout.readline().strip()) != "ok":
            out.append(reply)
        return out

    events: list[dict] = []
    session, script = load_agent(frida.get_local_device(), p.pid, "limit")
    script.on("message", lambda m, d: events.append(m["payload"]) if m.get("type") == "send" else None)
    try:
        api = script.exports_sync
        first = api.sample()
        assert first["footprint"] == 8 * MIB and first["available"] == 0      # unmanaged: 0
        say(f"limit {64 * MIB} 1")
        assert api.sample()["available"] == 56 * MIB                          # managed: the room left
        assert api.watch() == ["dispatch_source(warn|critical|proc-limit-warn|proc-limit-critical)",
                               "malloc_memory_event_handler"]
        for note in ("warn", "critical", "proc-limit-warn", "msl"):
            say(note)
        time_limit = time.monotonic() + 5
        while len(events) < 4 and time.monotonic() < time_limit:
            time.sleep(0.05)
        got = [(e["via"], e["event"], e["bits"]) for e in events]
        assert got == [("dispatch_source", "warn", 2), ("dispatch_source", "critical", 4),
                       ("dispatch_source", "proc-limit-warn", 16),
                       ("malloc_memory_event_handler", "0x10000000", 0x10000000)]
        assert all(e["footprint"] == 8 * MIB and e["available"] == 56 * MIB for e in events)
        # libmalloc's handler saw only the MSL note: the agent's own source is what sees the rest.
        assert say("events") == ["events 1 0x10000000"]
        assert api.unwatch() is True
        say("warn")
        time.sleep(0.2)
        assert len(events) == 4          # cancelled: nothing more
    finally:
        script.unload()
        session.detach()
        p.stdin.close()
        wait_exit(p, 10)        # (Frida's uninjection may still be at work: see exit_of)
