"""The tracer registry: every registered tracer is reachable from the CLI, batch plans and the report.

A tracer registered but missing from one of them fails here, instead of being skipped silently.
The last test adds a tracer the way docs/architecture.md says -- one module in memtrace/tracers/
with an analyzer -- and checks it appears everywhere with nothing else changed.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from memtrace import tracers
from memtrace.batch import load_plan
from memtrace.capture import CaptureWriter, RecordType
from memtrace.commands.trace import make_command
from memtrace.report import build_report
from memtrace.report.chapters import chapter_of

EXPECTED = ("malloc", "iosurface", "purgeable", "probe", "fds", "threads")


def test_the_six_tracers_are_registered_in_report_order() -> None:
    assert tracers.names()[:len(EXPECTED)] == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_every_registered_tracer_has_a_cli_command_with_its_options(name: str) -> None:
    from memtrace.cli import cli

    tracer = tracers.get(name)
    assert tracer is not None
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    flags = {opt for p in command.params for opt in getattr(p, "opts", [])}
    for option in tracer.options:
        assert option.flag in flags, f"{name}: {option.flag} is declared but not on the command line"
    help_text = CliRunner().invoke(cli, [name, "--help"]).output
    assert tracer.help.split(":")[0] in " ".join(help_text.split())


@pytest.mark.parametrize("name", EXPECTED)
def test_every_registered_tracer_runs_in_a_batch_plan_with_its_options(name: str, tmp_path: Path) -> None:
    tracer = tracers.get(name)
    assert tracer is not None
    options = {o.name: o.default for o in tracer.options if o.in_plans and o.default is not None}
    plan = tmp_path / "plan.yaml"
    import yaml

    plan.write_text(yaml.safe_dump({"runs": [{"program": ["/bin/true"], "tracers": [name], "options": options}]}))
    _, runs = load_plan(plan)
    assert [(r.tracer, r.options) for r in runs] == [(name, options)]


def _empty_capture(folder: Path, tracer: str, target: str) -> None:
    folder.mkdir(parents=True)
    with CaptureWriter(folder / "capture.mtc") as w:
        w.write(RecordType.META, {"tracer": tracer, "target": {"label": target}, "options": {"window": 1}})
        w.write(RecordType.RECON, {"symbols": [], "info": {}})
        w.write(RecordType.END, {"ended": "completed", "reason": "the 1 s window completed",
                                 "timing": {"captured_s": 1.0}})


def test_every_registered_tracer_has_a_report_chapter(tmp_path: Path) -> None:
    for name in tracers.names():
        _empty_capture(tmp_path / f"t-{name}", name, f"target-{name}")
    result = build_report(tmp_path, out=tmp_path / "out")
    assert result.skipped == []
    doc = result.document
    for name in tracers.names():
        (t,) = [t for t in doc["targets"] if t["target"] == f"target-{name}"]
        assert t[name] is not None, f"{name}: the report did not aggregate its capture"
        chapter = chapter_of(tracers.get(name)).markdown(doc["targets"])
        assert chapter, f"{name}: registered, analyzed, but its chapter renders nothing"
        assert chapter[0] in result.markdown.splitlines()


# ---- adding a tracer: one module with TRACER, its analyzer; nothing else -----------------------

REGIONS_ENTRY = '''
from memtrace.live import LiveStats
from memtrace.report.chapters import Column, GenericChapter
from memtrace.tracers import Tracer
from memtrace.tracers.options import Option, at_least


def console_view(console, summary, opts):
    console.print(f"regions: {summary.count}")


class RegionsChapter(GenericChapter):
    """Its part of the report's shared sections: a panorama column and a leaks column."""

    panorama_columns = (Column("regions mapped", "r", 45, lambda r: r["zz_regions_mapped"] or "not traced"),)
    panorama_legend = "regions mapped = mmap calls"
    leak_headings = ("regions never unmapped",)
    leak_legend = "regions: mapped and never unmapped."

    def __init__(self):
        super().__init__("zz_regions")

    def panorama(self, agg):
        return {"zz_regions_mapped": sum(e["regions"] for e in agg) if agg else None}

    def leak_cells(self, agg):
        return ([str(sum(e["regions"] for e in agg))] if agg else ["not traced"]), bool(agg)


TRACER = Tracer(
    name="zz_regions", help="Trace mmap/munmap regions.", description="A tracer added by a test.",
    options=(Option("min_bytes", int, 4096, "Smallest region.", agent_key="minBytes", check=at_least(0)),),
    analyzer="zz_regions_analyzer", summary_type=object, console=console_view, live=LiveStats,
    chapter=RegionsChapter,
)
'''

REGIONS_ANALYZER = '''
from memtrace.analyze.context import CaptureContext, fold_events, frames_json


class RegionsSummary(CaptureContext):
    count: int = 0
    bytes: int = 0

    def fold_event(self, ev):
        self.count += 1
        self.bytes += ev.get("bytes", 0)

    def to_json(self, capture=None, top=20):
        return {**self.header_json("zz_regions", capture), "regions": self.count, "bytes": self.bytes,
                "by_stack": [{"count": self.count, "bytes": self.bytes, "frames": []}], **self.timing_json()}


def summarize(records):
    return fold_events(RegionsSummary(), records)
'''


@pytest.fixture
def added_tracer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    entries = tmp_path / "entries"
    entries.mkdir()
    (entries / "zz_regions.py").write_text(REGIONS_ENTRY)
    (tmp_path / "zz_regions_analyzer.py").write_text(REGIONS_ANALYZER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tracers, "__path__", [*tracers.__path__, str(entries)])
    monkeypatch.setattr(tracers, "_REGISTRY", None)
    yield "zz_regions"
    sys.modules.pop("memtrace.tracers.zz_regions", None)
    sys.modules.pop("zz_regions_analyzer", None)
    tracers._REGISTRY = None


def test_a_new_tracer_module_is_reachable_everywhere(added_tracer: str, tmp_path: Path) -> None:
    tracer = tracers.get(added_tracer)
    assert tracer is not None and tracers.names()[-1] == added_tracer
    command = make_command(tracer)
    assert "--min-bytes" in {o for p in command.params for o in getattr(p, "opts", [])}
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"runs:\n  - program: /bin/true\n    tracers: [{added_tracer}]\n    options: {{min_bytes: 0}}\n")
    (run,) = load_plan(plan)[1]
    assert (run.tracer, run.options) == (added_tracer, {"min_bytes": 0})
    folder = tmp_path / "caps" / "one"
    _empty_capture(folder, added_tracer, "app")
    with CaptureWriter(folder / "more.mtc") as w:
        w.write(RecordType.META, {"tracer": added_tracer, "target": {"label": "app"}})
        w.write(RecordType.EVENTS, {"events": [{"type": "map", "bytes": 8192}, {"type": "map", "bytes": 4096}]})
        w.write(RecordType.END, {"ended": "completed", "reason": "done"})
    result = build_report(tmp_path / "caps", out=tmp_path / "out")
    assert result.skipped == []
    (t,) = result.document["targets"]
    assert sorted(e["regions"] for e in t[added_tracer]) == [0, 2]
    assert f"## {added_tracer}" in result.markdown
    # Its parts of the shared sections, from its chapter alone: a panorama column (placed between
    # purgeable's and the dominant families) and a leaks column.
    assert result.document["panorama"][0]["zz_regions_mapped"] == 2
    lines = result.markdown.splitlines()
    heads = lines[lines.index("## Panorama: business × memory") + 4]
    assert "| purgeable held | regions mapped | dominant families |" in heads
    assert "purgeable held = VOLATILE/EMPTY bytes not counted in footprint; regions mapped = mmap calls." in result.markdown
    assert "| target | malloc leaked | malloc still reachable | fds still open | threads leaked | " \
           "regions never unmapped |" in lines
    assert "| app | not traced | — | not traced | not traced | 2 |" in lines
    # Its views: the default one, its summary's stack rows, through the views protocol.
    from memtrace.views import load
    from memtrace.views.diff import diff
    from memtrace.views.profile import profile

    loaded = load(folder / "more.mtc")
    assert loaded.tracer.views == ("gross",)
    p = profile(loaded)
    assert (p.tracer, p.view, p.missing, p.total_bytes, p.total_count) == (added_tracer, "gross", None, 12288, 2)
    assert "a zz_regions capture has its stack rows only" in (profile(loaded, "live").missing or "")
    (pair,) = diff(folder / "capture.mtc", folder / "more.mtc")["pairs"]
    assert pair["tracer"] == added_tracer and pair["views"]["gross"]["total"] == {"base": 0, "new": 12288,
                                                                                 "delta": 12288}


def test_a_tracer_whose_analyzer_returns_another_type_is_refused() -> None:
    malloc = tracers.get("malloc")
    assert malloc is not None
    from dataclasses import replace

    from memtrace.analyze.fds import FdsSummary

    wrong = replace(malloc, summary_type=FdsSummary)
    with pytest.raises(TypeError, match="not the malloc tracer's FdsSummary"):
        wrong.summarize([])
    assert type(malloc.summarize([])) is malloc.summary_class


def test_importing_the_registry_imports_no_analysis_nor_report() -> None:
    """A capture's start pays for what it uses (issue 21, item 6): the registry names each
    tracer's analyzer, summary type, chapter and schemas by reference; they are imported when used."""
    code = "import sys, memtrace.cli, memtrace.capture_loop, memtrace.frida_host; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    heavy = {m for m in out.stdout.split() if m.startswith(("memtrace.analyze.", "memtrace.report.", "memtrace.views",
                                                            "memtrace.exports", "memtrace.symbols", "pydemumble"))
             or m == "memtrace.report"}
    # Not even the symbol table the capture loop names stacks with, nor the demangler, nor
    # frida-tools' application module (its Reactor runs the calls after the injection): imported
    # while Frida injects (capture_loop._preload).
    assert heavy == set(), heavy
    assert "frida_tools.application" not in out.stdout.split()


def test_every_tracer_reference_resolves_to_what_it_declares() -> None:
    from memtrace.capture import Event, Result
    from memtrace.report.chapters import BaseChapter

    for t in tracers.all_tracers().values():
        assert isinstance(t.summary_class, type), t.name
        assert all(isinstance(e, type) and issubclass(e, Event) for e in t.event_types), t.name
        assert t.result_type is None or issubclass(t.result_type, Result), t.name
        if t.chapter is not None:
            assert isinstance(t.chapter(), BaseChapter) and t.chapter().name == t.name, t.name
        # The views are written out in the tracer's module (not imported from its summary): the same.
        declared = getattr(t.summary_class, "VIEWS", None) or tuple(getattr(t.summary_class, "count_views", ()))
        if declared:
            assert t.views == tuple(declared), t.name


def test_registry_modules_import_cleanly() -> None:
    for name in tracers.names():
        importlib.import_module(tracers.get(name).analyzer)  # type: ignore[union-attr]
