"""A capture played back through the capture loop: a :class:`~memtrace.record_source.RecordSource`
whose "process" is an existing capture file.

What the agent sent (``events:batch`` with its binary records, ``events:json``, ``modules:update``,
the agent's own warnings, ``result``) is sent again, in order and unchanged; the agent's answers at
instrumentation (``hello``, ``init``, the calibrations) come from the capture's RECON and
CALIBRATION records.  When the records run out the "process" ends.  The loop writes a new capture
from them exactly as it does from a live backend -- window, live statistics, symbolization,
death evidence, END -- so a replay proves the seam (nothing of Frida is involved) and gives
tests a backend with exact, repeatable input.  It follows no children and scans no leaks (a
leak scan's RESULT in the capture is replayed as it was).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtrace.capture import Record, RecordType, read_records
from memtrace.errors import InputError, MemtraceError
from memtrace.launchers import Launched
from memtrace.record_source import ConfigFor, Ended, Instrumented, Notice, Records, RecordSource, SourceEvent

# The record types that carry what the agent sent, and the message type each was.
_SENT = {RecordType.BATCH: "events:batch", RecordType.EVENTS: "events:json", RecordType.MODULES: "modules:update",
         RecordType.RESULT: "result"}


class ReplaySource:
    """The records of the capture at ``path``, sent again."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        records = list(read_records(self.path))
        by_type: dict[RecordType, list[Record]] = {}
        for r in records:
            by_type.setdefault(r.type, []).append(r)
        if RecordType.META not in by_type or RecordType.RECON not in by_type:
            raise InputError(f"{self.path}: no META and RECON records: not a capture that can be replayed")
        self.meta: dict[str, Any] = by_type[RecordType.META][0].body
        self.recon: dict[str, Any] = by_type[RecordType.RECON][0].body
        self.calibrations = {r.body.get("phase"): {k: v for k, v in r.body.items() if k != "phase"}
                             for r in by_type.get(RecordType.CALIBRATION, [])}
        end = by_type.get(RecordType.END)
        self._pid = (end[0].body.get("pid") if end else None) or self.meta.get("target", {}).get("pid")
        self._sent = [self._as_event(r) for r in records if self._replayed(r)]
        # How the process ended, as the agent and the host said it then (its exit, its status).
        self.evidence: dict[str, Any] = dict((end[0].body.get("evidence") or {}) if end else {})
        if isinstance(self.evidence.get("exit"), dict):
            at_exit = self.calibrations.get("at-exit")
            self._sent.append(Records({"type": "agent:exit", **self.evidence["exit"],
                                       **({"calibration": at_exit} if at_exit else {})}))
        self._next = 0
        self._ended = False
        self._calibrated = False

    @staticmethod
    def _replayed(r: Record) -> bool:
        if r.type in _SENT:
            return True
        # The agent's own warnings (not the ones the loop wrote about children, exec, unwind tables).
        return r.type == RecordType.WARNING and isinstance(r.body, dict) and r.body.get("type") == "agent:warning"

    @staticmethod
    def _as_event(r: Record) -> Records:
        body = dict(r.body) if isinstance(r.body, dict) else {}
        body.setdefault("type", _SENT.get(r.type, "agent:warning"))
        if r.type == RecordType.MODULES:
            body.pop("loaded", None)        # nobody waits for an acknowledgement now
        return Records(body, r.data)

    # -- what the loop reads -------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return int(self._pid) if self._pid is not None else None

    @property
    def spawned(self) -> bool:
        return False            # memtrace starts and kills nothing

    @property
    def is_local(self) -> bool:
        # A local capture's modules are files on this machine: the host symbolizes as it did.
        return (self.recon.get("device") or {}).get("type") == "local"

    @property
    def hold_info(self) -> dict[str, Any] | None:
        hold = self.recon.get("hold")
        return dict(hold) if isinstance(hold, dict) else None

    @property
    def versions(self) -> dict[str, str]:
        return {"replay_of": str(self.path)}

    # -- phases ----------------------------------------------------------------------------------

    def open(self) -> dict[str, Any]:
        return dict(self.recon.get("device") or {})

    def launch(self, *, hold_constructors: bool = True, follow_children: bool = False) -> Launched:
        return Launched(self.pid or 0, None, suspended=False, spawned=False, how=f"replay of {self.path}")

    def held_images(self) -> Path | None:
        return None

    def attach(self) -> None:
        pass

    def instrument(self, agent: str, config_for: ConfigFor) -> Instrumented:
        tracer = self.meta.get("tracer")
        if agent != tracer and agent != (self.recon.get("agent") or {}).get("agent", agent):
            raise InputError(f"{self.path}: a {tracer} capture, not {agent}'s")
        hello = dict(self.recon.get("agent") or {})
        config_for(hello.get("platform"))
        init = {"recon": self.recon.get("symbols") or [], "info": self.recon.get("info") or {},
                "process": self.recon.get("process") or {}}
        return Instrumented(hello=hello, init=init, platform=hello.get("platform"), unwind=self.recon.get("unwind"))

    def calibrate(self, timeout: float | None = None) -> dict[str, Any]:
        phase = "after" if self._calibrated else "before"
        self._calibrated = True
        return dict(self.calibrations.get(phase) or {})

    def start(self, calibrate: bool = False) -> dict[str, Any]:
        return {}

    def release_fork(self, entry: str, pid: int) -> None:
        raise MemtraceError("a replay follows no children")

    def resume(self) -> None:
        pass

    def alive(self) -> bool:
        return not self._ended

    def next_event(self, timeout: float) -> SourceEvent | None:
        if self._next < len(self._sent):
            self._next += 1
            return self._sent[self._next - 1]
        if not self._ended:
            self._ended = True          # the records ran out: the "process" ends
            return Ended("process-terminated")
        return None

    def modules_seen(self, loaded: bool, feed_unwind: bool) -> list[Notice]:
        return []

    def symbolize(self, addresses: list[int]) -> list[list[Any]] | None:
        return None             # the host's symbolizer (or raw addresses) as for any backend without one

    def scan_leaks(self, config: dict[str, Any], timeout: float) -> None:
        pass                    # the capture's own scan result, if any, is replayed as a record

    def stop(self, timeout: float) -> dict[str, Any] | None:
        return None

    def ack(self) -> None:
        pass

    def detach(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def exit_status(self, timeout: float) -> dict[str, Any] | None:
        status = self.evidence.get("exit_status")
        return dict(status) if isinstance(status, dict) else None

    def child_source(self, pid: int, held: Path | None = None) -> RecordSource:
        raise MemtraceError("a replay follows no children")

    def close(self) -> None:
        pass


if TYPE_CHECKING:
    _IS_A_SOURCE: type[RecordSource] = ReplaySource     # mypy checks ReplaySource against the protocol
