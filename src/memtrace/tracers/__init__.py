"""The tracer registry: each tracer says, in one module of this package, everything it is.

A :class:`Tracer` names its options (the click command and batch plan keys are both made from
them), its agent (``agents/<agent>.js``, plus ``cmodule/<agent>.c`` when it has C), its
analyzer, the type of its summary, its console view, its report chapter and the statistics the
live view shows while it runs.  ``cli``, ``batch``, ``report`` and the live view find tracers
here and nowhere else; a module of this package that defines ``TRACER`` is registered by being
there (see docs/architecture.md, "Adding a tracer").
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memtrace import capture
from memtrace.tracers.options import Option

if TYPE_CHECKING:
    from rich.console import Console

    from memtrace.capture import Event, Record, Result
    from memtrace.live import LiveStats


@dataclass(frozen=True)
class Tracer:
    name: str
    help: str                                         # one line: the command's --help and the docs
    description: str                                  # the command's docstring body
    options: tuple[Option, ...]
    analyzer: str                                     # module with summarize(records) -> summary_type
    summary_type: type
    console: Callable[[Console, Any, dict[str, Any]], None]   # (console, summary, host options)
    live: Callable[[], LiveStats]                     # a fresh live statistics tally per capture
    # A report.chapters.Chapter (report.chapters.chapter_of: None is the generic one); typed Any
    # so the registry does not import the report (no import cycle: tests/unit/test_import_graph.py).
    chapter: Callable[[], Any] | None = None
    agent: str = ""                                   # default: the tracer's name
    json_top_option: str = "top"                      # the option that bounds JSON rows
    before_launch: Callable[[dict[str, Any]], None] | None = None   # host checks, e.g. an output file
    window_end: Callable[[Any], None] | None = None   # (capture loop) before the hooks come out: malloc --leaks
    # (option values, target, capture options) -> the AgentHost to capture through, or None for
    # Frida's: malloc --backend dvt records through a stock device's Instruments services.
    host: Callable[[dict[str, Any], Any, Any], Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # What the capture reader checks this tracer's JSON against (memtrace/schema.py): its event
    # types (capture.Event subclasses, by their TYPE) and its RESULT record's (a capture.Result).
    events: tuple[type[Event], ...] = ()
    result: type[Result] | None = None

    @property
    def agent_name(self) -> str:
        return self.agent or self.name

    def summarize(self, records: Iterable[Record]) -> Any:
        return importlib.import_module(self.analyzer).summarize(records)


def _discover() -> dict[str, Tracer]:
    found: dict[str, Tracer] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name == "options":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        tracer = getattr(module, "TRACER", None)
        if isinstance(tracer, Tracer):
            if tracer.name in found:
                raise RuntimeError(f"two tracers are named {tracer.name!r}")
            found[tracer.name] = tracer
    return dict(sorted(found.items(), key=lambda kv: (ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER),
                                                       kv[0])))


# The three lines first, as the report tells them; any other tracer after, by name.
ORDER = ("malloc", "iosurface", "purgeable", "probe", "fds", "threads")
_REGISTRY: dict[str, Tracer] | None = None


def all_tracers() -> dict[str, Tracer]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _discover()
    return _REGISTRY


def _schemas() -> list[tuple[str, tuple[type[Event], ...], type[Result] | None]]:
    return [(t.name, t.events, t.result) for t in all_tracers().values()]


# The capture reader checks each tracer's events and results by the types the tracer declares.
capture.use_tracer_schemas(_schemas)


def names() -> tuple[str, ...]:
    return tuple(all_tracers())


def get(name: str) -> Tracer | None:
    return all_tracers().get(name)
