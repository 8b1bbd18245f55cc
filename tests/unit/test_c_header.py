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
    switches = {"MT_LINUX", "MT_DARWIN", "MT_ARM64", "MT_TSAN"}   # MT_TSAN: the sanitizer harness (tests/native)
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
