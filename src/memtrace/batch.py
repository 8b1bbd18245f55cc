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
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from memtrace.capture import FILE_NAME, CaptureError, RecordType, alloc_totals, append_record, read_records
from memtrace.deaths import DeathThresholds
from memtrace.errors import InputError, MemtraceError
from memtrace.files import write_json_atomic
from memtrace.session import CaptureOptions, CaptureResult, CaptureSession, TargetSpec
from memtrace.ui import UI

TRACERS = ("malloc", "iosurface", "purgeable", "probe", "fds", "threads")
EARLY_DEATHS = ("launch-storm", "perpetual-stream", "slow-start")
RUN_KEYS = {"label", "program", "app", "pid", "name", "device", "launch", "tracers", "window", "attach_delay",
            "retries", "retry_delay_step", "options", "rpc_timeout", "storm_seconds", "storm_rate", "stream_rate"}


@dataclass
class Run:
    label: str
    target: TargetSpec
    tracer: str
    window: float
    attach_delay: float
    retries: int
    retry_delay_step: float
    options: dict[str, Any]
    thresholds: DeathThresholds

    @property
    def key(self) -> str:
        return f"{self.label}-{self.tracer}"


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

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "tracer": self.tracer, "outcome": self.outcome, "events": self.events,
                "bytes": self.bytes, "capture": self.capture, "attempts": self.attempts,
                "skipped": self.skipped, "note": self.note}


def load_plan(path: Path) -> tuple[dict[str, Any], list[Run]]:
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such plan") from None
    except (OSError, yaml.YAMLError) as e:
        raise InputError(f"{path}: not a readable YAML plan: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list) or not doc["runs"]:
        raise InputError(f"{path}: a plan needs a non-empty 'runs' list")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise InputError(f"{path}: 'defaults' must be a mapping")
    runs: list[Run] = []
    for i, raw in enumerate(doc["runs"], 1):
        if not isinstance(raw, dict):
            raise InputError(f"{path}: run {i} is not a mapping")
        spec = {**defaults, **raw}
        unknown = set(spec) - RUN_KEYS
        if unknown:
            raise InputError(f"{path}: run {i}: unknown key(s) {', '.join(sorted(unknown))}")
        program = spec.get("program")
        if isinstance(program, str):
            program = program.split()
        target = TargetSpec(device=str(spec.get("device", "auto")), app=spec.get("app"), pid=spec.get("pid"),
                            name=spec.get("name"), argv=[str(a) for a in program or []],
                            launch=str(spec.get("launch", "auto")))
        try:
            target.validate()
        except InputError as e:
            raise InputError(f"{path}: run {i}: {e}") from None
        tracers = spec.get("tracers") or ["malloc"]
        for t in tracers:
            if t not in TRACERS:
                raise InputError(f"{path}: run {i}: unknown tracer {t!r} (one of {', '.join(TRACERS)})")
        label = str(spec.get("label") or target.slug())
        for t in tracers:
            try:
                runs.append(Run(label=label, target=target, tracer=t, window=float(spec.get("window", 60)),
                                attach_delay=float(spec.get("attach_delay", 0)),
                                retries=int(spec.get("retries", 1)),
                                retry_delay_step=float(spec.get("retry_delay_step", 5)),
                                options=dict(spec.get("options") or {}),
                                thresholds=DeathThresholds(
                                    rpc_timeout=float(spec.get("rpc_timeout", 20)),
                                    storm_seconds=float(spec.get("storm_seconds", DeathThresholds.storm_seconds)),
                                    storm_rate=float(spec.get("storm_rate", DeathThresholds.storm_rate)),
                                    stream_rate=float(spec.get("stream_rate", DeathThresholds.stream_rate)))))
            except (TypeError, ValueError) as e:
                raise InputError(f"{path}: run {i}: {e}") from None
    keys = [r.key for r in runs]
    dupes = {k for k in keys if keys.count(k) > 1}
    if dupes:
        raise InputError(f"{path}: duplicate run label(s) {', '.join(sorted(dupes))}; give each a distinct 'label'")
    return doc, runs


def agent_config(tracer: str, options: dict[str, Any]) -> dict[str, Any]:
    """Plan options use the command line's names (stack_threshold); agents use camelCase."""
    names = {"live_threshold": "liveThreshold", "stack_threshold": "stackThreshold", "frames": "frames",
             "sample_bytes": "sampleBytes", "backend": "backend"}
    out = {}
    for k, v in options.items():
        key = names.get(k) or "".join(w if i == 0 else w.title() for i, w in enumerate(k.split("_")))
        out[key] = v
    return out


def run_batch(runs: list[Run], out: Path, force: bool, ui_factory: Callable[[], UI],
              on_outcome: Callable[[RunOutcome], None] | None = None) -> list[RunOutcome]:
    out.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for run in runs:
        result = _run_one(run, out / run.key, force, ui_factory)
        outcomes.append(result)
        if on_outcome is not None:
            on_outcome(result)
    write_json_atomic(out / "batch.json", {"kind": "batch", "runs": [o.to_json() for o in outcomes]})
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
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    attempts: list[dict[str, Any]] = []
    results: list[CaptureResult] = []
    delay = run.attach_delay
    for n in range(1, run.retries + 2):
        options = CaptureOptions(tracer=run.tracer, window=run.window, attach_delay=delay,
                                 out=folder / f"attempt-{n}", agent_config=agent_config(run.tracer, run.options),
                                 thresholds=run.thresholds)
        try:
            r = CaptureSession(replace(run.target, argv=list(run.target.argv)), options, ui_factory()).run()
        except MemtraceError as e:
            attempts.append({"attempt": n, "attach_delay": delay, "ended": "failed", "reason": str(e)})
            break
        results.append(r)
        attempts.append({"attempt": n, "attach_delay": delay, "ended": r.ended, "reason": r.reason,
                         "alive_after_start_s": r.evidence.get("alive_after_start_s")})
        if r.ended not in EARLY_DEATHS or r.interrupted:
            break
        delay += run.retry_delay_step
    outcome = RunOutcome(run.label, run.tracer, attempts[-1]["ended"] if attempts else "failed", attempts)
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
    if counters and any(counters[:16]):
        return alloc_totals(counters)
    return events, nbytes
