"""The IOSurface line, offline: surfaces created, by stack and format, released or still held.

Pure: capture records in, an :class:`IOSurfaceSummary` out.  Surfaces are matched by their
IOSurface ID (a surface pointer where no ID was read), whichever path created them
(``IOSurfaceCreate``, or ``IOSurfaceClientCreateChild`` reached without it), each recorded once by
the agent from the outermost entry.  A surface is "held at end" when the capture saw it created and
never saw its last client reference go (the agent counts ``IOSurfaceClientLookup``/``Retain``/
``Release`` and reports a release only at zero: DEVICE-UNVERIFIED on iOS); without a release hook
"held" means "still referenced by the app as far as we saw".  Reference drops on surfaces created
before the window (their count unknown) are counted apart, as ``untracked``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import msgspec
from msgspec import Struct

from memtrace.analyze.context import CaptureContext, event_frames, fold_context, frames_json
from memtrace.capture import Event, Record, RecordType
from memtrace.frames import Frame
from memtrace.schema import UNSET, Count, Maybe


class Surface(Struct):
    id: int | None
    surface: str
    alloc_size: int
    width: int | None
    height: int | None
    bytes_per_row: int | None
    format: str | None
    name: str | None
    frames: tuple[int, ...]
    t: int | None = None
    via: str = "IOSurfaceCreate"
    parent_id: int | None = None        # a child surface's parent (IOSurfaceClientCreateChild)
    released: bool = False
    use_inc: int = 0
    use_dec: int = 0


class SurfaceGroup(Struct):
    """Surfaces created from one stack."""

    bytes: int
    count: int
    caller: str | None
    frames: list[Frame]

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "count": self.count, "caller": self.caller, "frames": frames_json(self.frames)}


Size = tuple[int | None, int | None, int | None, int]       # width, height, bytes per row, alloc size


class FormatGroup(Struct):
    """Surfaces of one pixel format, with the sizes they came in."""

    format: str
    count: int
    bytes: int
    sizes: list[Size]

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "count": self.count, "bytes": self.bytes, "sizes": self.sizes}


class SurfaceSet(Struct):
    count: int
    bytes: int
    ids: list[int]


LIST_ROWS = 1000      # per-surface rows in the JSON summary, each list (to_json)


def _ids(ids: list[int]) -> dict[str, Any]:
    if len(ids) <= LIST_ROWS:
        return {"ids": ids}
    return {"ids": ids[:LIST_ROWS], "ids_omitted": len(ids) - LIST_ROWS}


class IOSurfaceSummary(CaptureContext):
    tracer_name: ClassVar[str] = "iosurface"
    surfaces: list[Surface] = msgspec.field(default_factory=list)
    failed: int = 0
    releases_untracked: int = 0     # references dropped on surfaces created before the capture

    @property
    def release_visible(self) -> bool:
        return bool(self.info.get("release_hook")) and self.info["release_hook"] not in self.missing

    @property
    def total_bytes(self) -> int:
        return sum(s.alloc_size for s in self.surfaces)

    def by_creating_stack(self, top: int = 20) -> list[SurfaceGroup]:
        stacks = [SurfaceGroup(sum(x.alloc_size for x in group), len(group), self.caller(frames), frames)
                  for frames, group in self.by_stack((s.frames, s) for s in self.surfaces)]
        stacks.sort(key=lambda r: (-r.bytes, -r.count))
        return stacks[:top] if top else stacks

    def by_format(self) -> list[FormatGroup]:
        groups: dict[str, list[Surface]] = {}
        for s in self.surfaces:
            groups.setdefault(s.format or "?", []).append(s)
        formats = [FormatGroup(f, len(g), sum(x.alloc_size for x in g),
                               sorted({(x.width, x.height, x.bytes_per_row, x.alloc_size) for x in g},
                                      key=lambda size: tuple(-1 if v is None else v for v in size)))
                   for f, g in groups.items()]
        formats.sort(key=lambda r: -r.bytes)
        return formats

    def _set(self, released: bool) -> SurfaceSet:
        some = [s for s in self.surfaces if s.released == released]
        return SurfaceSet(len(some), sum(s.alloc_size for s in some), sorted(s.id for s in some if s.id is not None))

    @property
    def released(self) -> SurfaceSet:
        return self._set(True)

    @property
    def held_at_end(self) -> SurfaceSet:
        return self._set(False)

    @property
    def held_meaning(self) -> str:
        return ("created in the window and not seen destroyed" if self.release_visible else
                "still referenced by the app as far as we saw (no destruction entry is visible on this platform)")

    def to_json(self, capture: str | None = None, top: int = 20) -> dict[str, Any]:
        """The summary; its per-surface lists (ids, surface_list) hold at most LIST_ROWS rows each,
        the first by creation, and say how many more there were (``*_omitted``): a program creating
        surfaces in a loop made a 150 MB document of one --json run.  The capture keeps them all
        (``memtrace export``)."""
        released, held = self.released, self.held_at_end
        listed = self.surfaces[:LIST_ROWS]
        return {
            **self.header_json(self.tracer_name, capture),
            "surfaces": len(self.surfaces),
            "bytes": self.total_bytes,
            "by_stack": [g.to_json() for g in self.by_creating_stack(top)],
            "by_format": [f.to_json() for f in self.by_format()],
            "released": {"count": released.count, "bytes": released.bytes, **_ids(released.ids),
                         "visible": self.release_visible,
                         "untracked": self.releases_untracked},
            "held_at_end": {"count": held.count, "bytes": held.bytes, **_ids(held.ids),
                            "meaning": self.held_meaning},
            "created_via": _count(s.via for s in self.surfaces),
            "use_count_calls": {"increment": sum(s.use_inc for s in self.surfaces),
                                "decrement": sum(s.use_dec for s in self.surfaces)},
            "surface_list": [{"id": s.id, "alloc_size": s.alloc_size, "width": s.width, "height": s.height,
                              "bytes_per_row": s.bytes_per_row, "format": s.format, "name": s.name,
                              "parent_id": s.parent_id, "released": s.released} for s in listed],
            **({"surface_list_omitted": len(self.surfaces) - len(listed)} if len(listed) < len(self.surfaces) else {}),
            "failed_creates": self.failed,
            "missing": self.missing,
            **self.timing_json(),
        }


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


class _Live:
    """Surfaces not yet released, found by IOSurface ID or, for events without one (captures made
    before releases were seen at IOSurfaceClientRelease), by surface pointer."""

    def __init__(self) -> None:
        self.by_id: dict[int, Surface] = {}
        self.by_ptr: dict[str, Surface] = {}

    def add(self, surface: Surface) -> None:
        if surface.id is not None:
            self.by_id[surface.id] = surface
        self.by_ptr[surface.surface] = surface

    def get(self, ev: dict[str, Any]) -> Surface | None:
        if ev.get("id") is not None and ev["id"] in self.by_id:
            return self.by_id[ev["id"]]
        return self.by_ptr.get(ev.get("surface") or "?")

    def pop(self, ev: dict[str, Any]) -> Surface | None:
        found = self.get(ev)
        if found is not None:
            if found.id is not None:
                self.by_id.pop(found.id, None)
            if self.by_ptr.get(found.surface) is found:
                del self.by_ptr[found.surface]
        return found


def summarize(records: Iterable[Record]) -> IOSurfaceSummary:
    s = IOSurfaceSummary()
    live = _Live()
    for rec in records:
        t = rec.type
        if t == RecordType.EVENTS:
            for ev in rec.body.get("events", []):
                kind = ev.get("type")
                if kind == "surface":
                    surface = Surface(
                        id=ev.get("id"), surface=ev.get("surface") or ev.get("client") or "?",
                        alloc_size=int(ev.get("alloc_size") or 0),
                        width=ev.get("width"), height=ev.get("height"), bytes_per_row=ev.get("bytes_per_row"),
                        format=ev.get("format"), name=ev.get("name"), frames=event_frames(ev), t=ev.get("t"),
                        via=ev.get("via") or "IOSurfaceCreate", parent_id=ev.get("parent_id"))
                    s.surfaces.append(surface)
                    live.add(surface)
                elif kind == "release":
                    found = live.pop(ev)
                    if found is None:
                        s.releases_untracked += 1
                    else:
                        found.released = True
                elif kind == "release-unknown":
                    s.releases_untracked += 1
                elif kind == "use":
                    u = live.get(ev)
                    if u is not None:
                        if ev.get("op") == "inc":
                            u.use_inc += 1
                        else:
                            u.use_dec += 1
                elif kind == "create-failed":
                    s.failed += 1
        else:
            fold_context(s, rec)
    return s


# ---- the events the capture reader checks (registered by tracers/iosurface.py's TRACER.events) ---


class SurfaceEvent(Event):
    TYPE: ClassVar[str] = "surface"
    surface: str | None = None
    client: str | None = None
    via: str | None = None
    id: int | None = None
    alloc_size: Count | None = None
    width: Count | None = None
    height: Count | None = None
    bytes_per_row: Count | None = None
    pixel_format: int | None = None
    format: str | None = None
    name: str | None = None
    parent_id: int | None = None


class ReleaseEvent(Event):
    TYPE: ClassVar[str] = "release"
    surface: str | None = None
    via: str | None = None
    id: int | None = None


class ReleaseUnknownEvent(Event):
    TYPE: ClassVar[str] = "release-unknown"
    via: str | None = None
    id: int | None = None


class UseEvent(Event):
    TYPE: ClassVar[str] = "use"
    surface: Maybe[str] = UNSET
    op: Maybe[str] = UNSET
    id: int | None = None


class CreateFailedEvent(Event):
    TYPE: ClassVar[str] = "create-failed"
    via: str | None = None


EVENTS = (SurfaceEvent, ReleaseEvent, ReleaseUnknownEvent, UseEvent, CreateFailedEvent)
