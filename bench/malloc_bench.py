"""ns per malloc/free pair of a frame-pointer-built C program, under each way of watching it.

Everything is measured in one run on this machine and printed as ratios against native, since
absolute numbers on shared machines are noise.  Usage: python bench/malloc_bench.py [pairs] [repeats]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import frida

ROOT = Path(__file__).resolve().parent.parent
JS_COUNTER = """
let n = 0;
for (const name of ['malloc', 'free']) {
  const m = Process.enumerateModules().find(x => /^libc[.-]/.test(x.name));
  Interceptor.attach(m.getExportByName(name), { onEnter() { n++; } });
}
rpc.exports = { count() { return n; } };
"""


def build(tmp: Path) -> Path:
    exe = tmp / "alloc_loop"
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-rdynamic",
                    "-o", str(exe), str(ROOT / "bench" / "alloc_loop.c")], check=True)
    return exe


def parse(text: str) -> float:
    m = re.search(r"ns_per_pair ([\d.]+)", text)
    if not m:
        raise RuntimeError(f"no timing in output: {text[-500:]}")
    return float(m.group(1))


def native(exe: Path, n: int) -> float:
    return parse(subprocess.run([str(exe), str(n)], capture_output=True, text=True, check=True).stdout)


def memtrace(exe: Path, n: int, tmp: Path, *opts: str) -> tuple[float, dict]:
    out = Path(tempfile.mkdtemp(dir=tmp))
    proc = subprocess.run([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--json",
                           "--window", "600", "--out", str(out / "cap"), *opts, "--", str(exe), str(n)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    summary = json.loads(proc.stdout)
    return parse(proc.stderr), summary


def js_counter(exe: Path, n: int) -> float:
    device = frida.get_local_device()
    pid = device.spawn([str(exe), str(n)], stdio="pipe")
    out: list[bytes] = []
    device.on("output", lambda p, fd, data: out.append(data) if p == pid else None)
    session = device.attach(pid)
    script = session.create_script(JS_COUNTER)
    done: list[str] = []
    session.on("detached", lambda reason, crash: done.append(reason))
    script.load()
    device.resume(pid)
    deadline = time.monotonic() + 900
    while not done and time.monotonic() < deadline:
        time.sleep(0.05)
    return parse(b"".join(out).decode())


def heaptrack(exe: Path, n: int, tmp: Path) -> float | None:
    tool = shutil.which("heaptrack")
    if tool is None:
        return None
    proc = subprocess.run([tool, "-o", str(tmp / "ht"), str(exe), str(n)], capture_output=True, text=True)
    return parse(proc.stdout)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build(tmp)
        rows: dict[str, list[float]] = {}
        drops: dict[str, int] = {}
        for _ in range(repeats):
            rows.setdefault("native", []).append(native(exe, n))
            t, s = memtrace(exe, n, tmp)
            rows.setdefault("memtrace default", []).append(t)
            t, s = memtrace(exe, n, tmp, "--stack-threshold", "0", "--live-threshold", "0")
            rows.setdefault("memtrace every allocation stacked", []).append(t)
            drops["memtrace every allocation stacked"] = s["dropped"]["dropped_records"]
            ht = heaptrack(exe, n, tmp)
            if ht is not None:
                rows.setdefault("heaptrack", []).append(ht)
        rows["frida JS Interceptor.attach counter"] = [js_counter(exe, min(n, 500_000))]
        if "heaptrack" not in rows:
            print("heaptrack: not installed (apt install heaptrack to include it)")
    base = statistics.median(rows["native"])
    print(f"{n:,} malloc(32)/free pairs, median of {repeats} runs (JS counter: 1 run of {min(n, 500_000):,})")
    print(f"{'configuration':40} {'ns/pair':>9} {'x native':>9} {'+ns':>8}")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"{name:40} {med:9.1f} {med / base:9.2f} {med - base:8.1f}")
    stacked = statistics.median(rows["memtrace every allocation stacked"])
    js = statistics.median(rows["frida JS Interceptor.attach counter"])
    print(f"JS counter / every-allocation-stacked: {js / stacked:.1f}x")
    if "heaptrack" in rows:
        print(f"heaptrack / every-allocation-stacked: {statistics.median(rows['heaptrack']) / stacked:.2f}x")
    for name, d in drops.items():
        print(f"{name}: {d:,} records dropped (counts are exact regardless)")


if __name__ == "__main__":
    main()
