"""Terminal summaries of the Darwin lines (IOSurface, purgeable, probe), from their JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def purgeable_summary(console: Console, s: dict[str, Any]) -> None:
    console.print(s)


def iosurface_summary(console: Console, s: dict[str, Any]) -> None:
    console.print(s)
