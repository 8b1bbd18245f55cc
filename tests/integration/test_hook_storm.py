"""Hooks go in and out with the world stopped, and a storm of cycles kills no target (issue 19).

Two kinds of proof, both against tests/stress/hook_storm.c, whose threads call the hooked
functions in a tight loop:
  - the agent's own account (the `world` rpc: cmodule/world.c and agents/runtime/world.js): every
    patch was applied with the world stopped, none with it running, and the malloc tracer found
    no thread left in its code before unloading;
  - the storm itself (tests/stress/hook_storm.py, shortened): attach/detach cycles in every mode
    through memtrace's command line (its in-process driver: `memtrace.cli.main` cycle after cycle,
    the same long-lived target attached again and again), counting the targets that died and the
    cycles that hung; the one-process-per-cycle driver is run too.

The storm's CI form (issue 19 asks for >= 100 cycles in CI): every run, ONE mode storms for 100
cycles in a row (MEMTRACE_HOOK_STORM_LONG, else the mode of the day: date.toordinal() % 10, so ten
days of CI give every mode its 100) and each of the other nine for 6 (MEMTRACE_HOOK_STORM_CYCLES):
154 cycles, every mode put in and out every run, at ~2 s a cycle on an idle machine ~5 min of one
xdist worker (before: 12 x 10 = 120 cycles, ~4 min).  The 500-cycle runs per mode are
docs/hook-storm.md's, made with tests/stress/hook_storm.py by hand.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from ..children import exit_of, kill_and_reap  # noqa: TID252
from ..conftest import ROOT  # noqa: TID252
from .tracer_agent import load_tracer

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

frida = pytest.importorskip("frida")
STRESS = ROOT / "tests" / "stress"
CYCLES = int(os.environ.get("MEMTRACE_HOOK_STORM_CYCLES", "6"))
LONG_CYCLES = 100
STORM_MODES = ["pid", "spawn", "leaks", "sample-bytes", "events", "fds", "threads", "iosurface", "purgeable", "probe"]
LONG_MODE = os.environ.get("MEMTRACE_HOOK_STORM_LONG") or STORM_MODES[datetime.date.today().toordinal() % len(STORM_MODES)]


@pytest.fixture(scope="module")
def storm_exe(build_dir: Path) -> Path:
    exe = build_dir / "hook_storm"
    subprocess.run(["gcc", "-O2", "-g", "-pthread", "-o", str(exe), str(STRESS / "hook_storm.c"), "-ldl"],
                   check=True)
    return exe


def _start(exe: Path, kind: str, demo: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    p = subprocess.Popen([str(exe), kind, "4"], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "MTDARWIN_LIB": str(demo / "libmtdarwin.so"), **(env or {})})
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


# tracer -> (storm kind, extra agent config).  The Darwin tracers hook the stand-in (demo/darwin).
TRACERS = {
    "malloc": ("malloc", {}),
    "fds": ("fds", {}),
    "threads": ("threads", {}),
    "iosurface": ("iosurface", {}),
    "purgeable": ("purgeable", {"standinMadvise": True}),
    "probe": ("purgeable", {}),     # hooks nothing of its own: the execve hook and the guard only
}


# A second script's look at glibc's pthread key table ({seq, destr} per key, in use when seq is
# odd): how many keys in use have their destructor in Frida's agent (its executable mappings).
FRIDA_KEY_DESTRUCTORS = """
rpc.exports = { fridaDestructors() {
  const table = Module.getGlobalExportByName('__pthread_keys');
  const code = [];
  for (const line of File.readAllText('/proc/self/maps').split('\\n')) {
    const f = line.split(/\\s+/);
    if (f.length >= 6 && f[1][2] === 'x' && /frida-agent/.test(f.slice(5).join(' '))) {
      const [lo, hi] = f[0].split('-');
      code.push([ptr('0x' + lo), ptr('0x' + hi)]);
    }
  }
  let n = 0;
  for (let i = 0; i < 1024; i++) {
    const at = table.add(i * 16);
    const d = at.add(8).readPointer();
    if ((at.readU32() & 1) === 1 && code.some(([lo, hi]) => d.compare(lo) >= 0 && d.compare(hi) < 0))
      n++;
  }
  return n;
} };
"""


def _said(what: object) -> str:
    """The whole of `what` for an assertion's message (pytest shortens a non-string one to a line,
    which hid the very field a rare CI failure needed: frida_keys_why)."""
    return json.dumps(what, default=str)


class PatchedRun(NamedTuple):
    died: str | None
    world: dict[str, Any]
    destructors_before: int
    destructors_after: int


def _patched_run(storm_exe: Path, demo_bin: Path, tracer: str, mach: bool) -> PatchedRun:
    """One tracer's hooks in and out of a storm target, and the agent's account of its stops.
    `mach`: under the Darwin stop (cmodule/world.c MT_DARWIN over the stand-in's Mach calls,
    preloaded into the target as a held program needs it)."""
    kind, extra = TRACERS[tracer]
    if mach:
        extra = {**extra, "worldMach": str(demo_bin / "libmtmach.so")}
    preload = " ".join(filter(None, (os.environ.get("LD_PRELOAD"), str(demo_bin / "libmtmach.so"))))
    target = _start(storm_exe, kind, demo_bin, {"LD_PRELOAD": preload} if mach else {})
    try:
        session = frida.get_local_device().attach(target.pid)
        detached: list[str] = []
        session.on("detached", lambda reason, crash: detached.append(f"{reason} (crash: {crash})"))
        try:
            script, api = load_tracer(session, tracer, extra)
            api.start()
            time.sleep(0.5)
            keys = session.create_script(FRIDA_KEY_DESTRUCTORS)
            keys.load()
            destructors_before = keys.exports_sync.frida_destructors()
            try:
                world = api.stop()["world"]
            except frida.InvalidOperationError as e:
                # The session went away under the stop (round 26's one CI failure said only
                # "script has been destroyed"): say why, and how the target ended.
                time.sleep(0.5)
                raise AssertionError(f"{tracer}: the stop lost its session ({e}): detached {detached}, "
                                     f"target exit {exit_of(target)}") from e
            destructors_after = keys.exports_sync.frida_destructors()
            keys.unload()
            script.unload()
        finally:
            session.detach()
        time.sleep(0.3)
        died = exit_of(target)      # (this process is Frida's tracer: no poll(), see exit_of)
    finally:        # a failure above must not leave 4 spinning threads behind for the rest of the run
        kill_and_reap(target)
    return PatchedRun(died, world, destructors_before, destructors_after)


@pytest.mark.parametrize("tracer", list(TRACERS))
def test_every_patch_is_applied_with_the_world_stopped(storm_exe: Path, demo_bin: Path, tracer: str) -> None:
    run = _patched_run(storm_exe, demo_bin, tracer, mach=False)
    assert run.world["stop_by"] == "ptrace", _said(run.world)
    _assert_every_patch_stopped(tracer, run)


@pytest.mark.parametrize("tracer", list(TRACERS))
def test_every_patch_is_applied_with_the_mach_world_stopped(storm_exe: Path, demo_bin: Path, tracer: str) -> None:
    """The same under the Darwin stop (issue 19's item 5; DEVICE-UNVERIFIED on a device): the
    threads held by thread_suspend, Frida's found by the port names task_threads gives, Frida's
    code by its VM region, the listeners' sites put back through mt_world_write."""
    run = _patched_run(storm_exe, demo_bin, tracer, mach=True)
    assert run.world["stop_by"].startswith("mach"), _said(run.world)
    # No thread appeared unheld after a flush; every listener site put back by memtrace's writer.
    assert run.world["started_during"] == 0 and run.world["restore_refused"] == 0, _said(run.world)
    _assert_every_patch_stopped(tracer, run)


def _assert_every_patch_stopped(tracer: str, run: PatchedRun) -> None:
    died, world, destructors_before, destructors_after = run
    assert died is None, f"the target died: {died}"
    assert world["why"] is None, _said(world)
    # Frida's own pthread keys (its Interceptor's per-thread context...) have their destructors in
    # its agent, which glibc would call on a thread exiting while Frida unloads (the threads
    # storm's death): once the hooks are out, none is left to call (world.js retireFridaKeyDestructors).
    assert destructors_before >= 1 and world["frida_keys_retired"] == destructors_before, _said((destructors_before, world))
    assert destructors_after == 0 and world["frida_keys_why"] is None, _said((destructors_after, world))
    # Ours in first (execve, the descriptor guard), the tracer's after; out in the reverse order.
    whats = [what for what, _n in world["log"]]
    assert whats[:2] == ["execve hook in", "descriptor guard in"], _said(world)
    assert whats[-2:] == ["descriptor guard out", "execve hook out"], _said(world)
    assert world["applied"] >= 4 and world["stopped"] == world["applied"], _said(world)
    assert world["running"] == 0 and world["failed"] == 0, _said(world)
    assert world["frida_code_ranges"] >= 1, _said(world)
    # The C library's signal-return code found (x86-64 and arm64 by its bytes): the strict stop
    # counts only return addresses into Frida's code, below any signal frame (world.c).
    assert world["signal_returns"] >= 1, _said(world)
    if platform.machine() == "x86_64":
        # Interceptor's way in (the guard's trampoline slices, the enter thunk) kept clear of the
        # stops too: a thread on it when a hook comes out would resume into a freed context.
        assert world["entry_ranges"] >= 2, _said(world)
    # The proof that the bytes changed under the stop: every site rewritten going in while the
    # world was stopped, and every one restored under it going out (the guard's close is shared
    # with the fds tracer's listener: rewritten once going in, restored once going out).
    rewritten_in = sum(n for what, n in world["log"] if what.endswith(" in"))
    # ("listeners out (memtrace)": the listener sites memtrace put back itself, world.js)
    rewritten_out = sum(n for what, n in world["log"] if " out" in what)
    assert rewritten_in == world["sites"], _said(world)
    assert rewritten_out == world["sites"], _said(world)
    # No listener's restore was left to a thread leaving JavaScript with the world running:
    # memtrace put every listener-only site back itself (restored_stopped), and every thread had
    # left Frida's code before the guard and the execve hook came out.
    assert world["not_drained"] == 0 and world["frida_busy"] == 0 and world["frida_refused"] == 0, _said(world)
    assert world["refused"] == [], _said(world)
    if tracer in ("fds", "threads", "iosurface", "purgeable"):
        restored = next(n for what, n in world["log"] if what == "listeners out (memtrace)")
        assert restored >= 1 and world["restored_stopped"] == restored and world["drained"] >= 2, _said(world)
    # Before the agent's code can be freed, no thread was left in it: process.c's (the descriptor
    # guard's mt_close, the execve hook) for every tracer, and the malloc tracer's own module.
    assert world["quiesced"] == (2 if tracer == "malloc" else 1) and world["not_quiesced"] == 0, _said(world)
    # process.c's module quiesced from past its lead function (world.js moduleCode): a page address
    # a storm thread kept from mmap, its pages the module's since, is no reference into the code.
    assert world["lead_skipped"] >= 1, _said(world)


# A cycle is a whole memtrace run (injection, agent load, hooks in, a 0.25 s window, hooks out,
# report): 1-2 s with the in-process driver on an idle machine, far more on a loaded one
# (docs/hook-storm.md).  The budget is for a loaded CI machine: a storm cut short by its timeout
# proves nothing either way (a single cycle past --cycle-timeout, 300 s, is a hang: exit 3).
CYCLE_BUDGET_S = 150


def _cycles(mode: str) -> int:
    return LONG_CYCLES if mode == LONG_MODE else CYCLES


@pytest.mark.slow
@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.timeout(_cycles(m) * CYCLE_BUDGET_S + 120))
                                  for m in STORM_MODES])
def test_a_storm_of_cycles_kills_no_target(mode: str, tmp_path: Path) -> None:
    _storm(mode, _cycles(mode), tmp_path)


# The Darwin stop (cmodule/world.c MT_DARWIN over the stand-in's Mach calls, hook_storm.py --world
# mach): a spawned target, a listener tracer, the thread-start hook and a Darwin tracer, 6 cycles each.
MACH_STORM_MODES = ["spawn", "fds", "threads", "iosurface"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.timeout(CYCLES * CYCLE_BUDGET_S + 120))
                                  for m in MACH_STORM_MODES])
def test_a_storm_under_the_mach_stop_kills_no_target(mode: str, tmp_path: Path) -> None:
    # (a cycle lost to Frida's stuck injection, which _storm allows, made no patch to look at)
    log = [c for c in _storm(mode, CYCLES, tmp_path, "--world", "mach") if not c["failed"]]
    # Every cycle's patches went in and out under the Mach stop, none with the world running.
    assert all(str(c["stop_by"]).startswith("mach") for c in log), _said(log)
    for c in log:
        world = c["world"]
        # (None: the capture kept no report -- the calibration after the stop failed)
        assert world is not None and world["running"] == 0 and world["applied"] > 0, _said(log)
        if world["stopped"] != world["applied"]:
            # A patch refused (nothing written) because a held thread had a word above its sp that
            # points into Frida's agent: the strict stop's known cost, by design, when that word
            # is a dead return address -- the --pid storm's one target met a new agent mapped where
            # an earlier session's agent was, and one worker's stale word pointed into it for a whole
            # session (docs/hook-storm.md, "Round 17").  Allowed only so: every patch stopped or
            # refused, each refusal naming a stack word -- never a pc or a register in Frida's code.
            assert world["stopped"] + len(c["refused"]) == world["applied"], _said(log)
            assert all("stack word at sp+" in why for _what, why in c["refused"]), _said(log)
    # And the storm did patch: at least one cycle made every patch under the stop (two CI runs had
    # 1 and 3 of 6 cycles refused; test_every_patch_is_applied_with_the_mach_world_stopped holds
    # each tracer, on a fresh target, to every patch).
    assert any(c["world"]["stopped"] == c["world"]["applied"] for c in log), _said(log)


def _storm(mode: str, n: int, tmp_path: Path, *options: str) -> list[dict[str, Any]]:
    """hook_storm.py for `n` cycles of `mode`: asserts no target died and no cycle hung; the log."""
    log = tmp_path / "log.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    # --work: its targets built inside this worker's temporary folder, where conftest's
    # no_program_left_running finds any a hung storm leaves running.
    res = subprocess.run([sys.executable, str(STRESS / "hook_storm.py"), "--mode", mode, "--cycles", str(n),
                          "--log", str(log), "--work", str(tmp_path), *options],
                         capture_output=True, text=True, env=env,
                         timeout=n * CYCLE_BUDGET_S)
    lines = res.stdout.strip().splitlines()
    # (CI once saw no output at all, at load ~40: the exit status and stderr say why)
    assert lines and lines[0] == "mode cycles deaths failures seconds deaths_at_injection", \
        f"exit {res.returncode}: {res.stdout}{res.stderr[-3000:]}"
    name, cycles, deaths, failures, _seconds, _at_injection = lines[1].split()
    assert (name, int(cycles)) == (mode, n)
    assert int(deaths) == 0, log.read_text()
    assert res.returncode == 0, res.stderr      # 3: a cycle hung
    cycles_log: list[dict[str, Any]] = json.loads(log.read_text())
    # A cycle that failed without a death: only Frida's stuck injection is allowed -- an attach that
    # never completes, the target alive with an earlier agent idle in it, every later attach to it
    # the same (docs/hook-storm.md, rounds 10, 13 and 26; nothing of memtrace's runs by then).  Not
    # asserted before round 26, every cycle of the leaks storm had failed on a TypeError of the
    # storm's own driver, unseen.
    failed = [c for c in cycles_log if c["failed"]]
    assert len(failed) == int(failures), _said(cycles_log)
    assert all(any("Frida's injection did not complete" in line for line in c.get("stderr") or []) for c in failed), \
        _said(failed)
    return cycles_log


@pytest.mark.slow
@pytest.mark.timeout(2 * CYCLE_BUDGET_S + 120)
def test_the_one_process_a_cycle_driver_still_runs(tmp_path: Path) -> None:
    """The older driver (one `memtrace` process a cycle), kept for comparison: 2 cycles, --pid."""
    log = tmp_path / "log.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, str(STRESS / "hook_storm.py"), "--mode", "pid", "--cycles", "2",
                          "--driver", "cli", "--log", str(log), "--work", str(tmp_path)],
                         capture_output=True, text=True, env=env,
                         timeout=2 * CYCLE_BUDGET_S)
    assert res.returncode == 0, res.stdout + res.stderr
    cycles = json.loads(log.read_text())
    assert [(c["cycle"], c["died"], c["ended"], c["rc"]) for c in cycles] == [(0, None, "completed", 0),
                                                                            (1, None, "completed", 0)], cycles


# A second script that parks one of the target's threads inside Frida's code (its listener on dup
# sleeps until told to go): a thread there may hold one of Frida's locks, so no patch may be
# made while it is held stopped.
PARK_ONE_THREAD = """
rpc.exports = { prologues(names) {
  return names.map(n => Array.from(new Uint8Array(Module.getGlobalExportByName(n).readByteArray(16))));
} };
let parked = false;
let go = false;
recv('go', () => { go = true; });
Interceptor.attach(Module.getGlobalExportByName('dup'), { onEnter() {
  if (parked)
    return;
  parked = true;
  send('parked');
  while (!go)
    Thread.sleep(0.005);
} });
"""



class ParkedRun(NamedTuple):
    """What _start_with_a_thread_parked saw: the agent's world report right after start, the bytes
    of `entries` before the agent and then, whether the target lived, what the agent said, and
    the world report of its stop."""

    held: dict[str, Any]
    pristine: list[list[int]]
    untouched: list[list[int]]
    alive: bool
    said: str
    stopped: dict[str, Any]


def _start_with_a_thread_parked(storm_exe: Path, demo_bin: Path, tracer: str, entries: list[str],
                                config: dict[str, Any]) -> ParkedRun:
    """A fds storm target, one of its threads parked for good in a JavaScript listener on dup (so
    inside Frida's code), then `tracer`'s agent started (its config updated with `config`) and, once
    the thread is let go, stopped."""
    target = _start(storm_exe, "fds", demo_bin)
    messages: list[object] = []
    try:
        session = frida.get_local_device().attach(target.pid)
        try:
            parker = session.create_script(PARK_ONE_THREAD)
            parked = threading.Event()
            parker.on("message", lambda message, data: parked.set())
            parker.load()
            assert parked.wait(30), "no storm thread entered dup"
            pristine = parker.exports_sync.prologues(entries)
            script, api = load_tracer(session, tracer, config, lambda message, data: messages.append(message))
            api.start()
            held = api.world()
            untouched = parker.exports_sync.prologues(entries)
            parker.post({"type": "go"})
            parker.unload()
            time.sleep(0.3)
            stopped = api.stop()["world"]
            script.unload()
        finally:
            session.detach()
        time.sleep(0.3)
        alive = exit_of(target) is None       # (this process is Frida's tracer: no poll(), see exit_of)
    finally:
        kill_and_reap(target)
    said = " ".join(str(m.get("payload", {}).get("message", "")) for m in messages if isinstance(m, dict))
    return ParkedRun(held, pristine, untouched, alive, said, stopped)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_refused_malloc_patch_is_tried_again_and_said_once(storm_exe: Path, demo_bin: Path) -> None:
    """The malloc tracer's redirects are the capture: a refusal (a thread stayed in Frida's code) is
    queued again and tried again (worldPatchTries times in all) before it is said.  With the thread
    parked in a listener for good, both tries are refused: the first counted apart and not said, the
    last refused, said once, and nothing of either written (the allocator's bytes as before)."""
    entries = ["malloc", "free", "calloc", "realloc"]
    run = _start_with_a_thread_parked(storm_exe, demo_bin, "malloc", entries,
                                      {"worldFridaMs": 200, "worldFridaSleepMs": 200, "worldPatchTries": 2})
    assert run.alive, "the target died"
    held = run.held
    refused = [what for what, _why in held["refused"]]
    assert refused.count("malloc hooks in") == 1, held["refused"]
    assert held["frida_refused_retried"] == 1, held       # the first try, tried again
    assert held["frida_busy"] == 0 and held["running"] == 0, held
    assert run.said.count("malloc hooks in: not patched") == 1, run.said
    assert run.untouched == run.pristine, dict(zip(entries, zip(run.pristine, run.untouched, strict=True),
                                                   strict=True))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_patch_is_refused_while_a_thread_stays_in_fridas_code(storm_exe: Path, demo_bin: Path) -> None:
    """The strict stop backs off and tries again while a stopped thread is inside Frida's code; when
    its budget runs out the patch is refused -- counted, named, said -- never made with that thread
    held (frida_busy stays 0).  The fds tracer: its listeners, the execve hook and the descriptor
    guard's redirects are all made by applyPatches once the world is stopped, so a refusal leaves
    the target untouched (the bytes of every entry they would rewrite are as before) and says so.
    Once the thread is let go, what did go in comes out stopped."""
    entries = ["execve", "close", "close_range", "dup2", "dup3", "open", "socket", "pipe"]
    # The default budgets (2 s of stops, 2 s more of sleeps where nothing is queued): the stop that
    # follows, with a hot JavaScript listener gone, must not be refused.
    run = _start_with_a_thread_parked(storm_exe, demo_bin, "fds", entries, {})
    held, untouched, pristine, said, world = run.held, run.untouched, run.pristine, run.said, run.stopped
    assert run.alive, "the target died"
    # Every patch of the start was refused, none made with the thread held or with the world running.
    refused = [what for what, _why in held["refused"]]
    assert refused == ["execve hook in", "descriptor guard in", "fds hooks in"], held
    assert held["frida_refused"] == 3 and held["frida_busy"] == 0, held
    assert held["stopped"] == 0 and held["running"] == 0 and held["log"] == [], held
    assert all("thread(s) stayed inside Frida's code" in why for _what, why in held["refused"]), held
    # ... and each says which thread, by what and where to: a storm thread (the parked one, or one
    # waiting for the script's lock to run the same listener), by Frida's code on its stack.
    # (Where the kernel has it waiting, when it is, is said in brackets after its name; never the
    # main thread, nor Frida's.)
    assert all(re.search(r'the first: thread \d+ "hook_storm"( \(waiting in \w+\))?, '
                         r'(stack word at sp\+0x[0-9a-f]+|register \w+) = '
                         r'.*frida-agent code\+0x[0-9a-f]+', why) for _what, why in held["refused"]), held["refused"]
    assert held["frida_retries"] > 0 and held["frida_sleeps"] > 0, held    # it backed off and tried again
    assert "fds hooks in: not patched" in said and "hook(s) left out" in said, said
    # Nothing was queued ahead of the stop: the refusal took it all back, and the target is untouched.
    assert "written by Frida with the world running" not in said, said
    assert said.count("the target is untouched") == 3, said
    assert untouched == pristine, dict(zip(entries, zip(pristine, untouched, strict=True), strict=True))
    # Once the thread was let go: nothing went in, nothing had to come out but the guard's (empty) patch.
    assert world["frida_busy"] == 0 and world["frida_refused"] == 3, world
    outs = [what for what, _n in world["log"]]
    assert "execve hook out" not in outs and "execve hook in" not in outs, world
