"""Folded stacks, one line per stack: ``root;caller;...;leaf BYTES`` (flamegraph.pl, inferno,
speedscope and most flame graph tools read it)."""

from __future__ import annotations

from typing import Any

from memtrace.frames import Frame
from memtrace.views.profile import profile


def frame_name(f: Frame, with_line: bool = False) -> str:
    # The format's separators (";" between frames, the last space before the value, newlines)
    # cannot appear inside a name.
    name = f.name()
    if with_line and f.location():
        name += f" {f.location()}"
    return name.replace(";", ":").replace("\n", " ").replace("\r", " ")


def lines(p: Any, with_line: bool = False) -> list[str]:
    out = []
    for s in p.samples:
        if s.bytes <= 0:
            continue
        out.append(";".join(frame_name(f, with_line) for f in reversed(s.frames)) + f" {s.bytes}")
    return out


def export(loaded: Any, view: str, with_line: bool = False) -> bytes:
    """``with_line``: each frame as ``function (module) file:line`` (one line of a function is then
    its own frame in the tools that read this)."""
    p = profile(loaded, view)
    if p.missing:
        from memtrace.errors import InputError

        raise InputError(f"{loaded.path}: {p.missing}")
    return ("\n".join(lines(p, with_line)) + "\n").encode()
