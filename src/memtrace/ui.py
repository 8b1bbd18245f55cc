"""Where the session engine reports: a rich live panel, or silence for scripts and tests."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from memtrace.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import Console, Group

# rich is imported by RichUI, not with this module: --quiet and --json runs (SilentUI) start
# without it (issue 21: fixed cost).


@dataclass
class Progress:
    """One tick of the live view: time, the rates every tracer has, and the tracer's own rows."""

    elapsed: float
    window: float
    activity_per_s: float
    bytes_per_s: float
    dropped: int
    rows: list[tuple[str, str]] = field(default_factory=list)     # the tracer's own statistics
    batches: int = 0
    families: list[tuple[str, int]] = field(default_factory=list)


# What each phase of a capture is waiting for, as the live panel says it (a first capture can sit
# several seconds in "loading agent" while the target compiles the C core).
PHASES = {
    "starting": "starting…",
    "launching": "launching the target…",
    "waiting": "waiting for the target… (the attach delay)",
    "attaching": "attaching to the target…",
    "loading agent": "building the agent… (loading it and compiling its C core in the target)",
    "capturing": "capturing",
    "flushing": "flushing the last batches and symbols…",
}


def phase_text(name: str) -> str:
    return PHASES.get(name, name)


class UI(Protocol):
    def phase(self, name: str) -> None: ...
    def progress(self, p: Progress) -> None: ...
    def warning(self, message: str) -> None: ...
    def output(self, fd: int, data: bytes) -> None: ...


class SilentUI:
    """Tests and --quiet: target output still passes through, nothing else is shown."""

    def __init__(self, passthrough: bool = True, stdout_to_stderr: bool = False) -> None:
        self.passthrough = passthrough
        self.stdout_to_stderr = stdout_to_stderr
        self.phases: list[str] = []
        self.warnings: list[str] = []

    def phase(self, name: str) -> None:
        self.phases.append(name)

    def progress(self, p: Progress) -> None:
        pass

    def warning(self, message: str) -> None:
        self.warnings.append(message)

    def output(self, fd: int, data: bytes) -> None:
        if not self.passthrough:
            return
        stream = sys.stderr if fd == 2 or self.stdout_to_stderr else sys.stdout
        stream.buffer.write(data)
        stream.flush()


class RichUI(SilentUI):
    """The live panel on a terminal (stderr): phase, elapsed vs window, rates, drops, families."""

    @property
    def wants_families(self) -> bool:
        """The panel's stack labels and families, worth their host CPU only where the panel is shown:
        on a terminal.  (Piped stderr -- scripts, CI, make bench-real -- shows no panel; there the
        capture loop also leaves naming a local target's stacks until the target is done.)"""
        return bool(self.console.is_terminal)

    def __init__(self, console: Console | None = None, stdout_to_stderr: bool = False) -> None:
        from rich.console import Console
        from rich.live import Live

        super().__init__(passthrough=True, stdout_to_stderr=stdout_to_stderr)
        self.console = console or Console(stderr=True)
        self._phase = "starting"
        self._phase_at = time.monotonic()
        self._last: Progress | None = None
        # get_renderable: redrawn at every refresh, so a phase's waiting time counts up between events.
        self._live = Live(console=self.console, refresh_per_second=4, transient=True, get_renderable=self._render)
        self._started = False

    def _ensure(self) -> None:
        if not self._started and self.console.is_terminal:
            self._live.start()
            self._started = True

    def phase(self, name: str) -> None:
        super().phase(name)
        self._phase = name
        self._phase_at = time.monotonic()
        if name == "done":
            self.close()
            return
        self._ensure()      # the panel lives on a terminal only: piped stderr keeps errors to one line
        self._refresh()

    def progress(self, p: Progress) -> None:
        self._last = p
        self._ensure()
        self._refresh()

    def warning(self, message: str) -> None:
        from rich.text import Text

        from memtrace.reporters.console import plain

        super().warning(message)
        # Agent warnings carry target data (paths, symbol names): inert text, never markup.
        self.console.print(Text.assemble(("warning: ", "yellow"), plain(message)))

    def output(self, fd: int, data: bytes) -> None:
        # Under the live panel the target's lines are shown as inert text (an escape sequence in
        # them would clear the panel); without it they pass through as the program wrote them,
        # as when it runs on its own.
        if self._started:
            from memtrace.reporters.console import plain

            for text_line in data.decode(errors="replace").rstrip("\n").split("\n"):
                self._live.console.print(plain(text_line), highlight=False)
        else:
            super().output(fd, data)

    def close(self) -> None:
        if self._started:
            self._live.stop()
            self._started = False

    def _refresh(self) -> None:
        if self._started:
            self._live.update(self._render())

    def _render(self) -> Group:
        from rich.console import Group, RenderableType
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        from memtrace.reporters.console import plain

        p = self._last
        waited = time.monotonic() - self._phase_at
        head = Text.assemble(("memtrace ", "bold"), (phase_text(self._phase), "cyan"),
                             ("" if self._phase == "capturing" or waited < 1 else f" {waited:.0f} s", "dim"))
        if p is None:
            return Group(head)
        bounded = p.window != float("inf")     # a program without --window runs to its end
        bar = ProgressBar(total=p.window if bounded else None, completed=min(p.elapsed, p.window), width=40)
        t = Table.grid(padding=(0, 2))
        t.add_row("elapsed", f"{p.elapsed:5.1f} / {p.window:g} s" if bounded else
                  f"{p.elapsed:5.1f} s (until the target ends)")
        t.add_row("rate", f"{p.activity_per_s:,.0f} calls/s" + (f", {fmt_bytes(p.bytes_per_s)}/s"
                                                                    if p.bytes_per_s else ""))
        for label, value in p.rows:
            t.add_row(label, plain(value))
        t.add_row("dropped", Text(f"{p.dropped:,}", style="red" if p.dropped else ""))
        rows: list[RenderableType] = [head, bar, t]
        if p.families:
            ft = Table(title="top stack families so far", box=None, show_header=False)
            for name, nbytes in p.families[:5]:
                ft.add_row(plain(name), fmt_bytes(nbytes))
            rows.append(ft)
        return Group(*rows)
