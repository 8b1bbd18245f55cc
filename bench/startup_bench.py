"""memtrace's fixed cost per run next to heaptrack's, measured in the same run (issue 21 item 6):

    python bench/startup_bench.py [repeats]      # default 5, interleaved
    python bench/startup_bench.py 5 --baseline OLD/src     # and another memtrace's src/, interleaved
    python bench/startup_bench.py 5 --no-cold              # without the cold-cache run

The target is a program that does nothing but write CLOCK_MONOTONIC at the top of main() to a file
and exit.  For each tool:

  start   from the command's exec (the bench's clock just before it starts the tool) to the
          target's main() running -- under memtrace: loaded, hooked, released from the hold;
  end     from the target's main() to the tool's command returning (the target exits at once:
          this is the drain, the symbolization and the summary);
  total   the command's wall time.

CLOCK_MONOTONIC is one clock for every process of the machine, so the difference is exact; the
machine is shared, so medians of interleaved runs.  Also printed: the CPU seconds each command used
(its own and its children's: a figure the machine's load disturbs less than wall time) and, for
memtrace, the start's steps from the capture's END record (``timing.phases``, CLOCK_MONOTONIC
stamps: the command's Python start and imports up to the capture loop, the device, the spawn and
the hold, Frida's injection, the agent's script, ``hello``, the CModule, ``init``, the unwind
tables, the hooks in, the target released) -- each the median of its time since the command's
exec.  A baseline older than those stamps shows only its totals.  memtrace runs with its caches warm (a first
untimed run fills them: the agent bundle, the compiled CModule, the unwind tables, the symbols),
which is the case the target figure (≤ 0.5 s to start, ≤ 1 s of symbolization) is about; a cold
run (empty MEMTRACE_CACHE_DIR) is printed too.  Also printed: the Python import time of the CLI and
the load average.

Python's bytecode is cached as an installed memtrace has it (pip compiles it at install): the runs
get PYTHONPYCACHEPREFIX (a folder of the bench's) and never PYTHONDONTWRITEBYTECODE, which some
environments set -- without the cache every run compiles memtrace's sources first (about 1 s here).
``--baseline SRC`` times the memtrace in SRC (a checkout's src/, e.g. ``git worktree add /tmp/old
main``) too, interleaved with this one, so a change is measured against what it changes on one
machine at one load.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  FILE *f = fopen(getenv("STARTUP_STAMP"), "w");
  if (f == NULL) return 1;
  fprintf(f, "%ld.%09ld\n", (long) ts.tv_sec, ts.tv_nsec);
  fclose(f);
  return 0;
}
"""


def python_env(tmp: Path, src: Path | None = None) -> dict[str, str]:
    """The environment of a memtrace run: bytecode cached as installed (see above); ``src``: that
    memtrace's sources instead of this one's."""
    env = {"PYTHONPYCACHEPREFIX": str(tmp / "pycache"), "PYTHONDONTWRITEBYTECODE": ""}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    return env


def memtrace_cmd(tmp: Path, probe: Path) -> list[str]:
    out = tmp / "capture"
    shutil.rmtree(out, ignore_errors=True)
    return [sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--quiet", "--out", str(out),
            "--", str(probe)]


# Frida's own floor: a Python that imports frida, spawns the probe, injects an empty script and
# resumes it -- what any Frida-based tracer pays before its own work (memtrace's start minus this
# is memtrace's).
BARE_FRIDA = """
import sys, frida
device = frida.get_local_device()
pid = device.spawn([sys.argv[1]])
session = device.attach(pid)
script = session.create_script("rpc.exports = { hello() { return Process.platform; } };")
script.load()
script.exports_sync.hello()
device.resume(pid)
import os, time
while True:         # (Frida reaps the program it spawned)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(0.005)
"""


def bare_frida_cmd(tmp: Path, probe: Path) -> list[str]:
    return [sys.executable, "-c", BARE_FRIDA, str(probe)]


def heaptrack_cmd(tmp: Path, probe: Path) -> list[str]:
    for old in tmp.glob("ht.*"):
        old.unlink()
    return ["heaptrack", "-o", str(tmp / "ht"), str(probe)]


Run = tuple[float, float, float, float, dict[str, float]]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def start_phases(capture: Path, t0: float) -> dict[str, float]:
    """The capture's END timing.phases as seconds since ``t0`` (empty: a memtrace without them)."""
    sys.path.insert(0, str(ROOT / "src"))
    from memtrace.capture import RecordType, read_records

    for record in read_records(capture):
        if record.type == RecordType.END:
            phases = (record.body.get("timing") or {}).get("phases") or {}
            return {name: at - t0 for name, at in phases.items()}
    return {}


def timed(cmd: list[str], stamp: Path, env: dict[str, str]) -> Run:
    """(start, end, total, cpu) seconds of one run of ``cmd``, and memtrace's start phases."""
    stamp.unlink(missing_ok=True)
    full = {**os.environ, **env, "STARTUP_STAMP": str(stamp)}
    if not full.get("PYTHONDONTWRITEBYTECODE"):
        full.pop("PYTHONDONTWRITEBYTECODE", None)
    cpu0 = children_cpu()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t1 = time.monotonic()
    cpu = children_cpu() - cpu0
    if proc.returncode != 0 or not stamp.exists():
        which = f" (PYTHONPATH {env['PYTHONPATH']})" if "PYTHONPATH" in env else ""
        raise SystemExit(f"{cmd[0]}{which} failed ({proc.returncode}{', the target never wrote its stamp' if not proc.returncode else ''}): "
                         f"{proc.stderr.strip()[-400:]} {_ended(cmd)}")
    t_main = float(stamp.read_text())
    phases: dict[str, float] = {}
    if "--out" in cmd:
        phases = start_phases(Path(cmd[cmd.index("--out") + 1]), t0)
        phases["target main()"] = t_main - t0
    return t_main - t0, t1 - t_main, t1 - t0, cpu, phases


def _ended(cmd: list[str]) -> str:
    """How memtrace's capture says the run ended (for a failed run)."""
    if "--out" not in cmd:
        return ""
    try:
        sys.path.insert(0, str(ROOT / "src"))
        from memtrace.capture import RecordType, read_records

        for record in read_records(Path(cmd[cmd.index("--out") + 1])):
            if record.type == RecordType.END:
                return f"END: {record.body.get('ended')}: {record.body.get('reason')}"
    except Exception as e:  # noqa: BLE001 -- a failed run's capture may be anything
        return f"(capture: {e})"
    return "(no END)"


def import_time(env: dict[str, str]) -> float:
    full = {**os.environ, **env}
    full.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import memtrace.cli"], check=True, env=full)
    return time.monotonic() - t0


def main() -> None:
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return
    baseline: Path | None = None
    if "--baseline" in args:
        at = args.index("--baseline")
        baseline = Path(args[at + 1]).resolve()
        del args[at:at + 2]
    cold_too = "--no-cold" not in args      # (a cold run takes minutes on a loaded machine)
    args = [a for a in args if a != "--no-cold"]
    repeats = int(args[0]) if args else 5
    have_heaptrack = shutil.which("heaptrack") is not None
    with tempfile.TemporaryDirectory(prefix="memtrace-startup-") as d:
        tmp = Path(d)
        probe = tmp / "probe"
        (tmp / "probe.c").write_text(PROBE_C)
        subprocess.run(["gcc", "-O2", "-o", str(probe), str(tmp / "probe.c")], check=True)
        stamp = tmp / "stamp"
        cold_cache = tmp / "cold-cache"
        warm_env = python_env(tmp)
        base_env = python_env(tmp / "base", baseline) if baseline is not None else None
        cold = timed(memtrace_cmd(tmp, probe), stamp, {**warm_env, "MEMTRACE_CACHE_DIR": str(cold_cache)}) \
            if cold_too else None
        timed(memtrace_cmd(tmp, probe), stamp, warm_env)         # fills the user's caches
        if base_env is not None:
            timed(memtrace_cmd(tmp, probe), stamp, base_env)
        runs: dict[str, list[Run]] = {"memtrace": [], "baseline": [], "bare frida": [], "heaptrack": []}
        imports = []
        for _ in range(repeats):
            runs["memtrace"].append(timed(memtrace_cmd(tmp, probe), stamp, warm_env))
            if base_env is not None:
                runs["baseline"].append(timed(memtrace_cmd(tmp, probe), stamp, base_env))
            runs["bare frida"].append(timed(bare_frida_cmd(tmp, probe), stamp, warm_env))
            if have_heaptrack:
                runs["heaptrack"].append(timed(heaptrack_cmd(tmp, probe), stamp, {}))
            imports.append(import_time(warm_env))
        if base_env is None:
            del runs["baseline"]
    print(f"fixed cost of one run, median of {repeats} (seconds; target: memtrace start <= 0.5, end <= 1); "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'tool':10} {'start':>7} {'end':>7} {'total':>7} {'cpu':>7}" + (f"   (baseline: {baseline})" if baseline else ""))
    for tool, rows in runs.items():
        if not rows:
            print(f"{tool:10} (not installed)")
            continue
        start, end, total, cpu = (statistics.median(float(r[i]) for r in rows) for i in range(4))
        lo, hi = min(r[0] for r in rows), max(r[0] for r in rows)
        print(f"{tool:10} {start:7.2f} {end:7.2f} {total:7.2f} {cpu:7.2f}   start range {lo:.2f}-{hi:.2f}")
    print_phases(runs)
    if cold is not None:
        print(f"{'memtrace, cold caches':22} start {cold[0]:.2f} end {cold[1]:.2f} total {cold[2]:.2f}")
    print(f"python -c 'import memtrace.cli': {statistics.median(imports):.2f} s (part of memtrace's start)")
    if runs["heaptrack"]:
        m = statistics.median(r[0] for r in runs["memtrace"])
        h = statistics.median(r[0] for r in runs["heaptrack"])
        print(f"start ratio memtrace/heaptrack: {m / h:.1f}x")
    m = statistics.median(r[0] for r in runs["memtrace"])
    f = statistics.median(r[0] for r in runs["bare frida"])
    print(f"memtrace's start beyond bare Frida's (spawn, inject, an empty script, resume): {m - f:+.2f} s")


def print_phases(runs: dict[str, list[Run]]) -> None:
    """Each start step's median time since the command's exec, and the step's own median length."""
    tools = [t for t in ("memtrace", "baseline") if any(r[4] for r in runs.get(t, []))]
    if not tools:
        return
    names = sorted({n for t in tools for r in runs[t] for n in r[4]},
                   key=lambda n: statistics.median(r[4][n] for r in runs[tools[0]] if n in r[4])
                   if any(n in r[4] for r in runs[tools[0]]) else float("inf"))
    print("start steps (seconds since the command's exec, median; + the step itself):")
    print(f"  {'step':24}" + "".join(f" {t:>17}" for t in tools))
    for name in names:
        cells = []
        for t in tools:
            at = [r[4][name] for r in runs[t] if name in r[4]]
            own = []
            for r in runs[t]:
                if name in r[4]:
                    before = [v for v in r[4].values() if v < r[4][name]]
                    own.append(r[4][name] - max(before, default=0.0))
            cells.append(f"{statistics.median(at):7.3f} +{statistics.median(own):6.3f}  " if at else f"{'—':>17}")
        print(f"  {name:24}" + "".join(f" {c:>17}" for c in cells))


if __name__ == "__main__":
    main()
