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


def build(loaded: Any, view: str) -> Any:
    p = profile(loaded, view)
    if p.missing:
        raise InputError(f"{loaded.path}: {p.missing}")
    out = Profile()
    strings: dict[str, int] = {"": 0}
    out.string_table.append("")

    def sid(text: str) -> int:
        i = strings.get(text)
        if i is None:
            i = strings[text] = len(out.string_table)
            out.string_table.append(text)
        return i

    space, objects = SAMPLE_TYPES[view]
    out.sample_type.add(type=sid(space), unit=sid("bytes"))
    out.sample_type.add(type=sid(objects), unit=sid("count"))
    out.default_sample_type = sid(space)
    functions: dict[tuple[str, str], int] = {}
    locations: dict[tuple[Any, ...], int] = {}
    for s in p.samples:
        ids = []
        for f in s.frames:                        # pprof: leaf first, as memtrace keeps them
            key = f.key()
            loc = locations.get(key)
            if loc is None:
                fkey = (f.name(), f.file or "")
                fid = functions.get(fkey)
                if fid is None:
                    fid = functions[fkey] = len(functions) + 1
                    out.function.add(id=fid, name=sid(f.name()), system_name=sid(f.function or f.name()),
                                     filename=sid(f.file or ""))
                loc = locations[key] = len(locations) + 1
                location = out.location.add(id=loc, address=f.address)
                location.line.add(function_id=fid, line=clamp_int64(f.line or 0, "pprof: a line number", loaded))
            ids.append(loc)
        out.sample.add(location_id=ids, value=[clamp_int64(s.bytes, "pprof: a sample's bytes", loaded),
                                               clamp_int64(s.count, "pprof: a sample's count", loaded)])
    out.comment.append(sid(f"memtrace {loaded.tracer.name} {view}: {loaded.path}"))
    return out


def export(loaded: Any, view: str) -> bytes:
    return gzip.compress(build(loaded, view).SerializeToString(), mtime=0)
