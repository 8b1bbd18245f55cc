"""``memtrace purgeable`` on the scenario programs driving the Darwin stand-in (exact counts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.conftest import frame_names, memtrace_json

MIB = 1024 * 1024
DARWIN_ONLY = ["vm_purgable_control", "mach_vm_purgable_control", "vm_allocate", "mach_vm_allocate",
               "mach_vm_map", "IOSurfaceSetPurgeable", "CABackingStoreSetVolatile",
               "CA::Render::Shmem::new_shmem", "CA::Render::Shmem::set_volatile", "IOSurfaceGetAllocSize"]


def run(demo_bin: Path, tmp_path: Path, program: str, *extra: str) -> dict[str, Any]:
    return memtrace_json("purgeable", "--device", "local", "--window", "30", "--out", tmp_path / "c", *extra,
                         "--", demo_bin / program)


def callers(rows: list[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], tuple[int, int | None]]:
    """{(key..., caller): (count, bytes)} from by_caller-style rows (one row per stack: summed per caller)."""
    out: dict[tuple[Any, ...], tuple[int, int | None]] = {}
    for r in rows:
        key = (*(r[k] for k in keys), r["caller"])
        count, nbytes = out.get(key, (0, 0))
        out[key] = (count + r["count"], None if nbytes is None or r.get("bytes") is None else nbytes + r["bytes"])
    return out


def test_sqlite_cache_bounces_0_1(demo_bin: Path, tmp_path: Path) -> None:
    s = run(demo_bin, tmp_path, "scn_sqlite_cache")
    assert s["ended"] == "target-exited"
    assert s["missing"] == []
    assert s["transitions"] == {"0->1": 200, "1->0": 200}
    assert s["transition_bytes"] == {"0->1": 200 * MIB, "1->0": 200 * MIB}
    assert s["set_calls"] == 400
    assert s["get_calls"] == 100
    assert s["controls"]["vm_purgable_control"]["set"] == 400
    assert s["controls"]["vm_purgable_control"]["get"] == 100
    assert s["controls"]["mach_vm_purgable_control"] == {"set": 0, "get": 0, "purge_all": 0,
                                                         "set_from_kernel": 0, "other": 0}
    assert s["created_purgeable"] == 4
    assert s["created_bytes"] == 4 * MIB
    assert callers(s["created_by"], "entry") == {("vm_allocate", "sqlite_pcache_create"): (4, 4 * MIB)}
    assert s["creation_calls"] == {"vm_allocate": 4, "mach_vm_allocate": 0, "mach_vm_map": 0}
    assert callers(s["by_caller"], "entry", "transition") == {
        ("vm_purgable_control", "0->1", "sqlite3_db_release_memory"): (100, 100 * MIB),
        ("vm_purgable_control", "0->1", "sqlite_pcache_unpin"): (100, 100 * MIB),
        ("vm_purgable_control", "1->0", "sqlite_pcache_fetch_page"): (200, 200 * MIB),
    }
    assert s["stolen"] == {"count": 0, "bytes": 0}
    assert s["madvise"] == {}
    assert s["framework_calls"] == {}


def test_ca_backing_stores_stolen_and_reacquired(demo_bin: Path, tmp_path: Path) -> None:
    s = run(demo_bin, tmp_path, "scn_ca_backing")
    assert s["missing"] == []
    assert s["transitions"] == {"0->1": 12, "1->0": 4, "2->0": 8}
    assert s["transition_bytes"] == {"0->1": 7864320, "1->0": 2621440, "2->0": 5242880}
    assert s["stolen"] == {"count": 8, "bytes": 5242880}
    assert s["set_calls"] == 24
    assert s["get_calls"] == 0
    assert s["controls"]["vm_purgable_control"]["set"] == 0
    # Every transition's direct caller is CA's set_volatile, found by its demangled name.
    assert callers(s["by_caller"], "entry", "transition") == {
        ("mach_vm_purgable_control", "0->1", "CA::Render::Shmem::set_volatile"): (12, 7864320),
        ("mach_vm_purgable_control", "2->0", "CA::Render::Shmem::set_volatile"): (8, 5242880),
        ("mach_vm_purgable_control", "1->0", "CA::Render::Shmem::set_volatile"): (4, 2621440),
    }
    # ... and the frame above it is a real caller (one row per business path: the app's layer
    # update, and CABackingStoreSetVolatile), never an Interceptor trampoline (set_volatile itself
    # is hooked too).
    assert {frame_names(r["frames"])[1] for r in s["by_caller"]} == {
        "ca_layer_backing_update (scn_ca_backing)", "CABackingStoreSetVolatile (libmtdarwin.so)"}
    assert s["created_purgeable"] == 12
    assert s["created_bytes"] == 7864320
    assert callers(s["created_by"], "entry") == {("mach_vm_allocate", "CA::Render::Shmem::new_shmem"): (12, 7864320)}
    fw = {entry: {caller: n for (caller,), (n, _) in callers(v["by_caller"]).items()}
          for entry, v in s["framework_calls"].items()}
    assert fw == {
        "CA::Render::Shmem::set_volatile": {"ca_layer_backing_update": 20, "CABackingStoreSetVolatile": 4},
        "CA::Render::Shmem::new_shmem": {"ca_layer_backing_create": 12},
        "CABackingStoreSetVolatile": {"ca_context_background_stores": 4},
    }
    assert s["madvise"] == {}


def test_network_empties_segments_and_madvise_line(demo_bin: Path, tmp_path: Path) -> None:
    s = run(demo_bin, tmp_path, "scn_network", "--standin-madvise")
    assert s["missing"] == []
    assert s["transitions"] == {"0->2": 18, "2->0": 18}
    assert s["transition_bytes"] == {"0->2": 18 * 65536, "2->0": 18 * 65536}
    assert s["set_calls"] == 36
    assert s["get_calls"] == 36
    assert s["controls"]["mach_vm_purgable_control"]["get"] == 36
    assert callers(s["by_caller"], "entry", "transition") == {
        ("mach_vm_purgable_control", "0->2", "nw_segment_empty"): (18, 1179648),
        ("mach_vm_purgable_control", "2->0", "nw_segment_reacquire"): (18, 1179648),
    }
    assert s["created_purgeable"] == 6
    assert s["created_bytes"] == 6 * 65536
    assert s["creation_calls"] == {"vm_allocate": 0, "mach_vm_allocate": 0, "mach_vm_map": 6}
    # libc madvise with Linux advice values: its own line, never a transition.
    assert s["madvise_platform"] == "linux"
    assert s["madvise"] == {"8": 2, "4": 3, "20": 1, "21": 1}
    assert s["madvise_bytes"] == {"8": 131072, "4": 196608, "20": 65536, "21": 65536}
    assert s["madvise_names"] == {"8": "MADV_FREE", "4": "MADV_DONTNEED", "20": "MADV_COLD", "21": "MADV_PAGEOUT"}
    assert s["madvise_all_advice"] == {"4": 3, "8": 2, "20": 1, "21": 1}
    assert callers(s["madvise_by_caller"], "entry", "advice") == {
        ("madvise", 8, "nw_buffer_trim"): (2, 131072),
        ("madvise", 4, "nw_buffer_trim"): (3, 196608),
        ("madvise", 20, "nw_buffer_trim"): (1, 65536),
        ("madvise", 21, "nw_buffer_trim"): (1, 65536),
        ("mtdarwin_madvise", 7, "nw_buffer_recycle"): (4, 262144),
        ("mtdarwin_madvise", 5, "nw_buffer_recycle"): (3, 196608),
        ("mtdarwin_madvise", 8, "nw_buffer_recycle"): (2, 131072),
    }
    assert s["madvise_standin"] == {"7": 4, "5": 3, "8": 2}


def test_network_without_standin_flag_sees_no_darwin_madvise(demo_bin: Path, tmp_path: Path) -> None:
    s = run(demo_bin, tmp_path, "scn_network")
    assert s["madvise_standin"] == {}
    assert s["madvise"] == {"8": 2, "4": 3, "20": 1, "21": 1}


def test_camera_surface_purgeable(demo_bin: Path, tmp_path: Path) -> None:
    s = run(demo_bin, tmp_path, "scn_camera")
    # IOSurfaceSetPurgeable is applied "from the kernel": the trap entries see nothing.
    assert s["set_calls"] == 0
    assert s["get_calls"] == 0
    assert s["transitions"] == {"0->1": 6, "2->0": 3}
    assert s["transition_bytes"] == {"0->1": 74678272, "2->0": 37339136}
    assert s["keep_current"] == 1
    assert s["by_entry"] == {"IOSurfaceSetPurgeable": {"0->1": 6, "2->0": 3, "keep_current": 1}}
    assert callers(s["by_caller"], "entry", "transition") == {
        ("IOSurfaceSetPurgeable", "0->1", "camera_pool_mark_purgeable"): (6, 74678272),
        ("IOSurfaceSetPurgeable", "2->0", "camera_pool_reclaim"): (3, 37339136),
    }
    assert s["stolen"] == {"count": 3, "bytes": 37339136}
    assert s["created_purgeable"] == 0


def test_plain_glibc_program_lists_darwin_entries_missing(demo_bin: Path, tmp_path: Path) -> None:
    s = run(demo_bin, tmp_path, "workload")
    assert s["ended"] == "target-exited"
    assert sorted(s["missing"]) == sorted(DARWIN_ONLY)
    assert "madvise" not in s["missing"]
    assert s["transitions"] == {}
    assert s["set_calls"] == 0


def test_allocator_trimming_madvise_inside_glibc_does_not_take_the_target_down(demo_bin: Path, tmp_path: Path) -> None:
    """camera_surfaces frees on a second thread: glibc trims that arena with madvise while holding
    its lock.  Those calls are counted, never streamed into JavaScript, and the app finishes."""
    s = run(demo_bin, tmp_path, "camera_surfaces")
    assert s["ended"] == "target-exited"
    assert s["transitions"] == {"0->1": 8, "2->0": 4}
    rows: dict[tuple[str, str], int] = {}
    for r in s["by_caller"]:
        key = (r["transition"], r["frames"][0]["function"])
        rows[key] = rows.get(key, 0) + r["count"]
    assert rows == {("0->1", "frame_cache_make_purgeable"): 6, ("2->0", "frame_cache_reacquire"): 4,
                    ("0->1", "camera_session_configure"): 2}


def standin_program(compile_c, demo_bin: Path, name: str) -> Path:
    """A tests/programs/ program linked against the stand-in libraries (libmtmalloc on libmtdarwin)."""
    darwin = Path(__file__).resolve().parents[2] / "demo" / "darwin"
    return compile_c(name, "-I", str(darwin), "-L", str(demo_bin), "-lmtmalloc", "-lmtdarwin",
                     f"-Wl,-rpath,{demo_bin}")


@pytest.mark.smoke
def test_stand_in_nests_as_xnu_and_each_call_counts_once(demo_bin: Path, tmp_path: Path) -> None:
    """vm_purgable_control calls mach_vm_purgable_control and vm_allocate calls mach_vm_allocate in the
    stand-in, as in xnu's libsyscall: the inner calls are counted apart, never twice."""
    s = run(demo_bin, tmp_path, "scn_sqlite_cache")
    assert s["set_calls"] == 400 and s["get_calls"] == 100
    assert s["nested_calls"] == {"mach_vm_purgable_control": 500, "mach_vm_allocate": 4}
    assert s["creation_calls"] == {"vm_allocate": 4, "mach_vm_allocate": 0, "mach_vm_map": 0}


def test_overloads_allocator_madvise_and_swift_async_frames(compile_c, demo_bin: Path, tmp_path: Path) -> None:
    prog = standin_program(compile_c, demo_bin, "standin_purgeable")
    s = memtrace_json("purgeable", "--device", "local", "--window", "30", "--out", tmp_path / "c",
                      "--standin-madvise", "--", prog)
    assert s["ended"] == "target-exited"
    # Both overloads of new_shmem, each hooked by its own mangled name (the port one fails to map
    # for port 7, but is still called).
    rows = s["framework_calls"]["CA::Render::Shmem::new_shmem"]["by_caller"]
    assert s["framework_calls"]["CA::Render::Shmem::new_shmem"]["calls"] == 4
    assert {caller: n for (caller,), (n, _) in callers(rows).items()} == {
        "mtdarwin_shmem_new": 2, "mtdarwin_shmem_new_port": 2}
    assert {r["frames"][1]["function"] for r in rows} == {"create_layers"}
    assert "_ZN2CA6Render5Shmem9new_shmemEjm" not in s["missing"]
    assert s["created_purgeable"] == 4          # 2 + 1 through the overloads, 1 vm_allocate
    # mach_vm_map: both port overload calls (port 7 refused) and libmtmalloc's one large region
    # (the second 1 MiB malloc comes from its cache).
    assert s["creation_calls"] == {"vm_allocate": 1, "mach_vm_allocate": 2, "mach_vm_map": 3}
    # libmtmalloc's own madvise (REUSABLE on each free, REUSE on reuse) is counted, never streamed;
    # the app's own is streamed with its caller.
    assert s["madvise_allocator_internal"] == 3      # REUSABLE, REUSE, REUSABLE
    assert s["madvise_standin"] == {"7": 1}
    assert callers(s["madvise_by_caller"], "entry", "advice") == {("mtdarwin_madvise", 7, "app_recycle"): (1, 65536)}
    # The transition's stack goes on past the frame whose saved frame pointer has Swift's bit 60.
    (row,) = s["by_caller"]
    names = [f["function"] for f in row["frames"]]
    assert names[:4] == ["set_in_async", "swift_like_async_frame", "async_outer", "main"]


def test_hook_table_takes_mach_o_section_symbols_and_every_overload(compile_c) -> None:
    """frida-gum lists a Mach-O module's defined symbols as type 'section' (gum_emit_symbol: N_SECT),
    with section ids like "1.__TEXT.__text": the Core Animation hook table takes those in __TEXT,
    matches each overload by its full mangled name and finds its size argument."""
    import frida

    from memtrace.agentbuild import build_agent

    device = frida.get_local_device()
    pid = device.spawn([str(compile_c("steady"))], stdio="pipe")
    session = device.attach(pid)
    try:
        script = session.create_script(build_agent("purgeable").source)
        script.load()
        text, data = {"id": "1.__TEXT.__text", "protection": "r-x"}, {"id": "9.__DATA.__data", "protection": "rw-"}
        symbols = [
            {"name": "_ZN2CA6Render5Shmem9new_shmemEm", "type": "section", "section": text, "address": "0x1000"},
            {"name": "__ZN2CA6Render5Shmem9new_shmemEjm", "type": "section", "section": text, "address": "0x2000"},
            {"name": "_ZN2CA6Render5Shmem9new_shmemEjmb", "type": "section", "section": data, "address": "0x3000"},
            {"name": "_ZN2CA6Render5Shmem9new_shmemEm", "type": "undefined", "address": "0x0"},
            {"name": "_ZN2CA6Render5Shmem12set_volatileEbPi", "type": "section", "section": text, "address": "0x4000"},
            {"name": "_ZN2CA6Render7Shmem2X9new_shmemEm", "type": "function", "address": "0x5000"},
        ]
        api = script.exports_sync
        got = api.match_cxx_overloads(symbols, "CA::Render::Shmem::new_shmem", False)
        assert got == [
            {"name": "_ZN2CA6Render5Shmem9new_shmemEjm", "address": "0x2000",
             "params": ["unsigned int", "unsigned long"], "sizeArg": 1},
            {"name": "_ZN2CA6Render5Shmem9new_shmemEm", "address": "0x1000", "params": ["unsigned long"], "sizeArg": 0},
        ]
        assert api.match_cxx_overloads(symbols, "CA::Render::Shmem::set_volatile", True) == [
            {"name": "_ZN2CA6Render5Shmem12set_volatileEbPi", "address": "0x4000", "params": ["bool", "int*"],
             "sizeArg": None}]
    finally:
        session.detach()
        device.kill(pid)


def test_a_burst_of_streamed_calls_ends_as_events_or_counted_drops(compile_c, demo_bin: Path, tmp_path: Path) -> None:
    """The C listeners never enter JavaScript (the purgeable storm's hangs: the target's threads
    queued on the script's lock against the agent's own thread): each streamed call takes a slot of
    the agent's ring, and one that finds the ring full is dropped and counted.  4 threads x 3000
    purgeable vm_allocate + SET calls, back to back: every one is an event or a counted drop."""
    prog = standin_program(compile_c, demo_bin, "purgeable_burst")
    s = memtrace_json("purgeable", "--device", "local", "--window", "60", "--out", tmp_path / "c", "--", prog)
    assert s["ended"] == "target-exited"
    calls = 4 * 3000
    assert s["creation_calls"]["vm_allocate"] == calls and s["set_calls"] == calls
    events = s["created_purgeable"] + sum(s["transitions"].values())
    assert events + s["events_dropped"] == 2 * calls
    assert s["transitions"].keys() <= {"0->1"}
    assert {caller for (caller,) in callers(s["by_caller"])} <= {"burst"}
    assert {r["caller"] for r in s["created_by"]} <= {"burst"}
