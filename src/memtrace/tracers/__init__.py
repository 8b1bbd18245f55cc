"""The tracer registry: each tracer says, in one module of this package, everything it is.

This is the only list of tracers.  A :class:`Tracer` names its options (the click command and
batch plan keys are both made from them), its agent (``agents/<agent>.js``) and the ``cmodule/``
files its CModule compiles, the agent defaults its options start from, its analyzer and the type
of its summary, its views (what ``flamegraph``, ``export`` and ``diff`` show; the summary's
``profile(view)`` makes them), its place in the report, its console view, its report chapter,
its doctor checks and the statistics the live view shows while it runs.  ``cli``, ``batch``,
``agentbuild``, ``report``, ``doctor``, the views and the live view find tracers here and
nowhere else; a module of this package that defines ``TRACER`` is registered by being there
(docs/architecture.md, "Adding a tracer").

A tracer module is light: what a capture's start needs (options, agent, live statistics) is
imported with it; its analyzer, summary type, report chapter and schemas are named by reference
(``"module:attribute"``, :func:`resolve`) and imported when first used, and its console view
imports its rendering when it renders -- a capture's start does not pay for importing every
tracer's analysis and report (issue 21: fixed cost; tests/unit/test_registry.py checks that
importing the registry imports none of them).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memtrace import capture
from memtrace.tracers.options import Option

if TYPE_CHECKING:
    from rich.console import Console

    from memtrace.capture import Event, Record, Result
    from memtrace.live import LiveStats


# "package.module:attribute": imported by resolve() when first used.
Ref = str


def resolve(ref: Any) -> Any:
    """What a :data:`Ref` names (imported now); anything else is itself."""
    if not isinstance(ref, str):
        return ref
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


def lazy(ref: Ref) -> Callable[[], Any]:
    """A function that makes what ``ref`` names (a class: an instance) when called, importing it then."""
    def make() -> Any:
        return resolve(ref)()
    make.__qualname__ = make.__name__ = ref.rpartition(":")[2]
    return make


@dataclass(frozen=True)
class Tracer:
    name: str
    help: str                                         # one line: the command's --help and the docs
    description: str                                  # the command's docstring body
    options: tuple[Option, ...]
    analyzer: str                                     # module with summarize(records) -> summary_type
    summary_type: type | Ref                          # the class, or a Ref to it (resolved when used)
    console: Callable[[Console, Any, dict[str, Any]], None]   # (console, summary, host options)
    live: Callable[[], LiveStats]                     # a fresh live statistics tally per capture
    # A report.chapters.Chapter (report.chapters.chapter_of: None is the generic one); typed Any
    # so the registry does not import the report (no import cycle: tests/unit/test_import_graph.py);
    # lazy(ref) makes one without importing the report before it is needed.
    chapter: Callable[[], Any] | None = None
    agent: str = ""                                   # default: the tracer's name
    json_top_option: str = "top"                      # the option that bounds JSON rows
    before_launch: Callable[[dict[str, Any]], None] | None = None   # host checks, e.g. an output file
    window_end: Callable[[Any], None] | None = None   # (capture loop) before the hooks come out: malloc --leaks
    # (option values, target, capture options) -> the AgentHost to capture through, or None for
    # Frida's: malloc --backend dvt records through a stock device's Instruments services.
    host: Callable[[dict[str, Any], Any, Any], Any] | None = None
    # cmodule/ files the agent's CModule compiles, in order, after the generated layout header
    # (every tracer agent also compiles agentbuild.PROCESS_SOURCES on its own).
    c_sources: tuple[str, ...] = ()
    # The agent config before the options: what the agent needs that no option sets (table sizes),
    # and per platform (``hello``'s ``platform``) what differs there.  Only this tracer's agent
    # is sent them.
    agent_defaults: Mapping[str, Any] = field(default_factory=dict)
    agent_sizing: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The views of its captures, the default first (the summary's profile(view) makes each).
    views: tuple[str, ...] = ("gross",)
    # Views pprof writes as a heap profile (alloc and inuse sample types together).
    heap_views: tuple[str, ...] = ()
    # ``show --sort`` orders (the first is the default); empty: the tables have one order.
    sorts: tuple[str, ...] = ()
    report_order: int = 100                           # the report tells tracers in this order, then by name
    # doctor: the checks beyond load/install/hook points (names doctor.py knows) and the agent
    # config it loads the agent with, on top of the defaults.
    doctor_checks: tuple[str, ...] = ()
    # The platform whose entry points it hooks ("darwin": iosurface, purgeable, probe); None: every
    # platform's (doctor: missing hook points elsewhere are expected, not a fault).
    hooks_platform: str | None = None
    doctor_config: Mapping[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    # What the capture reader checks this tracer's JSON against (memtrace/schema.py): its event
    # types (capture.Event subclasses, by their TYPE) and its RESULT record's (a capture.Result);
    # either may be a Ref, resolved when a capture is first read.
    events: tuple[type[Event], ...] | Ref = ()
    result: type[Result] | Ref | None = None

    @property
    def agent_name(self) -> str:
        return self.agent or self.name

    def summarize(self, records: Iterable[Record]) -> Any:
        summary = importlib.import_module(self.analyzer).summarize(records)
        if not isinstance(summary, self.summary_class):
            raise TypeError(f"{self.analyzer}.summarize returned a {type(summary).__name__}, "
                            f"not the {self.name} tracer's {self.summary_class.__name__}")
        return summary

    @property
    def summary_class(self) -> type:
        found = resolve(self.summary_type)
        assert isinstance(found, type), f"{self.name}: summary_type {self.summary_type!r} is no class"
        return found

    @property
    def event_types(self) -> tuple[type[Event], ...]:
        return tuple(resolve(self.events))

    @property
    def result_type(self) -> type[Result] | None:
        found: type[Result] | None = resolve(self.result)
        return found

    def agent_config(self, platform: str | None, explicit: Mapping[str, Any]) -> dict[str, Any]:
        """The agent config for a target platform: this tracer's defaults, then the platform's
        sizing, then what the user asked for (an option left unset is None: the platform's)."""
        return {**self.agent_defaults, **self.agent_sizing.get(platform or "", {}),
                **{k: v for k, v in explicit.items() if v is not None}}


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
    return dict(sorted(found.items(), key=lambda kv: (kv[1].report_order, kv[0])))


_REGISTRY: dict[str, Tracer] | None = None


def all_tracers() -> dict[str, Tracer]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _discover()
    return _REGISTRY


def _schemas() -> list[tuple[str, tuple[type[Event], ...], type[Result] | None]]:
    return [(t.name, t.event_types, t.result_type) for t in all_tracers().values()]


# The capture reader checks each tracer's events and results by the types the tracer declares.
capture.use_tracer_schemas(_schemas)


def names() -> tuple[str, ...]:
    return tuple(all_tracers())


def get(name: str) -> Tracer | None:
    return all_tracers().get(name)


def all_views() -> tuple[str, ...]:
    """Every view some tracer has (a command's --view choices), each once, in registry order."""
    return tuple(dict.fromkeys(v for t in all_tracers().values() for v in t.views))
