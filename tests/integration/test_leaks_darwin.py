"""The leak scan's Darwin path, run here: cmodule/leaks.c built with MT_DARWIN against the Darwin
stand-in's Mach calls (demo/darwin/mtmach.c: task_threads, thread_suspend/resume,
thread_get_state, mach_port_deallocate, mach_vm_read_overwrite, mach_vm_region_recurse with xnu's
semantics and struct layouts, and a malloc zone whose introspection enumerator lists its blocks),
driven by tests/programs/leaks_darwin/standin_leaks.c.

On a device this is DEVICE-UNVERIFIED; what runs here is the C the agent compiles there, on the
stand-in: the app's threads suspended (and their registers read) while "Frida's" runs on, stacks
found by vm_region_submap_info_64's user_tag (word 5: the struct is #pragma pack(4)) and scanned
from the suspended thread's sp, signed pointers stripped, every right task_threads gave released.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import ROOT

from memtrace.agentbuild import c_layout_header

HARNESS = ROOT / "tests" / "programs" / "leaks_darwin"


def test_the_darwin_stop_the_world_and_scan_on_the_standin(tmp_path: Path) -> None:
    (tmp_path / "mt_layout.h").write_text(c_layout_header())
    exe = tmp_path / "standin_leaks"
    subprocess.run(["gcc", "-O1", "-g", "-pthread", "-Wall", "-Werror", "-Wno-unused-function",
                    "-I", str(tmp_path), "-I", str(HARNESS), "-I", str(ROOT / "cmodule"), "-o", str(exe),
                    str(HARNESS / "standin_leaks.c"), str(ROOT / "demo" / "darwin" / "mtmach.c")], check=True)
    doc = json.loads(subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True).stdout)
    # The region's user_tag is word 5; word 4 is the high half of the 8-byte offset before it.
    assert (doc["tag"], doc["info_word5"], doc["info_word4"]) == (30, 30, 0)
    # The sleeper and the busy thread suspended (registers read: the sleeper's sp in its stack);
    # "Frida's" thread never suspended and ran on meanwhile; the busy thread did not, then did.
    assert (doc["threads_stopped"], doc["threads_failed"]) == (2, 0)
    assert (doc["busy_suspended"], doc["frida_suspended"]) == (1, 0)
    assert doc["busy_frozen"] and doc["frida_ran"] and doc["busy_resumed"]
    assert doc["sleeper_sp_in_its_stack"]
    # The verdicts: dropped blocks lost; a global's, a suspended thread's local's (its stack scanned
    # from its sp only: the rest of the stacks skipped) and a signed pointer's block reachable.
    assert doc["lost"] == ["definitely_lost"] * 5
    assert (doc["kept"], doc["on_stack"], doc["signed"]) == ("reachable", "reachable", "reachable")
    assert doc["skip_stack"] > 0
    assert doc["signed_unstripped"] == "definitely_lost"
    # The one-call scan (no JavaScript while stopped) agrees, and resumes every thread.
    assert doc["scan_all_complete"] == 1 and doc["scan_all_stopped"] == 2
    assert (doc["scan_all_lost"], doc["scan_all_on_stack"]) == ("definitely_lost", "reachable")
    assert doc["sleeper_suspended_after"] == 0
    # Blocks from before tracing, from the zones' enumerators (libmalloc's introspection): sorted
    # too, and a traced block the zone also lists counted once.
    assert doc["before"] == ["definitely_lost", "definitely_lost"] and doc["kept_before"] == "reachable"
    assert (doc["untracked"], doc["candidates"]) == (4, 8 + 4)
    # Every send right task_threads handed out was released: only libpthread's remains.
    assert doc["refs"] == [1, 1, 1]
