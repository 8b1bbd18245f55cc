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

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import frida

from memtrace import layout
from memtrace.errors import MemtraceError
from memtrace.files import write_bytes_atomic, write_text_atomic

PACKAGE_DIR = Path(__file__).resolve().parent
AGENT_DIR = PACKAGE_DIR / "agents"

# Every tracer agent also compiles these (its own small CModule: stopping the world around a
# patch, fork and exec, see agents/runtime/process.js); they go to the init rpc as its third
# argument.  A tracer's own cmodule/ files are declared on its Tracer (memtrace.tracers).
PROCESS_SOURCES: tuple[str, ...] = ("world.c", "process.c")
# Agents with an rpc table of their own (no tracer runtime, no C).
STANDALONE: tuple[str, ...] = ("census", "limit")


def tracer_agents() -> dict[str, tuple[str, ...]]:
    """Every registered tracer's agent and the cmodule/ files its CModule compiles, in order."""
    # Imported here: the registry's tracer modules import much of memtrace, agentbuild little.
    from memtrace import tracers

    return {t.agent_name: t.c_sources for t in tracers.all_tracers().values()}


def agents() -> tuple[str, ...]:
    """Every agent there is: the registered tracers', then the standalone ones."""
    return (*tracer_agents(), *STANDALONE)


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
    known = agents()
    if name not in known:
        raise MemtraceError(f"no agent named {name!r} (known: {', '.join(known)})")
    return Agent(name, _bundle(name, cache_dir if cache_dir is not None else default_cache_dir()),
                 _c_sources(name), _files(PROCESS_SOURCES) if name in tracer_agents() else [])


def agent_source(tracer: str) -> str:
    return build_agent(tracer).source


def c_sources(tracer: str) -> list[str]:
    known = agents()
    if tracer not in known:
        raise MemtraceError(f"no agent named {tracer!r} (known: {', '.join(known)})")
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
    return _files(tracer_agents().get(name, ()))


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
    defines = layout.c_defines()
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
    skip = {"FIELD_TYPES", "C_STRUCTS", "C_ENUMS", "C_DERIVED"}
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
    if name in tracer_agents():
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
        compiler = frida.Compiler()  # type: ignore[no-untyped-call]  # frida's stubs leave it untyped
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


# ---- the CModule's machine code, compiled once per source and compiler -------------------------
#
# On Linux, Frida's CModule with the external toolchain runs `gcc -O2` on the C sources inside
# the target at every start (~0.65 s of CPU for the malloc core, seconds of wall time on a busy
# machine).  The host, on the same machine, compiles the same sources with the same flags to
# assembly once, keeps it in the cache folder under a key of the sources, the defines, the Frida
# version (its headers) and the compiler's version, and hands the agent a C file that is that
# assembly in one top-level asm statement: gcc then only assembles it (~10 ms); Frida links it
# as before.  Anything unexpected (no gcc, a compile error) returns None and the agent compiles
# the C itself, exactly as without the cache.
#
# First choice since round 10: the module itself, linked here as Frida's gcc toolchain links it
# (precompiled_module).  Frida 17 loads a shared object given as bytes (``new CModule(bytes,
# symbols)``) on Linux too, resolving its undefined symbols from the symbols given, so the target
# starts no compiler -- no fork of the target, no shell, no gcc -- and the core is in at once.

CMODULE_CACHE_FORMAT = 2
# The flags Frida 17's gcc CModule compiles with (it runs `gcc -m64 -shared -fPIC -nostdlib -Wall
# -Werror -O2 -isystem . -isystem capstone <defines> module.c -o module.so`), -S for the assembly.
# Another Frida version that compiles otherwise misses the cache key (its version is in it) or, if
# the assembly does not fit its flags, fails to link it, and the agent compiles the C itself.
_GCC_FLAGS = ["-S", "-m64", "-fPIC", "-nostdlib", "-Wall", "-Werror", "-O2", "-isystem", ".", "-isystem", "capstone"]
_MODULE_FLAGS = ["-m64", "-shared", "-fPIC", "-nostdlib", "-Wall", "-Werror", "-O2", "-isystem", ".", "-isystem", "capstone"]


def gcc_driver() -> tuple[str, os.stat_result] | None:
    """The gcc on PATH, its real path and its file's stat (None: no gcc, or it cannot be read):
    what identifies a compiler for the caches (here, and frida_host's gcc stand-in)."""
    real = shutil.which("gcc")
    if real is None:
        return None
    real = os.path.realpath(real)
    try:
        return real, os.stat(real)
    except OSError:
        return None


def _compiler_version(cache_dir: Path | None = None) -> str | None:
    """gcc's first ``--version`` line, kept in the cache folder by the gcc found on PATH and its
    driver file's identity (path, size, mtime): running ``gcc --version`` was 15-100 ms of every
    run's start (issue 21: fixed cost)."""
    driver = gcc_driver()
    if driver is None:
        return None
    real, st = driver
    ident = hashlib.sha256(repr((real, st.st_size, st.st_mtime_ns)).encode()).hexdigest()[:16]
    cached = (cache_dir if cache_dir is not None else default_cache_dir()) / f"gcc-version-{ident}.txt"
    with contextlib.suppress(OSError):
        text = cached.read_text(encoding="utf-8")
        if text:
            return text
    try:
        out = subprocess.run(["gcc", "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout else None
    if version:
        with contextlib.suppress(OSError):     # an unwritable cache only costs a gcc --version per run
            cached.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(cached, version)
    return version


def cmodule_cache_key(source: str, builtin_defines: dict[str, Any], frida_version: str,
                      cache_dir: Path | None = None) -> str | None:
    """The cache key of a CModule source (None: no gcc here)."""
    compiler = _compiler_version(cache_dir)
    if compiler is None:
        return None
    h = hashlib.sha256()
    for part in (str(CMODULE_CACHE_FORMAT), frida_version, compiler, json.dumps(builtin_defines, sort_keys=True),
                 source):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:32]


def asm_as_c(asm: str) -> str:
    """Assembly text as a C file of one top-level asm statement."""
    lines = [line.replace("\\", "\\\\").replace('"', '\\"') for line in asm.splitlines()]
    return "__asm__ (\n" + "\n".join(f'  "{line}\\n"' for line in lines) + "\n);\n"


def precompiled_cmodule(source: str, builtin_defines: dict[str, Any], frida_version: str,
                        headers: Callable[[], dict[str, str]], cache_dir: Path | None = None) -> str | None:
    """The C file of `source`'s assembly for Frida's external gcc toolchain, from the cache or
    compiled now (`headers()`: Frida's CModule headers, asked for only on a miss); None when it
    cannot be had here (the agent then compiles `source` itself)."""
    folder = cache_dir if cache_dir is not None else default_cache_dir()
    key = cmodule_cache_key(source, builtin_defines, frida_version, folder)
    if key is None:
        return None
    cached = folder / f"cmodule-{key}.c"
    with contextlib.suppress(OSError):
        return cached.read_text(encoding="utf-8")
    built = _gcc_in_headers(source, builtin_defines, headers, _GCC_FLAGS, "module.s")
    if built is None:
        return None
    text = asm_as_c(built.decode("utf-8"))
    with contextlib.suppress(OSError):     # an unwritable cache only costs a compile per run
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cached, text)
    return text


def precompiled_module(source: str, builtin_defines: dict[str, Any], frida_version: str,
                       headers: Callable[[], dict[str, str]], cache_dir: Path | None = None) -> Path | None:
    """`source` built here once as the shared object Frida's gcc toolchain would build in the
    target (its flags, its headers), kept in the cache folder by the same key as the assembly;
    the agent loads it as it is (``new CModule(bytes, symbols)``), with no compiler run from the
    target at all.  None when it cannot be had (no gcc, a compile error, an unwritable cache):
    the agent then takes the assembly, or compiles the C, as before."""
    folder = cache_dir if cache_dir is not None else default_cache_dir()
    key = cmodule_cache_key(source, builtin_defines, frida_version, folder)
    if key is None:
        return None
    cached = folder / f"cmodule-{key}.so"
    if cached.is_file():
        return cached
    built = _gcc_in_headers(source, builtin_defines, headers, _MODULE_FLAGS, "module.so")
    if built is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(cached, built)       # whole or not at all: another run may be reading it
    except OSError:
        return None
    return cached


def _gcc_in_headers(source: str, builtin_defines: dict[str, Any], headers: Callable[[], dict[str, str]],
                    flags: list[str], output: str) -> bytes | None:
    """gcc `flags` on `source` in a folder of Frida's CModule headers, as Frida runs it: the
    output file's bytes, or None when it fails."""
    defines = [f"-D{k}" if v is True else f"-D{k}={v}" for k, v in builtin_defines.items()]
    try:
        with tempfile.TemporaryDirectory(prefix="memtrace-cmodule-") as d:
            work = Path(d)
            for name, text in headers().items():
                p = work / name
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text, encoding="utf-8")
            (work / "module.c").write_text(source, encoding="utf-8")
            out = subprocess.run(["gcc", *flags, *defines, "module.c", "-o", output], cwd=work,
                                 capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                return None
            return (work / output).read_bytes()
    except (OSError, subprocess.TimeoutExpired):
        return None
