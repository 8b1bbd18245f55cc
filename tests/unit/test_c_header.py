"""The C header is generated from memtrace/layout.py, every #define of it: it covers every MT_ macro
cmodule/ uses that cmodule/ does not define itself, collides with none it does, and carries
layout's values."""

from __future__ import annotations

import re

from memtrace import agentbuild, layout

DEFINE = re.compile(r"^\s*#\s*define\s+(MT_[A-Z0-9_]+)\s+(\S+)", re.M)


def header_defines() -> dict[str, str]:
    return dict(DEFINE.findall(agentbuild.c_layout_header()))


def c_sources() -> dict[str, str]:
    """cmodule/'s files without their comments (which name macro families: "MT_C_* indexes")."""
    d = agentbuild.cmodule_dir()
    strip = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
    return {p.name: strip.sub(" ", p.read_text()) for p in sorted(d.glob("*.c"))}


def test_every_mt_macro_the_c_uses_is_defined_once() -> None:
    header = header_defines()
    own = {name for text in c_sources().values() for name in re.findall(r"^\s*#\s*define\s+(MT_[A-Z0-9_]+)", text, re.M)}
    assert not header.keys() & own, "defined both in layout.py and by hand in cmodule/"
    used = {m for text in c_sources().values() for m in re.findall(r"\bMT_[A-Z0-9_]+\b", text)}
    # Platform switches the agent prepends (#define MT_LINUX 1 ...), not constants.
    # MT_TSAN: the sanitizer harness (tests/native); MT_WORLD_SIGSTOP: world.c's signal stop (seccomp).
    switches = {"MT_LINUX", "MT_DARWIN", "MT_ARM64", "MT_TSAN", "MT_WORLD_SIGSTOP"}
    assert used - header.keys() - own - switches == set()


def test_the_header_carries_layouts_values() -> None:
    header = {k: int(v.rstrip("u"), 0) for k, v in header_defines().items()}
    assert header["MT_K_MALLOC"] == layout.KINDS["malloc"] and header["MT_K_MAPPED_FILE"] == 14
    assert all(header[f"MT_C_{k.upper()}"] == v for k, v in layout.COUNTERS.items())
    assert all(header[f"MT_A_{k.upper()}"] == v for k, v in layout.AGG_FIELDS.items())
    assert header["MT_PF_MADVISE"] == layout.PURGEABLE_ENTRIES.index("madvise")
    assert header["MT_TIER_MAX_3"] == 8192 and "MT_TIER_MAX_5" not in header
    assert header["MT_NO_STACK"] == 0xFFFFFFFF and header["MT_N_PSEUDO_STACKS"] == 3
    assert header["MT_N_COUNTERS"] == layout.N_COUNTERS


def test_no_other_language_mirrors_a_hand_written_c_constant() -> None:
    # A value the agent or the host shares with the C is layout.py's (the header's): a hand-written
    # #define that JavaScript or Python names ("core.c's MT_MAX_LANES") is a copy that can drift.
    own = {name for text in c_sources().values() for name in re.findall(r"^\s*#\s*define\s+(MT_[A-Z0-9_]+)", text, re.M)}
    root = agentbuild.PACKAGE_DIR
    named = {(p.relative_to(root).as_posix(), m) for p in sorted([*root.rglob("*.js"), *root.rglob("*.py")])
             for m in re.findall(r"\bMT_[A-Z0-9_]+\b", p.read_text(encoding="utf-8"))}
    assert {(f, m) for f, m in named if m in own} == set()
    # The constants that were mirrored by hand before, now generated.
    header = header_defines()
    for name, value in (("MT_MAX_LANES", layout.MAX_LANES), ("MT_FD_GUARD_MAX", layout.FD_GUARD_MAX),
                        ("MT_FD_RANGES", layout.FD_RANGES), ("MT_VM_MEMORY_STACK", layout.VM_MEMORY_STACK),
                        ("MT_WORLD_E_TIMEOUT", layout.WORLD_ERROR_CODES["timeout"])):
        assert int(header[name].rstrip("u"), 0) == value
    assert set(layout.WORLD_ERROR_CODES.values()) == set(layout.WORLD_ERRORS)
