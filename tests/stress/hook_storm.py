"""Hooks in and out under a storm: how many times does memtrace kill its target?

Runs `memtrace <tracer> --window W` CYCLES times against one target whose threads call the hooked
functions in a tight loop (tests/stress/hook_storm.c), attaching to it (--pid: the SAME target
attached and detached again and again, the --pid user's risk) or spawning it, and counts the
targets that died.  An attached target must outlive every cycle; a spawned one must live through
the window (memtrace kills it itself afterwards, which is no death): the capture must end
"completed" (memtrace --json `ended`).

Two drivers run a cycle, both through memtrace's command line as a user types it:
  --driver lib (default): `memtrace.cli.main(argv)` called in this one Python process, cycle after
      cycle -- the same click command, capture loop, Frida host, agent build and report code as the
      `memtrace` program, without a new interpreter, imports and Frida device per cycle (the agent
      and the precompiled core are built once and reused, as a long-lived memtrace would).  What a
      cycle does to the target -- inject, load the agent, hooks in with the world stopped, the
      window, hooks out, quiesce, unload, detach -- is the same.  A cycle that outlives
      --cycle-timeout is a hang: the target's threads are dumped (gdb) and the storm stops there.
  --driver cli: one `memtrace` process per cycle (the older, ~5x slower driver).

    python tests/stress/hook_storm.py --mode pid --cycles 500
    python tests/stress/hook_storm.py --mode all --cycles 20       # every mode, 20 cycles each

Prints one line per mode: `mode cycles deaths failures seconds deaths_at_injection` (the deaths that
came before memtrace's agent ran, inside Frida's injection), and exits 1 when any target died, 3
when a cycle hung.  With --progress, one line per cycle on stderr, with the agent's account of its
world stops (`world`: retries, frida_busy, refused...).  tests/integration/test_hook_storm.py runs it
shortened in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))       # run as a script: the repository's tests package
from tests.children import exit_of  # noqa: E402

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


def use_mach_world(lib: Path) -> None:
    """Every patch of every cycle under the Darwin stop-the-world, run on Linux: memtrace builds
    cmodule/world.c with MT_DARWIN over the stand-in's Mach calls (MEMTRACE_WORLD_MACH), preloaded
    into the targets (a spawned one is held before its constructors, where the agent cannot load
    it).  Set in this process's environment: the memtrace runs and the targets inherit it."""
    os.environ["MEMTRACE_WORLD_MACH"] = str(lib)
    # Preloaded: a spawned target is held before its constructors, where the agent cannot load it.
    os.environ["LD_PRELOAD"] = " ".join(filter(None, (os.environ.get("LD_PRELOAD"), str(lib))))


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


def world_of(out: Path) -> dict[str, Any] | None:
    """The agent's own account of its world stops, as the capture keeps it (the "after"
    CALIBRATION record's `world`); None when the run wrote none (a failed start, a death)."""
    from memtrace.capture import CaptureError, RecordType, read_records

    try:
        for r in read_records(out):
            if (r.type == RecordType.CALIBRATION and r.body.get("phase") == "after"
                    and isinstance(r.body.get("world"), dict)):
                return dict(r.body["world"])
    except (OSError, CaptureError):
        pass
    return None


class Cycle:
    """What one memtrace run said: its exit status, stdout (--json), stderr, and the agent's own
    account of its world stops (world_of: read from its capture, either driver)."""

    def __init__(self, rc: int, stdout: str, stderr: str, hung: bool = False) -> None:
        self.rc, self.stdout, self.stderr, self.hung = rc, stdout, stderr, hung
        self.world: dict[str, Any] | None = None


Driver = Callable[[list[str], dict[str, str], float], Cycle]


def cli_driver(argv: list[str], env: dict[str, str], timeout: float) -> Cycle:
    """One `memtrace` process per cycle."""
    try:
        res = subprocess.run([*memtrace_cmd(), *argv], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        # memtrace itself hung (killed by run): the target is looked at by the caller.
        return Cycle(-1, _text(e.stdout), _text(e.stderr) + "\n(hung: killed)", hung=True)
    return Cycle(res.returncode, res.stdout, res.stderr)


class LibDriver:
    """`memtrace.cli.main(argv)` in this process, cycle after cycle: the command line's own code,
    with the interpreter, the imports, Frida's device and the built agent kept from one cycle to
    the next."""

    def __init__(self) -> None:
        from memtrace import cli

        self.cli = cli

    def __call__(self, argv: list[str], env: dict[str, str], timeout: float) -> Cycle:
        os.environ.update(env)
        out, err = io.StringIO(), io.StringIO()
        rc = 0
        done = threading.Event()
        watchdog = threading.Thread(target=self._watch, args=(done, timeout, argv), daemon=True)
        watchdog.start()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                self.cli.main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception as e:  # noqa: BLE001 -- a traceback is a failed cycle, told in the log
            rc, err = -2, io.StringIO(err.getvalue() + f"\n(raised {type(e).__name__}: {e})")
        finally:
            done.set()
        if rc in (129, 130, 143):
            raise KeyboardInterrupt     # the storm itself was told to stop (SIGHUP, ^C, SIGTERM)
        return Cycle(rc, out.getvalue(), err.getvalue())

    @staticmethod
    def _watch(done: threading.Event, timeout: float, argv: list[str]) -> None:
        """A cycle past its timeout cannot be cut short in this process: it is a hang, and the
        storm ends on it (the caller's hang handler, HANG_HANDLER, says what the target did)."""
        if done.wait(timeout):
            return
        handler = HANG_HANDLER[0] if HANG_HANDLER else None
        if handler is not None:
            handler(argv)
        os._exit(3)


# Set by main(): what to do when a lib-driver cycle hangs (dump, log, kill the targets).
HANG_HANDLER: list[Callable[[list[str]], None]] = []


def dump_host(to: Path) -> None:
    """This process's threads for a hang (the lib driver runs memtrace here): Python's stacks
    (faulthandler) and the native ones with py-spy when installed, else gdb."""
    with to.open("w") as f:
        f.write("== faulthandler (Python stacks) ==\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    cmd = ([spy, "dump", "--native", "--pid", str(os.getpid())] if spy is not None else
           ["gdb", "-batch", "-p", str(os.getpid()), "-ex", "info threads", "-ex", "thread apply all bt 40"])
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        out = res.stdout + res.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        out = f"{cmd[0]} failed: {e}"
    with to.open("a") as f:
        f.write(f"\n== {' '.join(cmd[:3])} ==\n{out}")


def dump_threads(pid: int, to: Path) -> None:
    """Every thread's stack of a live process (gdb), for a hang."""
    try:
        res = subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "info threads", "-ex", "thread apply all bt 30"],
                             capture_output=True, text=True, timeout=120)
        to.write_text(res.stdout + res.stderr)
    except (OSError, subprocess.TimeoutExpired) as e:
        to.write_text(f"gdb failed: {e}")


WORLD_KEYS = ("applied", "stopped", "running", "failed", "retries", "timeouts", "frida_retries", "frida_busy",
              "frida_refused", "not_drained", "not_quiesced", "frida_keys_retired")


def run_mode(mode: str, cycles: int, window: float, threads: int, exe: Path, work: Path,
             log: list[dict[str, Any]], progress: bool, keep: Path | None = None,
             log_path: Path | None = None, driver: Driver = cli_driver,
             cycle_timeout: float = 300.0) -> tuple[int, int, int]:
    tracer, extra, kind, attach = MODES[mode]
    deaths = failures = injection_deaths = 0
    world_totals = dict.fromkeys(WORLD_KEYS, 0)
    target = start_target(exe, kind, threads) if attach else None
    live = [target]

    def on_hang(argv: list[str]) -> None:
        pid = live[0].pid if live[0] is not None else None
        note = {"mode": mode, "cycle": len([e for e in log if e.get("mode") == mode]), "hung": True,
                "argv": argv, "target": pid, "target_alive": live[0] is not None and exit_of(live[0]) is None}
        if pid is not None and live[0] is not None and exit_of(live[0]) is None:
            dump = (keep or (log_path.parent if log_path is not None else work)) / f"hang-{mode}-{pid}.gdb.txt"
            dump_threads(pid, dump)
            note["gdb"] = str(dump)
        host = (keep or (log_path.parent if log_path is not None else work)) / f"hang-{mode}-host-{os.getpid()}.txt"
        dump_host(host)
        note["host"] = str(host)
        log.append(note)
        if log_path is not None:
            log_path.write_text(json.dumps(log, indent=1))
        print(f"{mode}: cycle hung past {cycle_timeout:.0f} s: {json.dumps(note)}", file=sys.stderr, flush=True)
        print(f"{mode} {note['cycle']} {deaths} {failures + 1} hung {injection_deaths}", flush=True)
        if live[0] is not None and exit_of(live[0]) is None:
            live[0].kill()

    HANG_HANDLER[:] = [on_hang]
    try:
        for cycle in range(cycles):
            out = work / f"{mode}-{cycle}"
            # A loaded machine starves the agent's set-up: a slow init is no death, so wait for it.
            argv = [tracer, "--device", "local", "--window", str(window), "--json", "--rpc-timeout", "120",
                    "--out", str(out), *extra]
            if attach:
                assert target is not None
                argv += ["--pid", str(target.pid)]
            else:
                argv += ["--", str(exe), kind, str(threads)]
            t0 = time.monotonic()
            res = driver(argv, target_env(exe), cycle_timeout)
            res.world = world_of(out)
            died = None
            if attach:
                assert target is not None
                time.sleep(0.2)    # a death at detach shows within moments
                died = death_of(exit_of(target))
            ended = ended_as(res.stdout)
            why = reason_of(res.stdout)
            if not attach and ended in TARGET_DIED:
                died = ended          # the spawned target did not live through the window
            if attach and died is None and ended in TARGET_DIED:
                # memtrace saw it die.  In the lib driver the target is a child of this process,
                # and memtrace's exit watcher may reap it first (poll() then says nothing, or 0).
                died = why or ended
            failed = (res.rc != 0 or ended not in ENDINGS_OK.get(mode, ("completed",))) and died is None
            failures += failed
            # Frida's injector gives up on a starved target (its own timeout) and unmaps the
            # bootstrap code under it: a death before memtrace's agent ran, told apart.
            at_injection = died is not None and why is not None and "during injection" in why
            if at_injection:
                injection_deaths += 1
            seconds = time.monotonic() - t0
            world = {k: res.world.get(k, 0) for k in WORLD_KEYS} if res.world is not None else None
            for k, v in (world or {}).items():
                world_totals[k] += int(v or 0)
            log.append({"mode": mode, "cycle": cycle, "rc": res.rc, "died": died, "ended": ended, "failed": failed,
                        "reason": why, "at_injection": at_injection, "seconds": round(seconds, 2),
                        "hung": res.hung, "world": world,
                        "stop_by": res.world.get("stop_by") if res.world is not None else None,
                        # which patch was refused and why (the thread named): a rare CI failure's evidence
                        "refused": res.world.get("refused") if res.world is not None else None,
                        "frida_keys_why": res.world.get("frida_keys_why") if res.world is not None else None,
                        "last_busy": res.world.get("last_busy") if res.world is not None else None,
                        "last_not_quiesced": res.world.get("last_not_quiesced") if res.world is not None else None,
                        # a cycle that did not complete keeps all it said (a refusal's evidence
                        # is one long warning, wrapped: its last lines alone lost which thread)
                        "stderr": res.stderr.strip().splitlines()[-3 if ended == "completed" else -60:]})
            if log_path is not None:
                # after every cycle: a run cut short still tells what it saw
                log_path.write_text(json.dumps(log, indent=1))
            if died is not None and keep is not None:
                if out.exists():
                    shutil.copytree(out, keep / out.name, dirs_exist_ok=True)
                (keep / f"{out.name}.txt").write_text(res.stdout + res.stderr)
                # The target's core (core_pattern "core": its cwd, this process's), before the next
                # death writes over it.
                core = Path.cwd() / "core"
                if core.exists():
                    shutil.move(str(core), str(keep / f"{out.name}.core"))
            shutil.rmtree(out, ignore_errors=True)
            if progress:
                busy = "" if world is None else " world " + " ".join(f"{k}={v}" for k, v in world.items() if v)
                if res.world is not None and res.world.get("stop_by") != "ptrace":
                    busy += f" by {res.world.get('stop_by')}"
                print(f"  {mode} cycle {cycle + 1}/{cycles}: {died or ended} rc={res.rc} {seconds:.1f} s"
                      f"{' (at injection)' if at_injection else ''}{busy}", file=sys.stderr, flush=True)
            if died is not None:
                deaths += 1
                if attach:
                    assert target is not None
                    with contextlib.suppress(OSError):
                        target.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
                        target.wait(10)
                    target = start_target(exe, kind, threads)
                    live[0] = target
    finally:
        HANG_HANDLER.clear()
        if target is not None and exit_of(target) is None:
            target.send_signal(signal.SIGKILL)
            target.wait()
    if progress:
        print(f"  {mode} world totals: {json.dumps(world_totals)}", file=sys.stderr, flush=True)
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
    # What a cycle stresses is the hooks going in and coming out; the window only has the threads
    # run through them meanwhile (millions of calls in 0.25 s).
    ap.add_argument("--window", type=float, default=0.25)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--log", type=Path, default=None, help="every cycle's outcome as JSON")
    ap.add_argument("--progress", action="store_true", help="one line per cycle on stderr")
    ap.add_argument("--keep", type=Path, default=None, help="keep the captures of the cycles that killed")
    ap.add_argument("--driver", choices=("lib", "cli"), default="lib",
                    help="lib: memtrace's command line called in this process; cli: one memtrace process a cycle")
    ap.add_argument("--cycle-timeout", type=float, default=CYCLE_TIMEOUT,
                    help="seconds a cycle may take before it counts as hung")
    ap.add_argument("--world", choices=("native", "mach"), default="native",
                    help="native: Linux's stop (ptrace helper); mach: the Darwin stop (Mach thread suspension, "
                         "cmodule/world.c MT_DARWIN) over the stand-in library demo/darwin/mtmach.c")
    ap.add_argument("--work", type=Path, default=None,
                    help="build the targets and write the captures under this folder (default: a temporary one, "
                         "removed at the end)")
    args = ap.parse_args(argv)
    modes = list(MODES) if args.mode == "all" else args.mode.split(",")
    for m in modes:
        if m not in MODES:
            print(f"hook_storm: unknown mode {m!r}", file=sys.stderr)
            return 2
    log: list[dict[str, Any]] = []
    any_death = False
    driver: Driver = LibDriver() if args.driver == "lib" else cli_driver
    with tempfile.TemporaryDirectory(prefix="hook-storm-", dir=args.work) as tmp:
        work = Path(tmp)
        exe = build_target(work)
        if any(MODES[m][2] in STANDIN_KINDS for m in modes) or args.world == "mach":
            build_standin(work)
        if args.world == "mach":
            use_mach_world(work / "demo" / "libmtmach.so")
        print("mode cycles deaths failures seconds deaths_at_injection", flush=True)
        for m in modes:
            t0 = time.monotonic()
            deaths, failures, at_injection = run_mode(m, args.cycles, args.window, args.threads, exe, work, log,
                                                      args.progress, args.keep, args.log, driver, args.cycle_timeout)
            any_death |= deaths > 0
            print(f"{m} {args.cycles} {deaths} {failures} {time.monotonic() - t0:.0f} {at_injection}", flush=True)
    if args.log is not None:
        args.log.write_text(json.dumps(log, indent=1))
    return 1 if any_death else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    faulthandler.register(signal.SIGUSR1, all_threads=True)    # kill -USR1: every thread's Python stack
    sys.exit(main())
