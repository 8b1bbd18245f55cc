"""Hooks in and out under a storm: how many times does memtrace kill its target?

Runs `memtrace <tracer> --window W` CYCLES times against one target whose threads call the hooked
functions in a tight loop (tests/stress/hook_storm.c), attaching to it (--pid) or spawning it, and
counts the targets that died.  An attached target must outlive every cycle; a spawned one must
live through the window (memtrace kills it itself afterwards, which is no death): the capture
must end "completed" (memtrace --json `ended`).

    python tests/stress/hook_storm.py --mode pid --cycles 500
    python tests/stress/hook_storm.py --mode all --cycles 20       # every mode, 20 cycles each

Prints one line per mode: `mode cycles deaths failures seconds deaths_at_injection` (the deaths that
came before memtrace's agent ran, inside Frida's injection), and exits 1 when any target died.
tests/integration/test_hook_storm.py runs it shortened in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# mode -> (tracer, extra memtrace options, storm kind, attach)
# The malloc modes capture in layers (stacks from 8 KiB, blocks from 4 KiB): what is stressed is the
# hooks going in and out, and a complete capture of four threads doing nothing but malloc/free
# would make every cycle a long drain on this size of machine.
LAYERED = ("--stack-threshold", "8192", "--live-threshold", "4096")
MODES: dict[str, tuple[str, tuple[str, ...], str, bool]] = {
    "pid": ("malloc", LAYERED, "malloc", True),
    "spawn": ("malloc", LAYERED, "malloc", False),
    "leaks": ("malloc", ("--leaks",), "malloc", True),
    "sample-bytes": ("malloc", ("--sample-bytes", "4096"), "malloc", True),
    "events": ("malloc", (*LAYERED, "--events"), "malloc", True),
    "fds": ("fds", (), "fds", True),
    "threads": ("threads", (), "threads", True),
    # Darwin tracers on Linux: their hooks on the stand-in library (demo/darwin), as the tests run them.
    "iosurface": ("iosurface", (), "iosurface", True),
    "purgeable": ("purgeable", (), "purgeable", True),
    # The routing probe patches nothing of its own (it calls the stand-in's entries once): what
    # goes in and out is the execve hook and the descriptor guard every tracer carries.
    "probe": ("probe", (), "purgeable", True),
}
STANDIN_KINDS = ("iosurface", "purgeable")
# The routing probe traces no calls: its capture ends "slow-start" (no traced activity) when all went well.
ENDINGS_OK = {"probe": ("completed", "slow-start")}


CYCLE_TIMEOUT = 300    # seconds one memtrace run may take on a loaded machine before it counts as hung

# Endings of a spawned target's capture that mean the target died (memtrace/deaths.py).
TARGET_DIED = ("target-exited", "launch-storm")


def build_target(out_dir: Path) -> Path:
    exe = out_dir / "hook_storm"
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", str(exe),
                    str(HERE / "hook_storm.c"), "-ldl"], check=True)
    return exe


def build_standin(out_dir: Path) -> Path:
    """The Darwin stand-in library (demo/darwin) the iosurface and purgeable storms call."""
    demo = out_dir / "demo"
    subprocess.run(["make", "-s", "-C", str(HERE.parent.parent / "demo"), f"OUT={demo}"], check=True,
                   stdout=subprocess.DEVNULL)
    return demo / "libmtdarwin.so"


def memtrace_cmd() -> list[str]:
    found = shutil.which("memtrace", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "memtrace"]


def start_target(exe: Path, kind: str, threads: int) -> subprocess.Popen[str]:
    p = subprocess.Popen([str(exe), kind, str(threads)], stdout=subprocess.PIPE, text=True, env=target_env(exe))
    assert p.stdout is not None
    if p.stdout.readline().strip() != "ready":
        raise RuntimeError("the storm target did not start")
    return p


def target_env(exe: Path) -> dict[str, str]:
    return {**os.environ, "MTDARWIN_LIB": str(exe.parent / "demo" / "libmtdarwin.so")}


def death_of(status: int | None) -> str | None:
    if status is None:
        return None
    return f"signal {-status}" if status < 0 else f"exit {status}"


def run_mode(mode: str, cycles: int, window: float, threads: int, exe: Path, work: Path,
             log: list[dict[str, object]], progress: bool, keep: Path | None = None,
             log_path: Path | None = None) -> tuple[int, int, int]:
    tracer, extra, kind, attach = MODES[mode]
    deaths = failures = injection_deaths = 0
    target = start_target(exe, kind, threads) if attach else None
    try:
        for cycle in range(cycles):
            out = work / f"{mode}-{cycle}"
            # A loaded machine starves the agent's set-up: a slow init is no death, so wait for it.
            cmd = [*memtrace_cmd(), tracer, "--device", "local", "--window", str(window), "--json",
                   "--rpc-timeout", "120",
                   "--out", str(out), *extra]
            if attach:
                assert target is not None
                cmd += ["--pid", str(target.pid)]
            else:
                cmd += ["--", str(exe), kind, str(threads)]
            t0 = time.monotonic()
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=CYCLE_TIMEOUT, env=target_env(exe))
            except subprocess.TimeoutExpired as e:
                # memtrace itself hung (killed by run): a failure, and the target is looked at below.
                res = subprocess.CompletedProcess(cmd, -1, _text(e.stdout), _text(e.stderr) + "\n(hung: killed)")
            died = None
            if attach:
                assert target is not None
                time.sleep(0.2)    # a death at detach shows within moments
                died = death_of(target.poll())
            ended = ended_as(res.stdout)
            why = reason_of(res.stdout)
            if not attach and ended in TARGET_DIED:
                died = ended          # the spawned target did not live through the window
            if (res.returncode != 0 or ended not in ENDINGS_OK.get(mode, ("completed",))) and died is None:
                failures += 1
            # Frida's injector gives up on a starved target (its own timeout) and unmaps the
            # bootstrap code under it: a death before memtrace's agent ran, told apart.
            at_injection = died is not None and why is not None and "during injection" in why
            if at_injection:
                injection_deaths += 1
            seconds = time.monotonic() - t0
            log.append({"mode": mode, "cycle": cycle, "rc": res.returncode, "died": died, "ended": ended,
                        "reason": why, "at_injection": at_injection, "seconds": round(seconds, 1),
                        "stderr": res.stderr.strip().splitlines()[-3:]})
            if log_path is not None:
                # after every cycle: a run cut short still tells what it saw
                log_path.write_text(json.dumps(log, indent=1))
            if died is not None and keep is not None:
                shutil.copytree(out, keep / out.name, dirs_exist_ok=True)
                (keep / f"{out.name}.txt").write_text(res.stdout + res.stderr)
            shutil.rmtree(out, ignore_errors=True)
            if progress:
                print(f"  {mode} cycle {cycle + 1}/{cycles}: {died or ended} rc={res.returncode} {seconds:.0f} s"
                      f"{' (at injection)' if at_injection else ''}", file=sys.stderr, flush=True)
            if died is not None:
                deaths += 1
                if attach:
                    target = start_target(exe, kind, threads)
    finally:
        if target is not None and target.poll() is None:
            target.send_signal(signal.SIGKILL)
            target.wait()
    return deaths, failures, injection_deaths


def _text(out: str | bytes | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def reason_of(stdout: str) -> str | None:
    """Why the capture ended as it did (memtrace --json `reason`), when it says."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return None
    why = doc.get("reason") if isinstance(doc, dict) else None
    return why if isinstance(why, str) else None


def ended_as(stdout: str) -> str | None:
    """How the capture ended (`ended` of memtrace --json: completed, target-exited, ...)."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return None
    ended = doc.get("ended") if isinstance(doc, dict) else None
    return ended if isinstance(ended, str) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="pid", help=f"one of {', '.join(MODES)}, or all")
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--window", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--log", type=Path, default=None, help="every cycle's outcome as JSON")
    ap.add_argument("--progress", action="store_true", help="one line per cycle on stderr")
    ap.add_argument("--keep", type=Path, default=None, help="keep the captures of the cycles that killed")
    args = ap.parse_args(argv)
    modes = list(MODES) if args.mode == "all" else args.mode.split(",")
    for m in modes:
        if m not in MODES:
            print(f"hook_storm: unknown mode {m!r}", file=sys.stderr)
            return 2
    log: list[dict[str, object]] = []
    any_death = False
    with tempfile.TemporaryDirectory(prefix="hook-storm-") as tmp:
        work = Path(tmp)
        exe = build_target(work)
        if any(MODES[m][2] in STANDIN_KINDS for m in modes):
            build_standin(work)
        print("mode cycles deaths failures seconds deaths_at_injection", flush=True)
        for m in modes:
            t0 = time.monotonic()
            deaths, failures, at_injection = run_mode(m, args.cycles, args.window, args.threads, exe, work, log, args.progress,
                                                      args.keep, args.log)
            any_death |= deaths > 0
            print(f"{m} {args.cycles} {deaths} {failures} {time.monotonic() - t0:.0f} {at_injection}", flush=True)
    if args.log is not None:
        args.log.write_text(json.dumps(log, indent=1))
    return 1 if any_death else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
