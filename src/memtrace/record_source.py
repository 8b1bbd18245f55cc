"""The seam between the capture loop and a backend: a :class:`RecordSource`.

The loop (:mod:`memtrace.capture_loop`) owns the window, the deadlines, the death evidence and the
capture file; a record source owns whatever produces the records: a device, a process, an agent.
The loop drives it through the phases below and reads what it sends as typed events
(:data:`SourceEvent`); nothing backend-specific (Frida's C sources, its unwind tables, the
agent's symbolizer, the leak-scan RPC) crosses the seam.  Three backends:

* :class:`memtrace.frida_host.FridaHost`: Frida's local or USB device, the agent injected;
* :class:`memtrace.dvt.host.DvtHost`: a stock iPhone's Instruments services (no agent);
* :class:`memtrace.replay.ReplaySource`: an existing capture's records played back through the loop.

Phases, in order: ``open`` (the device), ``launch`` (spawn or find the process), ``attach``,
``instrument`` (load and initialize the agent), ``calibrate``, ``start``, ``resume``; then the
window (``next_event``, ``modules_seen``, ``symbolize``, ``ack``); then ``scan_leaks`` (a tracer's
window-end hook), ``stop``, ``calibrate``, ``detach``, ``kill``, ``exit_status``, ``close``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from memtrace.launchers import Launched


@dataclass(frozen=True)
class Records:
    """A message the backend sent: its JSON payload (``payload["type"]`` says what it is:
    ``events:batch``, ``modules:update``, ``agent:exit``, ``process:child`` ...) and the binary
    records that came with it (a batch's)."""

    payload: dict[str, Any]
    data: bytes = b""


@dataclass(frozen=True)
class AgentError:
    """The agent threw (a JavaScript exception outside any handler)."""

    description: str | None
    stack: str | None = None


@dataclass(frozen=True)
class Ended:
    """The source is gone: the process ended or was replaced, the session was closed (``reason``
    in Frida's words: process-terminated, process-replaced, application-requested ...), with the
    crash report when the backend had one (``summary``, ``report`` attributes)."""

    reason: str
    crash: Any = None


@dataclass(frozen=True)
class DeviceLost:
    """The device went away (unplugged, its server gone)."""


SourceEvent = Records | AgentError | Ended | DeviceLost


@dataclass(frozen=True)
class Notice:
    """Something the capture should say: a WARNING record's body and the line on screen."""

    record: dict[str, Any]
    screen: str


@dataclass
class Instrumented:
    """What ``instrument`` learned: the agent's ``hello`` and ``init`` answers, the target's
    platform, how stacks are unwound (None: frame pointers only) and what to warn about."""

    hello: dict[str, Any]
    init: dict[str, Any]
    platform: str | None = None
    unwind: dict[str, Any] | None = None
    notices: list[Notice] = field(default_factory=list)


# (the target's platform, or None before it is known) -> the agent's configuration
ConfigFor = Callable[[str | None], dict[str, Any]]


class RecordSource(Protocol):
    """What the capture loop needs from a backend (see the module docstring for the phases)."""

    @property
    def pid(self) -> int | None: ...
    @property
    def spawned(self) -> bool: ...          # memtrace started it (and so may kill it)
    @property
    def is_local(self) -> bool: ...         # its modules' files are readable on this machine
    @property
    def hold_info(self) -> dict[str, Any] | None: ...     # held before its constructors? (RECON)
    @property
    def versions(self) -> dict[str, str]: ...             # the backend's software, for META

    def open(self) -> dict[str, Any]: ...
    def launch(self, *, hold_constructors: bool, follow_children: bool) -> Launched: ...
    def held_images(self) -> Path | None: ...     # where followed images wait before constructors
    def attach(self) -> None: ...
    def instrument(self, agent: str, config_for: ConfigFor) -> Instrumented: ...
    def calibrate(self, timeout: float | None = None) -> dict[str, Any]: ...
    # calibrate: the "before" calibration taken first, returned as "calibration" -- by a source
    # whose start_calibrates is true (the loop asks calibrate() of the others).
    def start(self, calibrate: bool = False) -> dict[str, Any]: ...
    def release_fork(self, entry: str, pid: int) -> None: ...
    def resume(self) -> None: ...
    def alive(self) -> bool: ...
    def next_event(self, timeout: float) -> SourceEvent | None: ...
    def modules_seen(self, loaded: bool, feed_unwind: bool) -> list[Notice]: ...
    def symbolize(self, addresses: list[int]) -> list[list[Any]] | None: ...
    def scan_leaks(self, config: dict[str, Any], timeout: float) -> None: ...
    def stop(self, timeout: float) -> dict[str, Any] | None: ...      # how the hooks came out, if said
    def ack(self) -> None: ...
    def detach(self) -> None: ...
    def kill(self) -> None: ...
    def exit_status(self, timeout: float) -> dict[str, Any] | None: ...
    def child_source(self, pid: int, held: Path | None = None) -> RecordSource: ...
    def close(self) -> None: ...
