"""Agent sources: the JavaScript a tracer loads into its target, and the C its CModule compiles.

The one place that knows where agents and cmodule sources live; the Frida host asks it for a
tracer's script and C sources and knows nothing of how they are put together.
"""

from __future__ import annotations

from pathlib import Path

from memtrace.errors import MemtraceError

PACKAGE_DIR = Path(__file__).resolve().parent
AGENT_DIR = PACKAGE_DIR / "agents"


def cmodule_dir() -> Path:
    """cmodule/ ships inside the wheel; in a source checkout it sits at the repo root."""
    for candidate in (PACKAGE_DIR / "cmodule", PACKAGE_DIR.parent.parent / "cmodule"):
        if candidate.is_dir():
            return candidate
    raise MemtraceError("cannot find memtrace's cmodule/ sources (broken installation)")


def agent_source(tracer: str) -> str:
    # The tracer file defines `tracer`, which common.js's rpc table reads at load.
    common = (AGENT_DIR / "common.js").read_text()
    own = (AGENT_DIR / f"{tracer}.js").read_text()
    return own + "\n" + common


def c_sources(tracer: str) -> list[str]:
    d = cmodule_dir()
    sources = [(d / "core.c").read_text()]
    own = d / f"{tracer}.c"
    if own.exists():
        sources.append(own.read_text())
    return sources
