"""agentbuild: every agent bundles from its ES modules with Frida's compiler, the bundle cache
answers unchanged inputs without compiling, and an installed wheel carries every agent file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memtrace import agentbuild, layout, tracers
from memtrace.agentbuild import Agent, build_agent
from memtrace.errors import MemtraceError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def counted_compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Entries compiled (the real compiler still runs)."""
    calls: list[str] = []
    real = agentbuild._compile

    def counting(files: dict[str, bytes], entry: str) -> str:
        calls.append(entry)
        return real(files, entry)

    monkeypatch.setattr(agentbuild, "_compile", counting)
    return calls


AGENTS = agentbuild.agents()
TRACER_AGENTS = agentbuild.tracer_agents()


def test_the_registry_is_the_tracer_list() -> None:
    # Every registered tracer has its agent, and no agent is a tracer the registry does not know.
    registered = tracers.all_tracers()
    assert {t.agent_name: t.c_sources for t in registered.values()} == TRACER_AGENTS
    assert set(TRACER_AGENTS) == {"malloc", "iosurface", "purgeable", "probe", "fds", "threads"}
    assert (*TRACER_AGENTS, "census", "limit") == AGENTS
    for t in registered.values():
        assert (agentbuild.AGENT_DIR / f"{t.agent_name}.js").is_file()
        for f in t.c_sources:
            assert (agentbuild.cmodule_dir() / f).is_file(), f"{t.name}: cmodule/{f}"
    # The report's order is declared on each tracer: the three lines first.
    assert tracers.names() == ("malloc", "iosurface", "purgeable", "probe", "fds", "threads")
    with pytest.raises(MemtraceError, match="no agent named 'nope'"):
        build_agent("nope")


@pytest.mark.parametrize("name", AGENTS)
def test_every_agent_bundles(name: str, tmp_path: Path) -> None:
    # Every registered tracer's agent (and the standalone ones): bundled, its C sources read.
    agent = build_agent(name, cache_dir=tmp_path)
    assert isinstance(agent, Agent) and agent.name == name
    assert len(agent.c_sources) == (len(TRACER_AGENTS[name]) + 1 if TRACER_AGENTS.get(name) else 0)
    assert len(agent.process_sources) == (1 + len(agentbuild.PROCESS_SOURCES) if name in TRACER_AGENTS else 0)
    # Frida's package format: the entry module first, then its source map.
    entry = f"_main_{name}.js" if name in TRACER_AGENTS else f"{name}.js"
    head = agent.source.split("\n", 3)
    assert head[0] == "📦" and re.fullmatch(rf"\d+ /agents/{re.escape(entry)}", head[1])
    assert "import " not in agent.source.split("✄", 2)[1]       # bundled: no module is left to load
    assert "rpc.exports" in agent.source
    if name in TRACER_AGENTS:
        # Every tracer gets the runtime's rpc table; its own module exports the tracer.
        assert "function serve(" in agent.source
        assert re.search(rf"^export const tracer = \{{\n  name: '{name}',", (agentbuild.AGENT_DIR / f"{name}.js").read_text(),
                         re.M)


def test_c_sources_per_agent() -> None:
    header = agentbuild.c_layout_header()
    malloc = build_agent("malloc").c_sources
    assert malloc[0] == header
    assert malloc[1].startswith('#line 1 "unwind.c"\n') and "mt_unwind_walk" in malloc[1]
    assert malloc[2].startswith('#line 1 "core.c"\n') and "mt_assign" in malloc[2]
    assert malloc[3].startswith('#line 1 "track.c"\n') and "mt_track_alloc" in malloc[3]
    assert malloc[4].startswith('#line 1 "drain.c"\n') and "mt_drain" in malloc[4]
    assert malloc[5].startswith('#line 1 "malloc.c"\n') and "mt_malloc_logger" in malloc[5]
    assert malloc[6].startswith('#line 1 "world.c"\n') and "mt_world_stop" in malloc[6]
    assert malloc[7].startswith('#line 1 "leaks.c"\n') and "mt_leak_candidates" in malloc[7]
    assert len(malloc) == 8
    process = build_agent("malloc").process_sources
    assert process[0] == header and process[1].startswith('#line 1 "world.c"\n')
    assert process[2].startswith('#line 1 "process.c"\n') and len(process) == 3
    purgeable = build_agent("purgeable").c_sources
    assert purgeable[0] == header and purgeable[1].startswith('#line 1 "purgeable.c"\n')
    assert "purg_enter" in purgeable[1]
    for name in ("iosurface", "probe", "fds", "threads", "census", "limit"):
        assert build_agent(name).c_sources == []
    # The thin wrappers the capture session uses are the same agent.
    assert agentbuild.c_sources("malloc") == malloc
    assert agentbuild.agent_source("malloc") == build_agent("malloc").source


def test_no_c_inside_javascript() -> None:
    for path in sorted(agentbuild.AGENT_DIR.rglob("*.js")):
        text = path.read_text()
        assert "#include" not in text and "GumInvocationContext" not in text, path.name


def test_a_cache_hit_does_not_recompile(tmp_path: Path, counted_compiles: list[str]) -> None:
    first = build_agent("malloc", cache_dir=tmp_path)
    assert counted_compiles == ["_main_malloc.js"]
    (cached,) = tmp_path.glob("malloc-*.js")
    second = build_agent("malloc", cache_dir=tmp_path)
    assert counted_compiles == ["_main_malloc.js"]          # served from the cache
    assert second.source == first.source == cached.read_text(encoding="utf-8")
    build_agent("fds", cache_dir=tmp_path)
    assert counted_compiles == ["_main_malloc.js", "_main_fds.js"]


def test_a_changed_input_rebuilds(tmp_path: Path, counted_compiles: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    agents = tmp_path / "agents"
    shutil.copytree(agentbuild.AGENT_DIR, agents)
    monkeypatch.setattr(agentbuild, "AGENT_DIR", agents)
    cache = tmp_path / "cache"
    before = build_agent("threads", cache_dir=cache).source
    flush = agents / "runtime" / "flush.js"
    flush.write_text(flush.read_text().replace("const JSON_BATCH = 512;", "const JSON_BATCH = 256;"))
    after = build_agent("threads", cache_dir=cache).source
    assert counted_compiles == ["_main_threads.js", "_main_threads.js"]
    assert "JSON_BATCH = 512" in before and "JSON_BATCH = 256" in after
    # A changed layout is a changed input too.
    malloc = build_agent("malloc", cache_dir=cache).source
    monkeypatch.setattr(layout, "LIVE_WAYS", 4)
    changed = build_agent("malloc", cache_dir=cache).source
    assert counted_compiles[2:] == ["_main_malloc.js", "_main_malloc.js"]
    assert "LIVE_WAYS = 8;" in malloc and "LIVE_WAYS = 4;" in changed


def test_an_unwritable_cache_still_builds(tmp_path: Path, counted_compiles: list[str]) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    agent = build_agent("probe", cache_dir=blocker / "cache")
    assert agent.source.startswith("📦") and counted_compiles == ["_main_probe.js"]


def test_a_broken_module_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents = tmp_path / "agents"
    shutil.copytree(agentbuild.AGENT_DIR, agents)
    (agents / "probe.js").write_text((agents / "probe.js").read_text().replace("function runProbe() {",
                                                                               "function runProbe( {", 1))
    monkeypatch.setattr(agentbuild, "AGENT_DIR", agents)
    with pytest.raises(MemtraceError) as e:
        build_agent("probe", cache_dir=tmp_path / "cache")
    message = str(e.value)
    assert "\n" not in message and re.search(r"cannot build agent _main_probe\.js: agents/probe\.js:\d+: ", message)


def test_unknown_agents_are_refused() -> None:
    with pytest.raises(MemtraceError, match="no agent named 'nope'"):
        build_agent("nope")
    with pytest.raises(MemtraceError, match="no agent named 'nope'"):
        agentbuild.c_sources("nope")


def test_the_default_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MEMTRACE_CACHE_DIR", str(tmp_path / "m"))
    assert agentbuild.default_cache_dir() == tmp_path / "m"
    monkeypatch.delenv("MEMTRACE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert agentbuild.default_cache_dir() == tmp_path / "x" / "memtrace" / "agents"


def test_old_bundles_are_pruned(tmp_path: Path) -> None:
    for i in range(6):
        stale = tmp_path / f"iosurface-{i:024x}.js"
        stale.write_text("old")
        os.utime(stale, (1000 + i, 1000 + i))
    build_agent("iosurface", cache_dir=tmp_path)
    left = sorted(p.name for p in tmp_path.glob("iosurface-*.js"))
    assert len(left) == agentbuild.CACHE_KEEP
    assert f"iosurface-{5:024x}.js" in left and f"iosurface-{0:024x}.js" not in left


@pytest.mark.slow
def test_an_installed_wheel_builds_every_agent(tmp_path: Path) -> None:
    """The wheel carries every agent module and cmodule/ source: built from it alone (in a
    fresh interpreter that cannot see this checkout), every agent bundles and finds its C."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(ROOT)], check=True, capture_output=True)
    (wheel,) = wheels.glob("memtrace-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    shipped = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
    for p in sorted((ROOT / "src" / "memtrace" / "agents").rglob("*.js")):
        assert "memtrace/" + p.relative_to(ROOT / "src" / "memtrace").as_posix() in shipped
    for p in sorted((ROOT / "cmodule").glob("*.c")):
        assert f"memtrace/cmodule/{p.name}" in shipped
    probe = ("import json, sys\n"
             f"sys.path.insert(0, {str(site)!r})\n"
             "import memtrace\n"
             "from memtrace.agentbuild import agents, build_agent\n"
             "out = {n: [len(a.source), len(a.c_sources)] for n in agents() for a in [build_agent(n)]}\n"
             "print(json.dumps({'from': memtrace.__file__, 'agents': out}))\n")
    env = {**os.environ, "MEMTRACE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("PYTHONPATH", None)
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["from"].startswith(str(site))
    assert set(doc["agents"]) == set(AGENTS)
    assert doc["agents"]["malloc"][1] == 8 and doc["agents"]["purgeable"][1] == 2
    assert all(size > 1000 for size, _ in doc["agents"].values())
