"""What every tracer's terminal summary shares: its header and footer, frames, and safe text.

Everything that comes from a target or a file (function names, paths, process names) reaches the
terminal as :class:`rich.text.Text`, never as markup: a function called ``lone[/]`` must print
as itself, not crash rich or restyle the screen, and control characters are shown, not obeyed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Protocol

from rich.console import Console
from rich.table import Table
from rich.text import Text

from memtrace.frames import Frame

ENDED_STYLE = {"completed": "green", "target-exited": "green", "interrupted": "yellow"}
FRAMES_SHOWN = 8
_CONTROL = {c: f"\\x{c:02x}" for c in range(32) if c not in (9, 10)} | {127: "\\x7f"}


def plain(value: Any, style: str = "") -> Text:
    """Target or file data as inert text: no markup, control characters made visible."""
    return Text(inert(value), style=style)


def inert(value: Any) -> str:
    """The same for a plain string (click.echo, an error line): control characters made visible."""
    return str(value).translate(_CONTROL)


def cells(values: Iterable[Any]) -> list[Text]:
    """Table cells for ``Table.add_row``: a plain ``str`` there would be read as rich markup."""
    return [v if isinstance(v, Text) else plain("" if v is None else v) for v in values]


def frames_text(frames: Iterable[Frame | dict[str, Any]], shown: int = FRAMES_SHOWN) -> Text:
    """A stack, one frame per line: ``function (module) file:line``."""
    items = [f if isinstance(f, Frame) else Frame.from_json(f) for f in frames]
    lines = [f.label() for f in items[:shown]]
    if len(items) > shown:
        lines.append(f"… (+{len(items) - shown})")
    return plain("\n".join(lines) or "—")


class Captured(Protocol):
    """What a summary says about its capture (``analyze.context.CaptureContext`` has it all)."""

    tracer_name: ClassVar[str]
    missing: list[str]

    @property
    def target_label(self) -> str | None: ...
    @property
    def ended(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def recorded_by(self) -> str | None: ...


def header(console: Console, summary: Captured) -> None:
    """What every tracer's summary opens with: the rule and how the capture ended."""
    console.rule(plain(f"memtrace {summary.tracer_name} · {summary.target_label or ''}"))
    style = ENDED_STYLE.get(summary.ended, "red")
    console.print(Text.assemble(("ended: ", "bold"), (summary.ended, style), " — ", plain(summary.reason)))
    if summary.recorded_by:
        # Not memtrace's own agent (a stock device's Instruments service): what that recording covers.
        console.print(Text.assemble(("recorded by: ", "bold"), plain(summary.recorded_by)))


def footer(console: Console, summary: Captured, capture: Any) -> None:
    """...and closes with: the hook symbols the target lacked, and where the capture is."""
    if summary.missing:
        console.print(Text.assemble(("MISSING hook symbols: ", "yellow"), plain(", ".join(summary.missing))))
    console.print(Text.assemble(("capture: ", "bold"), plain(capture)))


def line(console: Console, *parts: tuple[str, Any]) -> None:
    """``label: value  label: value`` with bold labels and inert values."""
    text = Text()
    for i, (label, value) in enumerate(parts):
        if i:
            text.append("  ")
        text.append(f"{label}: ", style="bold")
        text.append_text(value if isinstance(value, Text) else plain(value))
    console.print(text)


def stack_table(title: str, columns: list[tuple[str, str]], rows: list[list[Any]]) -> Table:
    """A table whose cells are inert text; ``columns`` are (name, justify)."""
    t = Table(title=plain(title), show_edge=False, show_lines=True)
    for name, justify in columns:
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        t.add_row(*(c if isinstance(c, Text) else plain(c) for c in r))
    return t
