"""Does Frida's injection kill a target whose threads keep every CPU busy?  Counts deaths.

    python bench/busy_attach.py [--threads N] [--attempts K] [--load L] [--mode MODE] [--window S]

Each attempt starts tests/programs/busy_threads.c with N threads spinning (a fresh target each time:
a death ends it), optionally L more spinning threads in another process (machine-wide load, the
round-4 storms' situation), attaches, and says how it ended:

  frida     a plain ``frida.get_local_device().attach(pid)`` in a child process -- no memtrace code;
  boost     the same attach inside memtrace.priority's injection boost (what FridaHost.attach does);
  memtrace  ``memtrace malloc --pid PID --window S`` (the whole CLI).

Frida's Linux injector gives its loader 5 s to sync with the agent; past that it unmaps the loader
under the thread still running in it (SIGSEGV, docs/domain/frida.md).  Printed per attempt: the
attach's outcome, whether the target survived (and its signal), seconds; at the end the counts.
Every attempt is bounded (--timeout) and every process started here is killed at the end.  The
target runs at the nice value this script has: run the script itself at nice 0 for the real
contest (the brief: a target that competes normally), bounded by --attempts.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from memtrace import priority  # noqa: E402

CFLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-rdynamic"]

PLAIN = r"""
import sys, time, frida
sys.path.insert(0, sys.argv[2])
from memtrace import priority
device = frida.get_local_device()
print("ready", flush=True)
pid = int(sys.stdin.readline()); boost = sys.argv[1] == "1"
b = priority.boost_injection(pid) if boost else None
t0 = time.monotonic()
try:
    s = device.attach(pid)
    out = "attached"
    try:
        sc = s.create_script("send(Process.id)")
        sc.load()
        out = "loaded"
    finally:
        if b is not None:
            b.restore()
    s.detach()
except Exception as e:
    out = "error: " + str(e).splitlines()[0][:100]
finally:
    if b is not None:
        b.restore()
print(out, round(time.monotonic() - t0, 1), flush=True)
"""


def build(tmp: Path) -> Path:
    exe = tmp / "busy_threads"
    subprocess.run(["gcc", *CFLAGS, "-o", str(exe), str(ROOT / "tests/programs/busy_threads.c")], check=True)
    return exe


def spinning(exe: Path, threads: int, before_spin: Callable[[], None] | None = None) -> subprocess.Popen[str]:
    p = subprocess.Popen([str(exe), str(threads), "spin"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True)
    assert p.stdout is not None
    if p.stdout.readline().strip() != "ready":
        p.kill()
        raise SystemExit("busy_threads never said ready")
    if before_spin is not None:
        before_spin()
    p.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while not priority.busy(p.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return p


def attempt(args: argparse.Namespace, mode: str, exe: Path, tmp: Path, i: int) -> dict[str, object]:
    """One target, one attach.  frida/boost: the attaching process has imported Frida and found
    the device before the target spins (its own start-up is not what is measured); memtrace: the
    whole CLI, started once the target spins."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    child: subprocess.Popen[str] | None = None
    if mode in ("frida", "boost"):
        child = subprocess.Popen([sys.executable, "-c", PLAIN, "1" if mode == "boost" else "0", str(ROOT / "src")],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env)

        def child_ready() -> None:
            assert child is not None and child.stdout is not None
            ready, _, _ = select.select([child.stdout], [], [], args.timeout)      # bounded: a starved start
            if not ready or child.stdout.readline().strip() != "ready":
                child.kill()
                raise SystemExit("the attaching process never said ready")
    target = spinning(exe, args.threads, child_ready if child is not None else None)
    t0 = time.monotonic()
    try:
        try:
            if child is not None:
                out, err = child.communicate(f"{target.pid}\n", timeout=args.timeout)
                outcome = out.strip() or err.strip()[-160:]
            else:
                cmd = [sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--pid", str(target.pid),
                       "--window", str(args.window), "--rpc-timeout", str(args.timeout), "--json",
                       "--out", str(tmp / f"cap{i}")]
                res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
                try:
                    doc = json.loads(res.stdout)
                    outcome = f"exit {res.returncode} {doc.get('ended')}: {str(doc.get('reason'))[:90]}"
                except ValueError:
                    outcome = f"exit {res.returncode}: {(res.stderr.strip().splitlines() or [''])[-1][:120]}"
        except subprocess.TimeoutExpired:
            outcome = "timeout"
        time.sleep(0.5)
        rc = target.poll()
        return {"attempt": i, "mode": mode, "outcome": outcome, "target": "alive" if rc is None else f"died {rc}",
                "seconds": round(time.monotonic() - t0, 1)}
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        target.kill()
        target.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--attempts", type=int, default=3)
    ap.add_argument("--load", type=int, default=0, help="spinning threads in another process")
    ap.add_argument("--mode", default="frida",
                    help="frida, boost or memtrace; several, comma-separated, take turns (same load for each)")
    ap.add_argument("--window", type=float, default=1)
    ap.add_argument("--timeout", type=int, default=240)
    args = ap.parse_args()
    # A SIGTERM (e.g. from `timeout`) ends through the finally blocks: no target or load left spinning.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="busy-attach-") as t:
        tmp = Path(t)
        exe = build(tmp)
        load = spinning(exe, args.load) if args.load else None
        modes = args.mode.split(",")
        if not set(modes) <= {"frida", "boost", "memtrace"}:
            raise SystemExit(f"--mode: {args.mode}: each one of frida, boost, memtrace")
        deaths = dict.fromkeys(modes, 0)
        tried = dict.fromkeys(modes, 0)
        try:
            print(f"modes {args.mode}, {args.threads} spinning threads, load {args.load}, "
                  f"can renice {priority.can_renice()}, cpus {os.cpu_count()}", flush=True)
            for i in range(args.attempts):
                mode = modes[i % len(modes)]
                r = attempt(args, mode, exe, tmp, i)
                deaths[mode] += r["target"] != "alive"
                tried[mode] += 1
                print(json.dumps(r), flush=True)
        finally:
            if load is not None:
                load.kill()
                load.wait(timeout=30)
        for mode in modes:
            print(f"{mode}: deaths {deaths[mode]} of {tried[mode]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
