"""Agents: the JavaScript bundle a tracer loads into its target, and the C its CModule compiles.

The one place that knows how agents are built; the Frida host asks :func:`build_agent` for an
agent and knows nothing of how it is put together.

- JavaScript: ES modules under ``agents/`` (``runtime/`` shared by the tracers, one module per
  tracer exporting ``tracer``, ``census.js`` and ``limit.js`` on their own) bundled by Frida's
  compiler (esbuild) together with ``layout.js``, generated here from :mod:`memtrace.layout`.
  A tracer's entry module is generated too: ``serve(tracer)``.  Bundles are cached on disk
  under a hash of every input, so only the first run after a change compiles.
- C: ``cmodule/`` sources, each agent's own list, preceded by the C header generated from
  :mod:`memtrace.layout`; the agent passes them to ``new CModule`` in its ``init`` rpc.

docs/agents.md describes the build, the host <-> agent protocol and how a tracer plugs in.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import frida

from memtrace import layout
from memtrace.errors import MemtraceError
from memtrace.files import write_text_atomic

PACKAGE_DIR = Path(__file__).resolve().parent
AGENT_DIR = PACKAGE_DIR / "agents"

# Tracer agents and the cmodule/ files their CModule compiles (in order, after the header).
TRACERS: dict[str, tuple[str, ...]] = {
    "malloc": ("unwind.c", "core.c", "track.c", "drain.c", "malloc.c", "leaks.c"),
    "iosurface": (),
    "purgeable": ("purgeable.c",),
    "probe": (),
    "fds": (),
    "threads": (),
}
# Every tracer agent also compiles these (its own small CModule: fork and exec, see
# agents/runtime/process.js); they go to the init rpc as its third argument.
PROCESS_SOURCES: tuple[str, ...] = ("process.c",)
# Agents with an rpc table of their own (no tracer runtime, no C).
STANDALONE: tuple[str, ...] = ("census", "limit")
AGENTS: tuple[str, ...] = (*TRACERS, *STANDALONE)

# Bumped when the way a bundle is put together changes, so old cached bundles are not reused.
BUILD_FORMAT = 1
LAYOUT_MODULE = "layout.js"
CACHE_KEEP = 4                 # cached bundles kept per agent (older ones are pruned)


@dataclass(frozen=True)
class Agent:
    name: str
    source: str                # the compiled bundle, for session.create_script
    c_sources: list[str]       # for the agent's init rpc: the layout header, then cmodule/ files
    process_sources: list[str]  # the init rpc's third argument (tracers only): header + process.c


def build_agent(name: str, cache_dir: Path | None = None) -> Agent:
    """The agent ``name`` (a tracer or a standalone agent), from the cache when its inputs are unchanged."""
    if name not in AGENTS:
        raise MemtraceError(f"no agent named {name!r} (known: {', '.join(AGENTS)})")
    return Agent(name, _bundle(name, cache_dir if cache_dir is not None else default_cache_dir()),
                 _c_sources(name), _files(PROCESS_SOURCES) if name in TRACERS else [])


def agent_source(tracer: str) -> str:
    return build_agent(tracer).source


def c_sources(tracer: str) -> list[str]:
    if tracer not in AGENTS:
        raise MemtraceError(f"no agent named {tracer!r} (known: {', '.join(AGENTS)})")
    return _c_sources(tracer)


def cmodule_dir() -> Path:
    """cmodule/ ships inside the wheel; in a source checkout it sits at the repo root."""
    for candidate in (PACKAGE_DIR / "cmodule", PACKAGE_DIR.parent.parent / "cmodule"):
        if candidate.is_dir():
            return candidate
    raise MemtraceError("cannot find memtrace's cmodule/ sources (broken installation)")


def default_cache_dir() -> Path:
    """$MEMTRACE_CACHE_DIR, else the user's cache folder (XDG)."""
    if os.environ.get("MEMTRACE_CACHE_DIR"):
        return Path(os.environ["MEMTRACE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memtrace" / "agents"


# ---- C -----------------------------------------------------------------------------------------


def _c_sources(name: str) -> list[str]:
    return _files(TRACERS.get(name, ()))


def _files(files: tuple[str, ...]) -> list[str]:
    if not files:
        return []
    d = cmodule_dir()
    # #line keeps a compile error's line numbers those of the file, not of the concatenation.
    return [c_layout_header()] + [f'#line 1 "{f}"\n' + (d / f).read_text(encoding="utf-8") for f in files]


def _c_int(value: int) -> str:
    return f"{value:#x}u" if value > 0x7FFFFFFF else str(value)


def _c_struct(s: layout.Layout) -> list[str]:
    lines = [f"typedef struct _{s.c_name} {s.c_name};", f"struct _{s.c_name}", "{"]
    lines += [f"  {layout.FIELD_TYPES[t][0]} {name};" for name, t in s.fields]
    return lines + ["};", ""]


def c_layout_header() -> str:
    """The C view of memtrace.layout: #defines and structs, prepended to every CModule."""
    defines: list[tuple[str, int]] = [
        ("MT_REC_PAD", layout.REC_PAD), ("MT_REC_STACK", layout.REC_STACK),
        ("MT_REC_ALLOC", layout.REC_ALLOC), ("MT_REC_FREE", layout.REC_FREE),
        ("MT_FLAG_LIVE", layout.FLAG_LIVE), ("MT_FLAG_SAMPLED", layout.FLAG_SAMPLED),
        ("MT_FLAG_TRUNCATED", layout.FLAG_TRUNCATED),
        ("MT_NO_STACK", layout.NO_STACK), ("MT_DROPPED_STACK", layout.DROPPED_STACK),
        *((f"MT_K_{k.upper()}", v) for k, v in layout.KINDS.items()),
        ("MT_N_KINDS", layout.N_KINDS),
        ("MT_C_CALLS", layout.C_CALLS), ("MT_C_BYTES", layout.C_BYTES),
        ("MT_C_TIER_CALLS", layout.C_TIER_CALLS), ("MT_C_TIER_BYTES", layout.C_TIER_BYTES),
        ("MT_N_TIERS", layout.N_TIERS),
        *((f"MT_TIER_MAX_{i}", v) for i, v in enumerate(layout.TIER_MAX_BYTES) if v is not None),
        *((f"MT_C_{k.upper()}", v) for k, v in layout.COUNTERS.items()),
        ("MT_C_FAILED", layout.C_FAILED), ("MT_N_COUNTERS", layout.N_COUNTERS),
        ("MT_MAX_FRAMES", layout.MAX_FRAMES), ("MT_LIVE_WAYS", layout.LIVE_WAYS),
        ("MT_MAX_RINGS", layout.MAX_RINGS),
        ("MT_UNWIND_CFA_SP", layout.UNWIND_CFA_SP), ("MT_UNWIND_CFA_FP", layout.UNWIND_CFA_FP),
        ("MT_UNWIND_NONE", layout.UNWIND_NONE), ("MT_UNWIND_INDEX_SHIFT", layout.UNWIND_INDEX_SHIFT),
        ("MT_MAX_UNWIND_MODULES", layout.MAX_UNWIND_MODULES),
        *((f"MT_OP_{k.upper()}", v) for k, v in layout.LOGGER_OPS.items()),
        *((f"MT_PF_{k.upper()}", i) for i, k in enumerate(layout.PURGEABLE_ENTRIES)),
        *((f"MT_PURGABLE_{k.upper()}", v) for k, v in layout.PURGABLE_CONTROLS.items()),
        ("MT_VM_FLAGS_ANYWHERE", layout.VM_FLAGS_ANYWHERE), ("MT_VM_FLAGS_PURGABLE", layout.VM_FLAGS_PURGABLE),
        ("MT_PC_CONTROLS", layout.PC_CONTROLS), ("MT_PC_CONTROL_STRIDE", layout.PC_CONTROL_STRIDE),
        ("MT_PC_CONTROL_OTHER", layout.PC_CONTROL_OTHER), ("MT_PC_CREATION", layout.PC_CREATION),
        ("MT_PC_MADVISE_INTERNAL", layout.PC_MADVISE_INTERNAL), ("MT_PC_MADVISE", layout.PC_MADVISE),
        ("MT_PC_MADVISE_SLOTS", layout.PC_MADVISE_SLOTS), ("MT_PURGEABLE_N_COUNTS", layout.PURGEABLE_N_COUNTS),
        ("MT_LEAK_RANGE_STACK", layout.LEAK_RANGE_STACK), ("MT_LEAK_REGS", layout.LEAK_REGS),
        *((f"MT_LEAK_{k.upper()}", v) for k, v in layout.LEAK_STATES.items()),
        ("MT_PC_NESTED", layout.PC_NESTED), ("MT_ALLOCATOR_RANGES", layout.ALLOCATOR_RANGES),
        ("MT_FLAG_TAG_SHIFT", layout.FLAG_TAG_SHIFT),
        ("MT_VM_TAG_MALLOC_FIRST", layout.VM_TAG_MALLOC_FIRST), ("MT_VM_TAG_MALLOC_LAST", layout.VM_TAG_MALLOC_LAST),
        ("MT_LOGGER_INFLIGHT_SHARDS", layout.LOGGER_INFLIGHT_SHARDS),
        ("MT_LOGGER_INFLIGHT_STRIDE", layout.LOGGER_INFLIGHT_STRIDE),
        *((f"MT_{k}", v) for k, v in layout.C_DEFINES.items()),
        ("MT_FORK_ENTRIES", layout.FORK_ENTRIES), ("MT_FORK_PATH", layout.FORK_PATH),
        ("MT_PATCH_BYTES", layout.PATCH_BYTES), ("MT_MAX_PATCHES", layout.MAX_PATCHES),
        *((f"MT_ORIGIN_{k.upper()}", v) for k, v in layout.FORK_ORIGINS.items()),
    ]
    lines = ["/* Generated by memtrace.agentbuild from memtrace/layout.py: do not edit. */",
             "#include <glib.h>", ""]
    lines += [f"#define {name} {_c_int(value)}" for name, value in defines]
    lines.append("")
    for s in layout.C_STRUCTS:
        lines += _c_struct(s)
    return "\n".join(lines)


# ---- JavaScript --------------------------------------------------------------------------------


def _js_value(value: Any) -> Any:
    if isinstance(value, layout.Layout):
        return {"name": value.c_name, "size": value.size,
                "fields": {n: [off, layout.FIELD_TYPES[t][2]]
                           for (n, t), off in zip(value.fields, value.offsets.values(), strict=True)}}
    if isinstance(value, (frozenset, set)):
        return sorted(value)
    if isinstance(value, Mapping):
        return {str(k): _js_value(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_js_value(v) for v in value]
    return value


def layout_constants() -> dict[str, Any]:
    """Every public constant of memtrace.layout, as layout.js exports it (JSON values)."""
    skip = {"FIELD_TYPES", "C_STRUCTS"}
    return {name: _js_value(value) for name, value in vars(layout).items()
            if name.isupper() and name not in skip}


def js_layout_module() -> str:
    lines = ["// Generated by memtrace.agentbuild from memtrace/layout.py: do not edit."]
    lines += [f"export const {name} = {json.dumps(value, sort_keys=False)};"
              for name, value in layout_constants().items()]
    return "\n".join(lines) + "\n"


def _entry_module(name: str) -> str:
    return (f"import {{ tracer }} from './{name}.js';\n"
            "import { serve } from './runtime/rpc.js';\n\n"
            "serve(tracer);\n")


def _inputs(name: str) -> tuple[dict[str, bytes], str]:
    """Every file the bundle is built from (paths relative to agents/) and the entry's path."""
    files = {p.relative_to(AGENT_DIR).as_posix(): p.read_bytes()
             for p in sorted(AGENT_DIR.rglob("*.js")) if p.name != LAYOUT_MODULE}
    if f"{name}.js" not in files:
        raise MemtraceError(f"agents/{name}.js is missing (broken installation)")
    files[LAYOUT_MODULE] = js_layout_module().encode()
    entry = f"{name}.js"
    if name in TRACERS:
        entry = f"_main_{name}.js"
        files[entry] = _entry_module(name).encode()
    return files, entry


def _cache_key(name: str, files: dict[str, bytes], entry: str) -> str:
    h = hashlib.sha256()
    h.update(f"{BUILD_FORMAT}\0{frida.__version__}\0{name}\0{entry}\0".encode())
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return h.hexdigest()[:24]


def _bundle(name: str, cache_dir: Path) -> str:
    files, entry = _inputs(name)
    cached = cache_dir / f"{name}-{_cache_key(name, files, entry)}.js"
    try:
        return cached.read_text(encoding="utf-8")
    except OSError:
        pass
    source = _compile(files, entry)
    try:
        write_text_atomic(cached, source)
        _prune(cache_dir, name, keep=cached)
    except OSError:
        pass        # an unwritable cache only costs the next run a compile
    return source


def _prune(cache_dir: Path, name: str, keep: Path) -> None:
    old = sorted((p for p in cache_dir.glob(f"{name}-*.js") if p != keep),
                 key=lambda p: p.stat().st_mtime, reverse=True)
    for p in old[CACHE_KEEP - 1:]:
        p.unlink(missing_ok=True)


def _compile(files: dict[str, bytes], entry: str) -> str:
    """Bundles agents/<entry> with Frida's compiler in a scratch copy of agents/ (where
    layout.js and the entry module are written beside the sources)."""
    with tempfile.TemporaryDirectory(prefix="memtrace-agent-") as tmp:
        root = Path(tmp)
        for rel, data in files.items():
            target = root / "agents" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        compiler = frida.Compiler()
        diagnostics: list[Any] = []
        compiler.on("diagnostics", diagnostics.append)
        try:
            return compiler.build(f"agents/{entry}", project_root=str(root), type_check="none")
        except frida.InvalidArgumentError as e:
            raise MemtraceError(f"cannot build agent {entry}: {_first_diagnostic(diagnostics) or e}") from None


def _first_diagnostic(batches: list[Any]) -> str:
    for batch in batches:
        for d in batch:
            f = d.get("file") or {}
            where = f"{f.get('path', '?')}:{f.get('line', '?')}: " if f else ""
            return f"{where}{d.get('text', '')}"
    return ""
