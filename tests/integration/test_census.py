"""Census on the local Linux device against real processes the test starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memtrace import census as C

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")

MIB = 1024 * 1024
TOUCHER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    size_t n = (size_t)atol(argv[1]) * 1024 * 1024;
    char *p = malloc(n);
    if (!p) return 1;
    memset(p, 1, n);            /* touch every page so it is resident anonymous memory */
    printf("ready\n");
    fflush(stdout);
    pause();
    return p[n - 1];
}
"""
PY_TOUCHER = ("import sys, time; b = bytearray(48 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); "
              "print('ready', flush=True); time.sleep(600)")


def _src_env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture(scope="module")
def toucher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("toucher")
    (d / "toucher.c").write_text(TOUCHER_C)
    subprocess.run([cc, "-O0", "-o", str(d / "toucher"), str(d / "toucher.c")], check=True)
    return d / "toucher"


def _start(argv: list[str]) -> subprocess.Popen[str]:
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


@pytest.fixture()
def heavy(toucher: Path) -> Iterator[list[subprocess.Popen[str]]]:
    procs = [_start([str(toucher), "64"]), _start([str(toucher), "32"]), _start([sys.executable, "-c", PY_TOUCHER])]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _proc_footprint(pid: int) -> int:
    fields = C.parse_kb_fields(Path(f"/proc/{pid}/status").read_text())
    return fields["RssAnon"] + fields.get("VmSwap", 0)


def test_census_lists_started_processes_with_footprint_within_5_percent(
        heavy: list[subprocess.Popen[str]]) -> None:
    doc = C.census_linux()
    by_pid = {r["pid"]: r for r in doc["rows"]}
    for p, touched in zip(heavy, (64 * MIB, 32 * MIB, 48 * MIB), strict=True):
        row = by_pid[p.pid]
        assert row["status"] == "ok"
        reference = _proc_footprint(p.pid)
        deviation = abs(row["footprint"] - reference) / reference
        print(f"pid {p.pid} {row['name']}: census {row['footprint']} /proc {reference} "
              f"deviation {deviation:.4%}")
        assert deviation <= 0.05
        # ... and the footprint is the memory the program touched, plus a small runtime baseline.
        assert touched <= row["footprint"] <= touched * 1.05 + 16 * MIB
        assert row["lifetime_max"] >= row["footprint"] - row["swap"]
        assert row["priority"] == int(Path(f"/proc/{p.pid}/oom_score_adj").read_text())
    assert doc["totals"]["footprint"] >= (64 + 32 + 48) * MIB
    assert by_pid[heavy[0].pid]["name"] == "toucher"


def test_c_toucher_footprint_is_64_mib(heavy: list[subprocess.Popen[str]]) -> None:
    row = C.LinuxScanner().row(heavy[0].pid)
    assert row is not None
    deviation = abs(row["footprint"] - 64 * MIB) / (64 * MIB)
    print(f"toucher 64 MiB: footprint {row['footprint']} deviation {deviation:.4%}")
    assert deviation <= 0.05


@pytest.mark.slow
def test_census_survives_processes_exiting_during_the_scan(heavy: list[subprocess.Popen[str]]) -> None:
    stop = threading.Event()
    spawned = 0

    def churn() -> None:
        nonlocal spawned
        while not stop.is_set():
            batch = [subprocess.Popen(["/bin/sh", "-c", "exit 0"]) for _ in range(8)]
            spawned += len(batch)
            for p in batch:
                p.wait()

    workers = [threading.Thread(target=churn) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        statuses: set[str] = set()
        for _ in range(30):
            rows, _ = C.LinuxScanner().scan()
            statuses.update(r["status"] for r in rows)
            assert {p.pid for p in heavy} <= {r["pid"] for r in rows}
            for r in rows:
                assert r["status"] in ("ok", "partial", "denied", "vanished")
                if r["status"] == "ok":
                    assert isinstance(r["footprint"], int)
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert spawned > 30
    print(f"{spawned} short-lived processes during 30 scans; statuses seen: {sorted(statuses)}")


def test_cli_census_json_and_out_file(heavy: list[subprocess.Popen[str]], tmp_path: Path) -> None:
    out = tmp_path / "report" / "census-1.json"
    res = subprocess.run([sys.executable, "-m", "memtrace.cli", "census", "--device", "local", "--json",
                          "--out", str(out), "--sort", "pid"], capture_output=True, text=True, env=_src_env(),
                         timeout=60)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["kind"] == "census" and doc["platform"] == "linux"
    pids = [r["pid"] for r in doc["rows"]]
    assert pids == sorted(pids)
    assert {p.pid for p in heavy} <= set(pids)
    saved = json.loads(out.read_text())
    assert saved["kind"] == "census" and len(saved["rows"]) > 0


def test_cli_census_table(heavy: list[subprocess.Popen[str]]) -> None:
    res = subprocess.run([sys.executable, "-m", "memtrace.cli", "census", "--device", "local", "--all"],
                         capture_output=True, text=True, env={**_src_env(), "COLUMNS": "200"}, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "toucher" in res.stdout and "total" in res.stdout


@pytest.mark.smoke
def test_census_agent_loads_in_frida17_on_linux() -> None:
    # The Darwin agent cannot measure anything on Linux, but it must load under Frida 17 and
    # report the missing Darwin exports instead of failing.
    frida = pytest.importorskip("frida")
    device = frida.get_local_device()
    from memtrace.frida_host import load_agent

    session, script = load_agent(device, 0, "census")
    try:
        result = script.exports_sync.census()
    finally:
        script.unload()
        session.detach()
    assert result["rows"] == []
    assert result["errors"] == {"proc_listallpids": "not exported", "memorystatus_control": "not exported"}
