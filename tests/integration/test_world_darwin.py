"""The Darwin stop-the-world, run here: cmodule/world.c built with MT_DARWIN against the Darwin
stand-in's Mach calls (demo/darwin/mtmach.c: task_threads, thread_suspend/resume,
thread_get_state, mach_port_deallocate, mach_vm_read_overwrite, mach_vm_region_recurse,
mach_absolute_time with xnu's semantics), driven by tests/programs/world_darwin/standin_world.c.

What the agent does around every patch on a device (agents/runtime/world.js; DEVICE-UNVERIFIED
there): a function's first bytes are rewritten one byte at a time -- a writer that is not atomic,
as Frida's Darwin writers are not for a thread running the bytes -- while four threads call it in a
loop.  With the world running (a child process) a thread runs a half-written prologue and dies;
with the world stopped clear of the bytes, none does.  The same stop, end to end through Frida and
the agent, is in tests/integration/test_hook_storm.py (the storms with MEMTRACE_WORLD_MACH).
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from tests.conftest import ROOT

from memtrace.agentbuild import c_layout_header
from memtrace.layout import WORLD_REGS

HARNESS = ROOT / "tests" / "programs" / "world_darwin"
PATCHES = 300


@pytest.mark.slow       # ~18 s on 2 CPUs: the control's storm and 300 stopped rewrites
def test_patches_under_the_mach_stop_kill_nothing_that_the_running_world_does(tmp_path: Path) -> None:
    (tmp_path / "mt_layout.h").write_text(c_layout_header())
    exe = tmp_path / "standin_world"
    subprocess.run(["gcc", "-O1", "-g", "-pthread", "-Wall", "-Werror", "-Wno-unused-function",
                    "-I", str(tmp_path), "-I", str(ROOT / "tests" / "programs" / "leaks_darwin"),
                    "-I", str(ROOT / "cmodule"), "-o", str(exe),
                    str(HARNESS / "standin_world.c"), str(ROOT / "demo" / "darwin" / "mtmach.c")], check=True)
    run = subprocess.run([str(exe), str(PATCHES)], capture_output=True, text=True, timeout=600)
    # The harness itself dying is a thread that ran half-written bytes under the stop.
    assert run.returncode == 0, (run.returncode, run.stderr)
    doc = json.loads(run.stdout)
    # The control: the same byte-at-a-time rewriting with the world running kills the program.
    assert doc["control_signaled"] == 1, doc
    assert doc["control_signal"] in (signal.SIGSEGV, signal.SIGTRAP, signal.SIGILL, signal.SIGBUS, signal.SIGABRT), doc
    # Plain stops do catch threads inside the bytes (what mt_world_stop_clear lets go and catches
    # again); "Frida's" thread is never held and runs on while the others are frozen.
    assert doc["looks"] == 200 and doc["inside"] > 0, doc
    assert doc["frida_held"] == 0 and doc["frida_ran_stopped"] == 4 and doc["frozen"] == 1, doc
    # Every rewrite made with the world stopped clear, all four callers held each time, and alive.
    assert (doc["patches"], doc["stopped"], doc["not_clear"]) == (PATCHES, PATCHES, 0), doc
    assert doc["held_min"] == 4 and doc["callers_ran"] == 4, doc
    # A thread started after the listing: the stop is let go (MT_WORLD_STOP_NEW), nothing held.
    assert (doc["new_got"], doc["module_suspended_after_new"]) == (2, 0), doc
    # A thread started while the world is stopped (xnu's workqueue threads): seen as neither held
    # nor Frida's by the look the checked stop makes before it says clear.
    assert (doc["unheld_before"], doc["unheld_after"]) == (0, 1), doc
    # A thread that will return into the module from a sleep counts (a word of its stack), then not.
    assert (doc["refs_in"], doc["refs_out"]) == (1, 0), doc
    # A strict stop with a thread inside "Frida's code": refused (MT_WORLD_STOP_BUSY), that thread
    # named and let go; once it has left, clear.
    assert (doc["busy_got"], doc["busy_n"], doc["busy_first_is_parked"]) == (3, 1, 1), doc
    assert (doc["parked_suspended_after_busy"], doc["clear_got"]) == (0, 1), doc
    # The strict stop counts a stack word into "Frida's code" only where it can be a return address,
    # below no signal frame (world.c mt_world_thread_ref, returns_only), once the signal-return code
    # is known; before, every word (each triple: none known, a wrong one, the right one).  A pointer
    # to a function's first byte in a live frame: busy, then not; a return address after a call:
    # busy; a pc interrupted by a signal, saved in the frame above the handler's: busy, and dismissed
    # only when the signal frame goes unseen (the wrong range -- the control).
    assert doc["pointer_got"] == [3, 1, 1] and doc["pointer_busy_where"] >= WORLD_REGS, doc
    assert (doc["called_got"], doc["called_busy_is_it"]) == (3, 1), doc
    assert doc["signaled_got"] == [3, 1, 3] and doc["signaled_busy_is_it"] == 1, doc
    # Code about to be freed: every word counts, the function pointer too (mt_world_refs) -- but
    # not one at the very start of an "open" range (an entry only our code calls: a trampoline,
    # mt_world_refs_open), while a return address inside one still does.
    assert (doc["refs_pointer"], doc["refs_pointer_open"], doc["refs_called_open"]) == (1, 0, 1), doc
    # ... and a pc saved in a signal frame at an open range's start (where the thread resumes)
    # counts: with no signal-return code known, and with the right one; only the control (a wrong
    # one: the frame unseen) dismisses it.
    assert doc["refs_saved_open"] == [1, 0, 1], doc
    # The quiesce with return addresses only (process.c's module, mt_world_refs_open returns_only):
    # the pointer's thread does not count; the caller's and the signalled thread's do.
    assert doc["refs_returns"] == [0, 1, 1], doc
    # A register other than the pc at an open range's very start (the pointer TinyCC's code called a
    # trampoline through, left in r11 by a thread spinning on) is no reference; where the range is
    # not open it is, and a pc at an open range's start always is.
    assert (doc["refs_register"], doc["refs_register_open"], doc["refs_pc_open"]) == (1, 0, 1), doc
    # The clock: 24 MHz ticks through the 125/3 timebase, in microseconds (a 0.2 s sleep).
    assert 150_000 <= doc["slept_us"] < 30_000_000, doc
    # Frida's code found by its VM region (no /proc/self/maps on Darwin).
    assert (doc["frida_code_found"], doc["frida_code_has_gum"]) == (1, 1), doc
    # Darwin's code writer (no RWX pages on iOS): through a writable alias of the page, which stays
    # executable; the stand-in aliases shared pages only, so a private page is refused, not written.
    assert (doc["alias_wrote"], doc["alias_before"], doc["alias_after"]) == (1, 7, 9), doc
    assert doc["wrote"] == 0, doc
    # Every send right task_threads handed out was released (port names, not thread ids).
    assert doc["rights_released"] == 1 and doc["names_are_not_tids"] == 1, doc


def test_a_suspend_given_up_on_leaves_no_stop_behind(tmp_path: Path) -> None:
    """The stand-in's thread_suspend of a thread that blocks its signal gives up after its deadline;
    the queued signal arrives later and stops nothing, a later suspend holds the thread by its own
    signal (registers read, the thread still), and resume lets it run (standin_suspend.c)."""
    exe = tmp_path / "standin_suspend"
    subprocess.run(["gcc", "-O1", "-g", "-pthread", "-Wall", "-Werror", "-I", str(ROOT / "demo" / "darwin"),
                    "-o", str(exe), str(HARNESS / "standin_suspend.c"), str(ROOT / "demo" / "darwin" / "mtmach.c")],
                   check=True)
    doc = json.loads(subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True).stdout)
    kern_failure = 5
    assert (doc["blocked_kr"], doc["count_after_failure"], doc["ran_after_late_signal"]) == (kern_failure, 0, 1), doc
    assert (doc["kr"], doc["state_kr"], doc["ran_while_held"]) == (0, 0, 0), doc
    assert (doc["resume_kr"], doc["ran_after_resume"]) == (0, 1), doc
