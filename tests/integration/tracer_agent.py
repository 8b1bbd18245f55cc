"""A tracer's agent loaded by hand into a session the test attached (test_hook_storm.py): built, its messages given to `on_message` (or dropped), initialized with the
tracer's own configuration over `extra`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memtrace import tracers
from memtrace.agentbuild import build_agent


def load_tracer(session: Any, tracer: str, extra: dict[str, Any] | None = None,
                on_message: Callable[[Any, Any], None] | None = None) -> tuple[Any, Any]:
    """(script, its exports_sync), init done, hooks not yet in."""
    agent = build_agent(tracer)
    script = session.create_script(agent.source)
    script.on("message", on_message or (lambda message, data: None))
    script.load()
    api = script.exports_sync
    api.init({**tracers.all_tracers()[tracer].agent_config(None, {}), **(extra or {})}, agent.c_sources,
             agent.process_sources)
    return script, api
