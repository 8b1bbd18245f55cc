"""memtrace.layout is the one source of every layout the agent's C, its JavaScript and the host
share: the generated C header compiled by a real C compiler, the generated layout.js, the
capture reader, and the copies that live outside the agent (the Linux stand-in, the purgeable
analyzer) are all held to it here."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from memtrace import agentbuild, capture, layout
from memtrace.analyze import purgeable as purgeable_analyzer

ROOT = Path(__file__).resolve().parents[2]

# The guint* names the header uses; TinyCC and Frida's gcc toolchain get them from Frida's glib.h.
FAKE_GLIB = """\
typedef unsigned char guint8; typedef unsigned short guint16; typedef unsigned int guint32;
typedef int gint32; typedef unsigned long long guint64; typedef long long gint64;
#include <stddef.h>
#include <stdio.h>
"""


def _header_defines() -> dict[str, int]:
    return {m.group(1): int(m.group(2).rstrip("u"), 0)
            for m in re.finditer(r"^#define (MT_\w+) (\S+)$", agentbuild.c_layout_header(), re.M)}


@pytest.fixture(scope="module")
def compiled_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """What gcc makes of the generated header: every #define's value, every struct's sizeof and
    every field's offsetof, printed by a program compiled from the header itself."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to check the generated C header")
    d = tmp_path_factory.mktemp("layout")
    (d / "glib.h").write_text(FAKE_GLIB)
    lines = [agentbuild.c_layout_header(), "int main (void) {"]
    lines += [f'  printf ("{n} %llu\\n", (unsigned long long) ({n}));' for n in _header_defines()]
    for s in layout.C_STRUCTS:
        lines.append(f'  printf ("sizeof {s.c_name} %zu\\n", sizeof ({s.c_name}));')
        lines += [f'  printf ("offsetof {s.c_name}.{f} %zu\\n", offsetof ({s.c_name}, {f}));' for f, _ in s.fields]
    lines += ["  return 0;", "}"]
    (d / "probe.c").write_text("\n".join(lines) + "\n")
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-I", str(d), "-o", str(d / "probe"), str(d / "probe.c")],
                   check=True)
    out = subprocess.run([str(d / "probe")], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.rsplit(" ", 1) for line in out.splitlines())}


def test_c_structs_have_the_offsets_of_the_python_formats(compiled_layout: dict[str, int]) -> None:
    for s in layout.C_STRUCTS:
        assert compiled_layout[f"sizeof {s.c_name}"] == s.size == struct.calcsize(s.format), s.c_name
        for name, offset in s.offsets.items():
            assert compiled_layout[f"offsetof {s.c_name}.{name}"] == offset, f"{s.c_name}.{name}"
    # The sizes the capture reader steps by are the C writer's.
    assert (compiled_layout["sizeof MtAllocRecord"], compiled_layout["sizeof MtFreeRecord"],
            compiled_layout["sizeof MtStackRecord"], compiled_layout["sizeof MtChunkHeader"]) == (32, 24, 8, 8)


def test_python_reader_agrees_with_the_c_writer(compiled_layout: dict[str, int]) -> None:
    c = compiled_layout
    assert (c["MT_REC_PAD"], c["MT_REC_STACK"], c["MT_REC_ALLOC"], c["MT_REC_FREE"]) == (
        capture.REC_PAD, capture.REC_STACK, capture.REC_ALLOC, capture.REC_FREE)
    assert (c["MT_FLAG_LIVE"], c["MT_FLAG_SAMPLED"], c["MT_FLAG_TRUNCATED"]) == (
        capture.FLAG_LIVE, capture.FLAG_SAMPLED, capture.FLAG_TRUNCATED)
    assert (c["MT_NO_STACK"], c["MT_DROPPED_STACK"]) == (capture.NO_STACK, capture.DROPPED_STACK)
    kinds = {v: k[5:].lower() for k, v in c.items() if k.startswith("MT_K_")}
    assert kinds == capture.KIND_NAMES
    assert (c["MT_C_CALLS"], c["MT_C_BYTES"], c["MT_C_TIER_CALLS"], c["MT_C_TIER_BYTES"]) == (
        capture.C_CALLS, capture.C_BYTES, capture.C_TIER_CALLS, capture.C_TIER_BYTES)
    for index, name in capture.COUNTER_NAMES.items():
        assert c["MT_C_" + name.upper()] == index
    tiers = [c[f"MT_TIER_MAX_{i}"] for i in range(c["MT_N_TIERS"] - 1)]
    assert tuple(tiers) + (None,) == capture.TIER_MAX_BYTES
    # Per-kind and per-tier counters fit the counter array, below the named ones.
    assert c["MT_C_BYTES"] + c["MT_N_KINDS"] <= c["MT_C_TIER_CALLS"]
    assert c["MT_C_TIER_BYTES"] + c["MT_N_TIERS"] <= min(capture.COUNTER_NAMES) < max(capture.COUNTER_NAMES) < c[
        "MT_N_COUNTERS"]
    assert max(layout.KINDS.values()) < layout.N_KINDS


def test_counters_by_name_are_the_slots_the_c_core_bumps(compiled_layout: dict[str, int]) -> None:
    """Python indexes per-kind and per-tier counters by name (layout.calls_at & co); each is the slot
    the C core computes from the header, and no two name the same slot."""
    c = compiled_layout
    seen: list[int] = list(layout.COUNTERS.values())
    for name in layout.KINDS:
        k = c[f"MT_K_{name.upper()}"]
        assert layout.calls_at(name) == c["MT_C_CALLS"] + k
        assert layout.bytes_at(name) == c["MT_C_BYTES"] + k
        assert layout.failed_at(name) == c["MT_C_FAILED"] + k
        seen += [layout.calls_at(name), layout.bytes_at(name), layout.failed_at(name)]
    for tier in range(layout.N_TIERS):
        assert layout.tier_calls_at(tier) == c["MT_C_TIER_CALLS"] + tier
        assert layout.tier_bytes_at(tier) == c["MT_C_TIER_BYTES"] + tier
        seen += [layout.tier_calls_at(tier), layout.tier_bytes_at(tier)]
    assert len(set(seen)) == len(seen) and max(seen) < c["MT_N_COUNTERS"]
    with pytest.raises(KeyError):
        layout.calls_at("mmap")
    with pytest.raises(IndexError):
        layout.tier_bytes_at(layout.N_TIERS)


def test_cmodule_sources_define_nothing_the_layout_header_does() -> None:
    """A #define of a layout name in cmodule/ would be a second source (and shadow the first)."""
    generated = set(_header_defines()) | {s.c_name for s in layout.C_STRUCTS}
    for path in sorted((ROOT / "cmodule").glob("*.c")):
        text = path.read_text()
        own = set(re.findall(r"^#define (\w+)", text, re.M)) | set(re.findall(r"}\s*(Mt\w+);", text))
        own |= set(re.findall(r"struct _(Mt\w+)\s*\{", text))
        assert not own & generated, f"{path.name} redefines {sorted(own & generated)}"
        # Record fields are written through the generated structs, never at hand-counted offsets.
        assert not re.search(r"\*\s*\(guint(16|32|64) \*\)\s*\(rec \+", text), path.name


def test_layout_js_exports_every_constant_with_python_values() -> None:
    module = agentbuild.js_layout_module()
    exported = {}
    for line in module.splitlines()[1:]:
        m = re.fullmatch(r"export const (\w+) = (.*);", line)
        assert m, line
        exported[m.group(1)] = json.loads(m.group(2))
    assert exported == agentbuild.layout_constants()
    assert exported["CONFIG"]["size"] == layout.CONFIG.size == 8 * len(layout.CONFIG.fields)
    assert exported["CONFIG"]["fields"]["enabled"] == [96, "U64"]
    assert exported["KINDS"]["vm_deallocate"] == 13
    assert exported["MADVISE_NAMES"]["darwin"]["7"] == "MADV_FREE_REUSABLE"
    assert exported["TASK_VM_INFO_FIELDS"]["phys_footprint"] == [144, "u64"]


def test_agents_define_no_layout_constant_of_their_own() -> None:
    """An agent module declaring a layout name (say `const KINDS = ...`) is a copy that can drift."""
    names = set(agentbuild.layout_constants())
    for path in sorted(agentbuild.AGENT_DIR.rglob("*.js")):
        declared = set(re.findall(r"^(?:export )?(?:const|let|var) (\w+)\s*=", path.read_text(), re.M))
        assert not declared & names, f"{path.name} declares {sorted(declared & names)}"
    # The config struct is written from its field list, never at hand-counted offsets.
    runtime = "\n".join(p.read_text() for p in (agentbuild.AGENT_DIR / "runtime").glob("*.js"))
    assert "cfg.add(" not in runtime and "writeStruct(cfg, CONFIG" in runtime


def test_layout_refuses_a_struct_with_hidden_padding() -> None:
    with pytest.raises(ValueError, match="padded"):
        layout.Layout("MtBad", (("type", "u8"), ("ptr", "u64")))


def test_the_darwin_stand_in_writes_task_vm_info_at_the_layout_offsets() -> None:
    """demo/darwin/mtdarwin.c plays xnu's task_info on Linux; its offsets are the layout's."""
    src = (ROOT / "demo" / "darwin" / "mtdarwin.c").read_text()
    written = {name: int(off) for off, name in
               re.findall(r"put64\(buf, limit, (\d+), [^;]*\);\s*/\* (\w+)", src)}
    shared = {n: written[n] for n in written if n in layout.TASK_VM_INFO_FIELDS}
    assert set(shared) >= {"phys_footprint", "reusable", "ledger_purgeable_nonvolatile", "ledger_purgeable_volatile"}
    assert shared == {n: layout.TASK_VM_INFO_FIELDS[n][0] for n in shared}
    header = (ROOT / "demo" / "darwin" / "mtdarwin.h").read_text()
    assert re.search(rf"#define TASK_VM_INFO\s+{layout.TASK_VM_INFO_FLAVOR}\b", header)
    count = int(re.search(r"#define TASK_VM_INFO_COUNT\s+(\d+)", header).group(1))
    assert all(off + 8 <= count * 4 <= layout.TASK_VM_INFO_BUFFER for off, _ in layout.TASK_VM_INFO_FIELDS.values())


def test_the_purgeable_analyzer_names_madvise_values_as_the_agent_does() -> None:
    assert purgeable_analyzer.MADVISE_NAMES == layout.MADVISE_NAMES
    assert set(purgeable_analyzer.STATE_MACHINE_ENTRIES) <= set(layout.PURGEABLE_ENTRIES)


def test_task_info_count_is_the_newest_revisions_exact_count() -> None:
    """xnu's revisions: rev3 ends where limit_bytes_remaining (rev4, 8 bytes) starts; then rev5
    decompressions (4), rev6 ledger_swapins (8), rev7 two neural ledgers (16), packed to 4 bytes.
    Not the buffer's 128 words, which xnu logs as "possibly invalid task_info_count"."""
    rev3_words = layout.TASK_VM_INFO_FIELDS["limit_bytes_remaining"][0] // 4
    assert layout.TASK_VM_INFO_COUNT == rev3_words + 2 + 1 + 2 + 4 == 93
    assert layout.TASK_VM_INFO_COUNT * 4 <= layout.TASK_VM_INFO_BUFFER
    js = (ROOT / "src" / "memtrace" / "agents" / "runtime" / "taskinfo.js").read_text()
    assert "count.writeU32(TASK_VM_INFO_COUNT)" in js and "TASK_VM_INFO_BUFFER / 4" not in js


def test_leak_job_starts_with_a_world() -> None:
    """leaks.c hands its MtLeakJob to cmodule/world.c as an MtWorld: the job must begin with one,
    field for field, and a stopped thread must be described alike on both sides."""
    from memtrace import layout as L

    assert L.LEAK_JOB.fields[: len(L.WORLD.fields)] == L.WORLD.fields
    assert L.LEAK_THREAD.fields == L.WORLD_THREAD.fields
    assert L.LEAK_REGS == L.WORLD_REGS
    assert L.LEAK_STATES == L.WORLD_STATES
