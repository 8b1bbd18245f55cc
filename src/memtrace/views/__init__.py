"""What users look at after a capture: one saved capture loaded through the tracer registry.

``show``, ``diff``, ``flamegraph`` and ``export`` all start here: the capture's META names its
tracer, the registry gives the analyzer, and the summary comes out exactly as at the end of a
capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrace import tracers
from memtrace.capture import CaptureInfo, RecordType, read_records
from memtrace.errors import InputError
from memtrace.tracers import Tracer


@dataclass
class Loaded:
    path: Path
    tracer: Tracer
    summary: Any
    info: CaptureInfo
    # What a writer had to change to fit its format (a value beyond pprof's int64 ...): one line each.
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.path)


def tracer_of(path: Path | str) -> tuple[Tracer, CaptureInfo]:
    """The registered tracer the capture's META names (a clear error if it names none)."""
    info = CaptureInfo(Path(path))
    records = read_records(path, info)
    try:
        first = next(records, None)
    finally:
        records.close()
    if first is None:
        if info.truncated or info.n_skipped:
            raise InputError(f"{info.path}: no record could be read ({info.problem})")
        raise InputError(f"{info.path}: empty capture (header only, no records)")
    if first.type != RecordType.META:
        why = f" ({info.problem})" if info.n_skipped else ": not a memtrace capture"
        raise InputError(f"{info.path}: first record is {first.type.name}, not META{why}")
    name = str(first.body.get("tracer") or "?")
    tracer = tracers.get(name)
    if tracer is None:
        raise InputError(f"{info.path}: tracer {name!r} has no analyzer in this memtrace "
                         f"(known: {', '.join(tracers.names())})")
    return tracer, info


def load(path: Path | str) -> Loaded:
    """One capture (file or folder), summarized by its own tracer's analyzer."""
    tracer, info = tracer_of(path)
    info = CaptureInfo(info.path)
    summary = tracer.summarize(read_records(path, info))
    return Loaded(path=info.path, tracer=tracer, summary=summary, info=info)
