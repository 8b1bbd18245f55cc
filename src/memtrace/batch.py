"""Batch runs: targets x tracers x windows from a YAML plan, retried at other attach delays.

A failed target never stops the batch; a re-run skips runs already done (``run.json``) unless
forced; every run's capture lands in one folder, ready for ``memtrace report``.

Plan (YAML)::

    out: batch-out                 # optional; --out wins
    defaults:                      # any run key, applied to every run
      device: local
      window: 20
      attach_delay: 0
      retries: 1                   # extra attempts when a run dies early
      retry_delay_step: 5          # each retry attaches this much later
      rpc_timeout: 20              # death thresholds, as the command-line options of the same name
      storm_seconds: 10
      storm_rate: 20000
      stream_rate: 2000
    runs:
      - label: json_service        # folder name prefix; default from the target
        program: [build/demo/json_service, --scale, "2"]    # or app: BUNDLE_ID / pid: N / name: NAME
        tracers: [malloc]          # malloc | iosurface | purgeable | probe | fds | threads
        window: 10
        options: {stack_threshold: 4096}    # tracer options, as on the command line
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from memtrace import tracers
from memtrace.capture import (
    FILE_NAME,
    CaptureError,
    RecordType,
    alloc_totals,
    append_record,
    calls_total,
    read_records,
)
from memtrace.capture_loop import CAPTURE_OPTIONS, CaptureOptions, CaptureResult, capture_options, run_capture
from memtrace.errors import InputError, MemtraceError
from memtrace.files import load_yaml, read_user_text, write_json_atomic
from memtrace.target import TARGET_OPTIONS, TargetSpec
from memtrace.tracers.options import Option, agent_config, convert_plan_values
from memtrace.ui import UI

EARLY_DEATHS = ("launch-storm", "perpetual-stream", "slow-start")
# Keys of a run (and of ``defaults``): the target and capture options as declared for the
# command line, plus the batch's own.
RUN_OPTIONS: tuple[Option, ...] = tuple(o for o in (*TARGET_OPTIONS, *CAPTURE_OPTIONS) if o.in_plans) + (
    Option("retries", int, 1, "Extra attempts when a run dies early.", check=lambda v: None if v >= 0
           else "must be zero or more"),
    Option("retry_delay_step", float, 5.0, "Each retry attaches this much later.",
           check=lambda v: None if 0 <= v < float("inf") else "must be zero or a positive, finite number"),
)
STRUCTURE_KEYS = ("label", "program", "tracers", "options")
LABEL = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")
RUN_MARKER = "run.json"


@dataclass
class Run:
    label: str
    target: TargetSpec
    tracer: str
    values: dict[str, Any]          # run options (window, attach_delay, thresholds, retries ...)
    options: dict[str, Any]         # the tracer's own options, converted

    @property
    def key(self) -> str:
        return f"{self.label}-{self.tracer}"

    @property
    def retries(self) -> int:
        return int(self.values.get("retries", 1))

    @property
    def retry_delay_step(self) -> float:
        return float(self.values.get("retry_delay_step", 5.0))

    def capture_options(self, out: Path, attach_delay: float) -> CaptureOptions:
        tracer = tracers.get(self.tracer)
        assert tracer is not None
        opts = capture_options(self.tracer, {**self.values, "attach_delay": attach_delay, "out": out},
                               agent_config(tracer.options, self.options))
        return opts


@dataclass
class RunOutcome:
    label: str
    tracer: str
    outcome: str
    attempts: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0
    bytes: int = 0
    capture: str | None = None
    skipped: bool = False
    note: str = ""
    interrupted: int | None = None     # Ctrl-C (2), SIGTERM or SIGHUP ended this run: the batch stops here

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "tracer": self.tracer, "outcome": self.outcome, "events": self.events,
                "bytes": self.bytes, "capture": self.capture, "attempts": self.attempts,
                "skipped": self.skipped, "note": self.note}


def load_plan(path: Path) -> tuple[dict[str, Any], list[Run]]:
    """The plan's runs, every key and value checked as the command line checks them."""
    try:
        text = read_user_text(path, "plan")
        doc = load_yaml(text, str(path))
    except FileNotFoundError:
        raise InputError(f"{path}: no such plan") from None
    except (OSError, yaml.YAMLError) as e:
        raise InputError(f"{path}: not a readable YAML plan: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list) or not doc["runs"]:
        raise InputError(f"{path}: a plan needs a non-empty 'runs' list")
    unknown = sorted(str(k) for k in doc if k not in ("out", "defaults", "runs"))
    if unknown:
        raise InputError(f"{path}: unknown top-level key(s) {', '.join(unknown)} (known: out, defaults, runs)")
    if doc.get("out") is not None and not isinstance(doc["out"], str):
        raise InputError(f"{path}: out: expected a folder name, got {doc['out']!r}")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise InputError(f"{path}: 'defaults' must be a mapping")
    runs: list[Run] = []
    for i, raw in enumerate(doc["runs"], 1):
        if not isinstance(raw, dict):
            raise InputError(f"{path}: run {i} is not a mapping")
        runs += _runs_of(path, i, {**defaults, **raw})
    keys = [r.key for r in runs]
    dupes = {k for k in keys if keys.count(k) > 1}
    if dupes:
        raise InputError(f"{path}: duplicate run label(s) {', '.join(sorted(dupes))}; give each a distinct 'label'")
    return doc, runs


def _runs_of(path: Path, i: int, spec: dict[str, Any]) -> list[Run]:
    where = f"{path}: run {i}"
    by_name = {o.name: o for o in RUN_OPTIONS}
    unknown = sorted(str(k) for k in spec if k not in by_name and k not in STRUCTURE_KEYS)
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)} "
                         f"(known: {', '.join(sorted((*by_name, *STRUCTURE_KEYS)))})")
    values = {k: by_name[k].convert(v, where) for k, v in spec.items() if k in by_name and v is not None}
    program = spec.get("program")
    if isinstance(program, str):
        program = program.split()
    if program is not None and (not isinstance(program, list) or not all(isinstance(a, str | int | float)
                                                                          for a in program)):
        raise InputError(f"{where}: program: expected a command line (a string or a list of words), got {program!r}")
    target = TargetSpec(device=str(values.get("device", "auto")), app=values.get("app"), pid=values.get("pid"),
                        name=values.get("name"), argv=[str(a) for a in program or []],
                        launch=str(values.get("launch", "auto")))
    try:
        target.validate()
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    names = _tracer_names(spec.get("tracers", ["malloc"]), where)
    raw_options = spec.get("options") or {}
    if not isinstance(raw_options, dict):
        raise InputError(f"{where}: options: expected a mapping of tracer options, got {raw_options!r}")
    label = spec.get("label")
    if label is None:
        label = target.slug()
    elif not isinstance(label, str | int) or not LABEL.match(str(label)) or str(label) in (".", ".."):
        raise InputError(f"{where}: label {label!r}: a label is a name (letters, digits, '.', '_', '-'), "
                         f"not a path")
    runs = []
    claimed: set[str] = set()
    for name in names:
        tracer = tracers.get(name)
        assert tracer is not None
        declared = {o.name for o in tracer.options if o.in_plans}
        mine = {k: v for k, v in raw_options.items() if k in declared}
        claimed |= set(mine)
        runs.append(Run(label=str(label), target=target, tracer=name, values=values,
                        options=convert_plan_values(tracer.options, mine, f"{where}: {name} options")))
    stray = sorted(str(k) for k in raw_options if k not in claimed)
    if stray:
        known = sorted({o.name for n in names for o in tracers.get(n).options if o.in_plans})  # type: ignore[union-attr]
        raise InputError(f"{where}: unknown option(s) {', '.join(stray)} for {', '.join(names)} "
                         f"(known: {', '.join(known) or 'none'})")
    return runs


def _tracer_names(value: Any, where: str) -> list[str]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(t, str) for t in names):
        raise InputError(f"{where}: tracers: expected a tracer name or a list of them, got {value!r}")
    for t in names:
        if tracers.get(t) is None:
            raise InputError(f"{where}: unknown tracer {t!r} (one of {', '.join(tracers.names())})")
    return names


def run_batch(runs: list[Run], out: Path, force: bool, ui_factory: Callable[[], UI],
              on_outcome: Callable[[RunOutcome], None] | None = None) -> list[RunOutcome]:
    out.mkdir(parents=True, exist_ok=True)
    outcomes = []
    stopped: int | None = None
    for run in runs:
        result = _run_one(run, out / run.key, force, ui_factory)
        outcomes.append(result)
        if on_outcome is not None:
            on_outcome(result)
        if result.interrupted is not None:
            # The user stopped it: the run in progress kept its capture (END says so); the rest of
            # the plan is not started, and batch.json says which runs those are.
            stopped = result.interrupted
            break
    doc: dict[str, Any] = {"kind": "batch", "runs": [o.to_json() for o in outcomes]}
    if stopped is not None:
        doc["interrupted"] = signal.Signals(stopped).name
        doc["not_run"] = [{"label": r.label, "tracer": r.tracer} for r in runs[len(outcomes):]]
    write_json_atomic(out / "batch.json", doc)
    return outcomes


def _run_one(run: Run, folder: Path, force: bool, ui_factory: Callable[[], UI]) -> RunOutcome:
    done = folder / "run.json"
    if done.exists() and not force:
        try:
            previous = json.loads(done.read_text())
            if previous["outcome"] == "failed":
                raise ValueError("failed runs are retried")
            o = RunOutcome(run.label, run.tracer, previous["outcome"], previous.get("attempts", []),
                           previous.get("events", 0), previous.get("bytes", 0), previous.get("capture"),
                           skipped=True, note="done in an earlier run of this plan (--force reruns it)")
            return o
        except (OSError, ValueError, KeyError):
            pass
    if folder.exists():
        # Only ever delete what an earlier run of memtrace made.
        if not _made_by_batch(folder):
            raise InputError(f"{folder}: exists and was not made by memtrace batch; move it or choose another --out")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    attempts: list[dict[str, Any]] = []
    results: list[CaptureResult] = []
    interrupted: int | None = None
    delay = float(run.values.get("attach_delay", 0.0))
    for n in range(1, run.retries + 2):
        options = run.capture_options(folder / f"attempt-{n}", delay)
        try:
            if n == 1:
                _before_launch(run)
            spec = replace(run.target, argv=list(run.target.argv))
            found = tracers.get(run.tracer)
            host = found.host({**run.values, **run.options}, spec, options) if found and found.host else None
            r = run_capture(run.tracer, spec, options, ui_factory(), host=host)
        except MemtraceError as e:
            attempts.append({"attempt": n, "attach_delay": delay, "ended": "failed", "reason": str(e)})
            break
        results.append(r)
        attempts.append({"attempt": n, "attach_delay": delay, "ended": r.ended, "reason": r.reason,
                         "alive_after_start_s": r.evidence.get("alive_after_start_s")})
        if r.interrupted:
            interrupted = r.signal or signal.SIGINT
            break
        if r.ended not in EARLY_DEATHS:
            break
        delay += run.retry_delay_step
    outcome = RunOutcome(run.label, run.tracer, attempts[-1]["ended"] if attempts else "failed", attempts,
                         interrupted=interrupted)
    if attempts and attempts[-1]["ended"] == "failed":
        outcome.note = attempts[-1]["reason"]
    if results:
        final = results[-1]
        streaming = [r for r in results if r.ended in ("launch-storm", "perpetual-stream")]
        if len(streaming) >= 2 and final.ended in ("launch-storm", "perpetual-stream"):
            # Killed under a never-settling stream at two different attach times: the stream,
            # not the attach, is what kills it.
            outcome.outcome = "perpetual-stream"
            verdict = {"ended": "perpetual-stream", "confidence": "confirmed",
                       "reason": "killed under a high allocation rate at every attach delay tried "
                                 f"({', '.join(str(a['attach_delay']) for a in attempts)} s)",
                       "evidence": {"attempts": attempts}}
            append_record(final.path, RecordType.END, {**_last_end(final.path), **verdict})
        elif len(results) > 1:
            outcome.note = f"after {attempts[0]['ended']} at attach delay {attempts[0]['attach_delay']} s"
        target = folder / FILE_NAME
        os.replace(final.path, target)
        for r in results[:-1]:
            os.replace(r.path, r.path.with_name(FILE_NAME + ".failed"))
        outcome.capture = str(target)
        outcome.events, outcome.bytes = _events_and_bytes(target)
    write_json_atomic(done, outcome.to_json())
    return outcome


def _before_launch(run: Run) -> None:
    """The tracer's own checks before anything is launched, as the command line makes them."""
    tracer = tracers.get(run.tracer)
    if tracer is not None and tracer.before_launch is not None:
        tracer.before_launch({**run.values, **run.options})


def _made_by_batch(folder: Path) -> bool:
    """A run folder holds only what a run writes: run.json, attempt-N/, capture.mtc(.failed)."""
    names = {p.name for p in folder.iterdir()}
    return all(n in (RUN_MARKER, FILE_NAME, FILE_NAME + ".failed") or re.fullmatch(r"attempt-\d+", n)
               for n in names)


def _last_end(path: Path) -> dict[str, Any]:
    end: dict[str, Any] = {}
    for rec in read_records(path):
        if rec.type == RecordType.END:
            end = rec.body
    return end


def _events_and_bytes(path: Path) -> tuple[int, int]:
    """Allocation calls and gross bytes (malloc), or event count and summed sizes (other tracers)."""
    events = nbytes = 0
    counters: list[int] | None = None
    try:
        for rec in read_records(path):
            if rec.type == RecordType.BATCH and rec.body.get("counters"):
                counters = rec.body["counters"]
            elif rec.type == RecordType.EVENTS:
                for ev in rec.body.get("events", []):
                    events += 1
                    size = ev.get("bytes", ev.get("size", ev.get("alloc_size")))
                    if isinstance(size, int):
                        nbytes += size
    except CaptureError:
        pass
    if counters and calls_total(counters):
        return alloc_totals(counters)
    return events, nbytes
