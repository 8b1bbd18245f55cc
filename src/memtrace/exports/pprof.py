"""pprof's profile.proto, gzipped (``go tool pprof``, the pprof web UI).

The messages are built at import from a descriptor written here field by field (the subset of
github.com/google/pprof/proto/profile.proto memtrace fills, same names and numbers), so no protoc
and no generated module: ``google.protobuf`` makes the classes from the descriptor.
"""

from __future__ import annotations

import gzip
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from memtrace.errors import InputError
from memtrace.exports.limits import clamp_int64
from memtrace.views.profile import profile

_F = descriptor_pb2.FieldDescriptorProto
_REPEATED, _OPTIONAL = _F.LABEL_REPEATED, _F.LABEL_OPTIONAL
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    # name: [(field, number, label, type, message type name)]
    "Profile": [("sample_type", 1, _REPEATED, _F.TYPE_MESSAGE, "ValueType"),
                ("sample", 2, _REPEATED, _F.TYPE_MESSAGE, "Sample"),
                ("mapping", 3, _REPEATED, _F.TYPE_MESSAGE, "Mapping"),
                ("location", 4, _REPEATED, _F.TYPE_MESSAGE, "Location"),
                ("function", 5, _REPEATED, _F.TYPE_MESSAGE, "Function"),
                ("string_table", 6, _REPEATED, _F.TYPE_STRING, ""),
                ("time_nanos", 9, _OPTIONAL, _F.TYPE_INT64, ""),
                ("duration_nanos", 10, _OPTIONAL, _F.TYPE_INT64, ""),
                ("period_type", 11, _OPTIONAL, _F.TYPE_MESSAGE, "ValueType"),
                ("period", 12, _OPTIONAL, _F.TYPE_INT64, ""),
                ("comment", 13, _REPEATED, _F.TYPE_INT64, ""),
                ("default_sample_type", 14, _OPTIONAL, _F.TYPE_INT64, "")],
    "ValueType": [("type", 1, _OPTIONAL, _F.TYPE_INT64, ""), ("unit", 2, _OPTIONAL, _F.TYPE_INT64, "")],
    "Sample": [("location_id", 1, _REPEATED, _F.TYPE_UINT64, ""), ("value", 2, _REPEATED, _F.TYPE_INT64, "")],
    "Mapping": [("id", 1, _OPTIONAL, _F.TYPE_UINT64, ""), ("memory_start", 2, _OPTIONAL, _F.TYPE_UINT64, ""),
                ("memory_limit", 3, _OPTIONAL, _F.TYPE_UINT64, ""), ("file_offset", 4, _OPTIONAL, _F.TYPE_UINT64, ""),
                ("filename", 5, _OPTIONAL, _F.TYPE_INT64, ""), ("build_id", 6, _OPTIONAL, _F.TYPE_INT64, ""),
                ("has_functions", 7, _OPTIONAL, _F.TYPE_BOOL, "")],
    "Location": [("id", 1, _OPTIONAL, _F.TYPE_UINT64, ""), ("mapping_id", 2, _OPTIONAL, _F.TYPE_UINT64, ""),
                 ("address", 3, _OPTIONAL, _F.TYPE_UINT64, ""), ("line", 4, _REPEATED, _F.TYPE_MESSAGE, "Line")],
    "Line": [("function_id", 1, _OPTIONAL, _F.TYPE_UINT64, ""), ("line", 2, _OPTIONAL, _F.TYPE_INT64, "")],
    "Function": [("id", 1, _OPTIONAL, _F.TYPE_UINT64, ""), ("name", 2, _OPTIONAL, _F.TYPE_INT64, ""),
                 ("system_name", 3, _OPTIONAL, _F.TYPE_INT64, ""), ("filename", 4, _OPTIONAL, _F.TYPE_INT64, ""),
                 ("start_line", 5, _OPTIONAL, _F.TYPE_INT64, "")],
}
PACKAGE = "perftools.profiles"


def _classes() -> dict[str, Any]:
    fd = descriptor_pb2.FileDescriptorProto(name="memtrace_pprof_profile.proto", package=PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES.items():
        m = fd.message_type.add(name=name)
        for fname, number, label, ftype, tname in fields:
            f = m.field.add(name=fname, number=number, label=label, type=ftype)
            if tname:
                f.type_name = f".{PACKAGE}.{tname}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
            for name in _MESSAGES}


_CLASSES = _classes()
Profile = _CLASSES["Profile"]

# go tool pprof's own names for a heap profile's sample types.
SAMPLE_TYPES = {"gross": ("alloc_space", "alloc_objects"), "live": ("inuse_space", "inuse_objects"),
                "leaked": ("leaked_space", "leaked_objects"), "peak": ("peak_space", "peak_objects"),
                "temporary": ("temporary_space", "temporary_objects")}


# A Go heap profile's four sample types, in Go's order: one malloc profile carries them all
# (go tool pprof -sample_index=alloc_space|inuse_space|... picks one).
HEAP_TYPES = (("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"),
              ("inuse_space", "bytes"))


U64_MAX = (1 << 64) - 1


class _Builder:
    """A Profile message and its tables: strings, mappings (the target's modules), functions and
    locations, each written once."""

    def __init__(self, loaded: Any) -> None:
        self.loaded = loaded
        self.out = Profile()
        self.strings: dict[str, int] = {"": 0}
        self.out.string_table.append("")
        self.functions: dict[tuple[str, str], int] = {}
        self.locations: dict[tuple[Any, ...], int] = {}
        self.mappings: dict[str, int] = {}
        symbols = getattr(loaded.summary, "symbols", None)
        for m in getattr(symbols, "modules", None) or ():
            if m.name in self.mappings:
                continue
            mid = self.mappings[m.name] = len(self.mappings) + 1
            # uint64 fields: a crafted module past the address space ends at its top.
            self.out.mapping.add(id=mid, memory_start=min(m.base, U64_MAX), memory_limit=min(m.base + m.size, U64_MAX),
                                 filename=self.sid(m.path or m.name), has_functions=True)

    def sid(self, text: str) -> int:
        i = self.strings.get(text)
        if i is None:
            i = self.strings[text] = len(self.out.string_table)
            self.out.string_table.append(text)
        return i

    def location(self, f: Any) -> int:
        key = f.key()
        loc = self.locations.get(key)
        if loc is None:
            fkey = (f.name(), f.file or "")
            fid = self.functions.get(fkey)
            if fid is None:
                fid = self.functions[fkey] = len(self.functions) + 1
                self.out.function.add(id=fid, name=self.sid(f.name()), system_name=self.sid(f.function or f.name()),
                                      filename=self.sid(f.file or ""))
            loc = self.locations[key] = len(self.locations) + 1
            location = self.out.location.add(id=loc, address=f.address, mapping_id=self.mappings.get(f.module or "", 0))
            location.line.add(function_id=fid, line=clamp_int64(f.line or 0, "pprof: a line number", self.loaded))
        return loc


def build(loaded: Any, view: str) -> Any:
    if view in loaded.tracer.heap_views:
        return build_heap(loaded, view)
    p = profile(loaded, view)
    if p.missing:
        raise InputError(f"{loaded.path}: {p.missing}")
    b = _Builder(loaded)
    out = b.out
    space, objects = SAMPLE_TYPES[view]
    out.sample_type.add(type=b.sid(space), unit=b.sid("bytes"))
    out.sample_type.add(type=b.sid(objects), unit=b.sid("count"))
    out.default_sample_type = b.sid(space)
    for s in p.samples:
        out.sample.add(location_id=[b.location(f) for f in s.frames],   # leaf first
                       value=[clamp_int64(s.bytes, "pprof: a sample's bytes", loaded),
                              clamp_int64(s.count, "pprof: a sample's count", loaded)])
    out.comment.append(b.sid(f"memtrace {loaded.tracer.name} {view}: {loaded.path}"))
    return out


def build_heap(loaded: Any, view: str) -> Any:
    """A capture as Go's heap profiles are (malloc's gross and live views): each stack with its allocations (alloc_objects,
    alloc_space: every allocation in the window) and what it still held at the end (inuse_objects,
    inuse_space: tracked live blocks); ``view`` picks the default sample type."""
    from memtrace.frames import stack_key

    b = _Builder(loaded)
    out = b.out
    for name, unit in HEAP_TYPES:
        out.sample_type.add(type=b.sid(name), unit=b.sid(unit))
    out.default_sample_type = b.sid("alloc_space" if view == "gross" else "inuse_space")
    out.period_type.type, out.period_type.unit = b.sid("space"), b.sid("bytes")
    sample_bytes = ((loaded.summary.meta.get("options") or {}).get("agent") or {}).get("sampleBytes")
    out.period = int(sample_bytes) if isinstance(sample_bytes, int) and sample_bytes > 0 else 1
    rows: dict[Any, list[Any]] = {}
    for col, v in ((0, "gross"), (2, "live")):
        for s in profile(loaded, v).samples:
            row = rows.setdefault(stack_key(s.frames), [s.frames, 0, 0, 0, 0])
            row[1 + col] += s.count
            row[2 + col] += s.bytes
    for frames, *values in rows.values():
        out.sample.add(location_id=[b.location(f) for f in frames],
                       value=[clamp_int64(v, f"pprof: a sample's {name}", loaded)
                              for v, (name, _) in zip(values, HEAP_TYPES, strict=True)])
    out.comment.append(b.sid(f"memtrace {loaded.tracer.name} heap (default {view}): {loaded.path}"))
    return out


def export(loaded: Any, view: str) -> bytes:
    return gzip.compress(build(loaded, view).SerializeToString(), mtime=0)
