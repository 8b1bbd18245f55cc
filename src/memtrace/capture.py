"""The capture file format: the only module that knows its bytes.

A capture is a 16-byte header followed by length-prefixed records, appended as
data arrives and flushed after every batch, so a reader can always get back
everything up to the last flush, whatever happened to the target or to memtrace.

    header  : b"MEMTRACE" | u16 format version | u16 flags (0) | u32 reserved
    record  : u8 type | u8 0 | u16 0 | u32 payload length | payload

Record payloads are UTF-8 JSON, except BATCH, whose payload is
``u32 json length | json | agent records`` -- the agent's binary records are
kept exactly as the agent produced them (layout named in memtrace/layout.py,
written by cmodule/core.c, decoded by :func:`decode_agent_records`), so a
capture can be re-interpreted later.

Agent records (little-endian, 8-byte aligned) inside a BATCH, grouped in
per-thread chunks ``u32 tid | u32 length | records``:

    STACK (1): u8 type | u8 nframes | u16 0 | u32 stack id | u64 frames[nframes]
    ALLOC (2): u8 type | u8 kind | u16 flags | u32 stack id | u64 ptr | u64 size | u64 weight
    FREE  (3): u8 type | u8 kind | u16 0 | u32 0 | u64 ptr | u64 size
    PAD   (0): u8 0 | u8 0 | u16 0 | u32 length    (skip ``length`` bytes)

and, from the aggregate core (tid 0 chunks; ALLOC and FREE then only with ``--events``):

    AGG       (4): u8 type | u8 nvalues | u16 0 | u32 stack id | u32 mask | u32 0 | u64 values[nvalues]
                   (the stack's running totals of the layout.AGG_FIELDS whose bit is set in mask)
    PEAK_HEAD (5): u8 type | u8 0 | u16 0 | u32 nstacks | u64 epoch | u64 bytes | u64 count | u64 t_us
    PEAK      (6): u8 type | u8 0 | u16 0 | u32 stack id | u64 bytes | u64 count   (nstacks of them)
    LIVE      (7): u8 type | u8 k | u16 0 | u32 stack id | u64 ptr | u64 size | u32 tick | u32 0
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any, BinaryIO

from memtrace import layout

MAGIC = b"MEMTRACE"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sHHI")
RECORD_HEADER = struct.Struct("<BBHI")
MAX_RECORD = 1 << 30
FILE_NAME = "capture.mtc"


class RecordType(IntEnum):
    META = 1          # who, what, where, options, start time
    RECON = 2         # hook symbols found / MISSING
    MODULES = 3       # loaded modules (name, path, base, size)
    BATCH = 4         # agent counters + binary records
    SYMBOLS = 5       # [address, module, offset, symbol, file, line] rows
    CALIBRATION = 6   # allocator statistics and footprint at a phase
    EVENTS = 7        # low-frequency tracers' JSON events
    WARNING = 8       # something the user should know
    SNAPSHOT = 9      # periodic counters/rates, for death evidence
    END = 10          # how the capture ended, with evidence
    RESULT = 11       # a tracer's computed result (probe truth table, census, ...)


# The agent's record layout and counters (memtrace/layout.py, shared with the agent's C and JS).
REC_PAD, REC_STACK, REC_ALLOC, REC_FREE = layout.REC_PAD, layout.REC_STACK, layout.REC_ALLOC, layout.REC_FREE
REC_AGG, REC_PEAK_HEAD, REC_PEAK, REC_LIVE = layout.REC_AGG, layout.REC_PEAK_HEAD, layout.REC_PEAK, layout.REC_LIVE
NESTED_STACK = layout.NESTED_STACK
AGG_FIELDS = layout.AGG_FIELDS
FLAG_LIVE, FLAG_SAMPLED, FLAG_TRUNCATED = layout.FLAG_LIVE, layout.FLAG_SAMPLED, layout.FLAG_TRUNCATED
NO_STACK = layout.NO_STACK
DROPPED_STACK = layout.DROPPED_STACK

KIND_NAMES = {number: name for name, number in layout.KINDS.items()}
TIER_MAX_BYTES = layout.TIER_MAX_BYTES

C_CALLS, C_BYTES, C_TIER_CALLS, C_TIER_BYTES = layout.C_CALLS, layout.C_BYTES, layout.C_TIER_CALLS, layout.C_TIER_BYTES
COUNTER_NAMES = {index: name for name, index in layout.COUNTERS.items()}

RELEASE_KINDS = layout.RELEASE_KINDS     # free, vm_deallocate: calls that give memory back


def alloc_totals(counters: list[int]) -> tuple[int, int]:
    """Allocation calls and gross bytes from the agent's counters (releases excluded)."""
    kinds = [k for k in KIND_NAMES if k not in RELEASE_KINDS]
    return sum(counters[C_CALLS + k] for k in kinds), sum(counters[C_BYTES + k] for k in kinds)


_CHUNK = struct.Struct(layout.CHUNK_HEADER.format)
_STACK_HEAD = struct.Struct(layout.STACK_RECORD.format)
_ALLOC = struct.Struct(layout.ALLOC_RECORD.format)
_FREE = struct.Struct(layout.FREE_RECORD.format)
_PAD = struct.Struct(layout.PAD_RECORD.format)
_AGG_HEAD = struct.Struct(layout.AGG_RECORD.format)
_PEAK_HEAD = struct.Struct(layout.PEAK_HEAD_RECORD.format)
_PEAK = struct.Struct(layout.PEAK_RECORD.format)
_LIVE = struct.Struct(layout.LIVE_RECORD.format)
_AGG_FIELD_NAMES = {i: name for name, i in layout.AGG_FIELDS.items()}


class CaptureError(Exception):
    """A capture that cannot be read; the message names the file and the problem."""


@dataclass(slots=True)
class StackRecord:
    tid: int
    stack_id: int
    frames: tuple[int, ...]


@dataclass(slots=True)
class AllocRecord:
    tid: int
    kind: int
    flags: int
    stack_id: int
    ptr: int
    size: int
    weight: int


@dataclass(slots=True)
class FreeRecord:
    tid: int
    kind: int
    ptr: int
    size: int


@dataclass(slots=True)
class AggRecord:
    """A stack's running totals (only the fields that changed since its last AGG record)."""

    stack_id: int
    values: dict[str, int]


@dataclass(slots=True)
class PeakHeadRecord:
    nstacks: int
    epoch: int
    bytes: int
    count: int
    t_us: int


@dataclass(slots=True)
class PeakRecord:
    stack_id: int
    bytes: int
    count: int


@dataclass(slots=True)
class LiveRecord:
    """A tracked block still live at the end of the window (the live table's entry)."""

    stack_id: int
    ptr: int
    size: int
    tick: int
    k: int


AgentRecord = StackRecord | AllocRecord | FreeRecord | AggRecord | PeakHeadRecord | PeakRecord | LiveRecord


@dataclass(slots=True)
class Record:
    type: RecordType
    body: Any                       # decoded JSON
    data: bytes = b""               # BATCH only: the agent's binary records


@dataclass
class CaptureInfo:
    """What a reader learned about the file itself, beyond its records."""

    path: Path
    version: int = 0
    records: int = 0
    truncated: bool = False
    truncation: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# ---- writing -----------------------------------------------------------------


class CaptureWriter:
    """Appends records and flushes each one to the OS, so a crash loses nothing written."""

    def __init__(self, path: Path | str, fsync_interval: float = 1.0) -> None:
        self.path = Path(path)
        self._file: BinaryIO = open(self.path, "xb")  # noqa: SIM115 -- closed in close()
        self._file.write(HEADER.pack(MAGIC, FORMAT_VERSION, 0, 0))
        self._file.flush()
        self.bytes_written = HEADER.size
        self._fsync_interval = fsync_interval
        self._last_sync = 0.0

    def write(self, rtype: RecordType, body: Any, data: bytes = b"") -> None:
        blob = json.dumps(body, separators=(",", ":"), default=_json_default).encode()
        payload = struct.pack("<I", len(blob)) + blob + data if rtype == RecordType.BATCH else blob
        self._file.write(RECORD_HEADER.pack(int(rtype), 0, 0, len(payload)))
        self._file.write(payload)
        self._file.flush()
        self.bytes_written += RECORD_HEADER.size + len(payload)

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def append_record(path: Path | str, rtype: RecordType, body: Any) -> None:
    """Add one record to a finished capture (e.g. a batch's verdict; the last END wins)."""
    p = resolve_capture_path(path)
    with open(p, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise CaptureError(f"{p}: not a memtrace capture (bad magic)")
    payload = json.dumps(body, separators=(",", ":"), default=_json_default).encode()
    with open(p, "ab") as f:
        f.write(RECORD_HEADER.pack(int(rtype), 0, 0, len(payload)) + payload)
        f.flush()
        os.fsync(f.fileno())


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


# ---- reading -----------------------------------------------------------------


def resolve_capture_path(path: Path | str) -> Path:
    """A capture file, or a capture folder holding ``capture.mtc``."""
    p = Path(path)
    if p.is_dir():
        p = p / FILE_NAME
    return p


def read_records(path: Path | str, info: CaptureInfo | None = None) -> Iterator[Record]:
    """Yield every complete record; a torn tail ends the iteration and is noted in ``info``."""
    p = resolve_capture_path(path)
    info = info if info is not None else CaptureInfo(p)
    info.path = p
    try:
        f = open(p, "rb")  # noqa: SIM115 -- closed below, generator-safe
    except FileNotFoundError:
        raise CaptureError(f"{p}: no such capture") from None
    except OSError as e:
        raise CaptureError(f"{p}: cannot open: {e.strerror}") from None
    with f:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size or head[:8] != MAGIC:
            raise CaptureError(f"{p}: not a memtrace capture (bad magic)")
        _, version, _, _ = HEADER.unpack(head)
        info.version = version
        if version > FORMAT_VERSION:
            raise CaptureError(
                f"{p}: capture format version {version} is newer than this memtrace reads "
                f"(up to {FORMAT_VERSION}); upgrade memtrace"
            )
        offset = HEADER.size
        while True:
            rh = f.read(RECORD_HEADER.size)
            if not rh:
                return
            if len(rh) < RECORD_HEADER.size:
                _torn(info, offset, "record header cut short")
                return
            rtype, _, _, length = RECORD_HEADER.unpack(rh)
            if length > MAX_RECORD:
                _torn(info, offset, f"implausible record length {length}")
                return
            payload = f.read(length)
            if len(payload) < length:
                _torn(info, offset, f"record cut short ({len(payload)} of {length} bytes)")
                return
            offset += RECORD_HEADER.size + length
            try:
                record = _decode(rtype, payload)
            except (ValueError, UnicodeDecodeError) as e:
                _torn(info, offset, f"undecodable record: {e}")
                return
            if record is None:          # a record type from a newer minor revision
                continue
            info.records += 1
            yield record


def _torn(info: CaptureInfo, offset: int, why: str) -> None:
    info.truncated = True
    info.truncation = f"truncated at byte {offset}: {why}"


def _decode(rtype: int, payload: bytes) -> Record | None:
    try:
        kind = RecordType(rtype)
    except ValueError:
        return None
    if kind == RecordType.BATCH:
        (n,) = struct.unpack_from("<I", payload)
        body = json.loads(payload[4:4 + n])
        return Record(kind, body, payload[4 + n:])
    return Record(kind, json.loads(payload))


def decode_agent_records(data: bytes) -> Iterator[AgentRecord]:
    """Decode one BATCH's binary records, in per-thread order, as typed records."""
    for tid, r in _iter_records(data, with_tid=True):
        rtype = r[0]
        if rtype == REC_ALLOC:
            yield AllocRecord(tid, *r[1:3], *r[3:])
        elif rtype == REC_FREE:
            yield FreeRecord(tid, r[1], r[4], r[5])
        elif rtype == REC_STACK:
            yield StackRecord(tid, r[3], r[4])
        elif rtype == REC_AGG:
            yield AggRecord(r[3], agg_values(r[4], r[6]))
        elif rtype == REC_PEAK_HEAD:
            yield PeakHeadRecord(*r[3:])
        elif rtype == REC_PEAK:
            yield PeakRecord(*r[3:])
        else:
            yield LiveRecord(r[3], r[4], r[5], r[6], r[1])


def agg_values(mask: int, values: tuple[int, ...]) -> dict[str, int]:
    """An AGG record's values by field name (layout.AGG_FIELDS)."""
    out: dict[str, int] = {}
    i = 0
    bit = 0
    while mask >> bit:
        if mask >> bit & 1:
            out[_AGG_FIELD_NAMES[bit]] = values[i]
            i += 1
        bit += 1
    return out


def iter_agent_tuples(data: bytes) -> Iterator[tuple[Any, ...]]:
    """The same records as plain tuples, straight from ``struct`` (for hot loops):

        (REC_ALLOC, kind, flags, stack_id, ptr, size, weight)
        (REC_FREE, kind, 0, 0, ptr, size)
        (REC_STACK, nframes, 0, stack_id, frames)
        (REC_AGG, nvalues, 0, stack_id, mask, 0, values)      values: u64 tuple in field order
        (REC_PEAK_HEAD, 0, 0, nstacks, epoch, bytes, count, t_us)
        (REC_PEAK, 0, 0, stack_id, bytes, count)
        (REC_LIVE, k, 0, stack_id, ptr, size, tick, 0)
    """
    return _iter_records(data, with_tid=False)


def _iter_records(data: bytes, with_tid: bool) -> Iterator[Any]:
    mv = memoryview(data)
    end = len(data)
    pos = 0
    alloc_from = _ALLOC.unpack_from
    free_from = _FREE.unpack_from
    rec_alloc, rec_free = REC_ALLOC, REC_FREE
    alloc_size, free_size, chunk_size = _ALLOC.size, _FREE.size, _CHUNK.size
    head_size = _STACK_HEAD.size       # every record starts with an 8-byte head (PAD's too)
    while pos + chunk_size <= end:
        tid, length = _CHUNK.unpack_from(mv, pos)
        pos += chunk_size
        stop = min(pos + length, end)
        while pos + head_size <= stop:
            rtype = mv[pos]
            if rtype == rec_alloc:
                r: tuple[Any, ...] = alloc_from(mv, pos)
                pos += alloc_size
            elif rtype == rec_free:
                r = free_from(mv, pos)
                pos += free_size
            elif rtype == REC_STACK:
                head = _STACK_HEAD.unpack_from(mv, pos)
                r = (*head, struct.unpack_from(f"<{head[1]}Q", mv, pos + head_size))
                pos += head_size + 8 * head[1]
            elif rtype == REC_PAD:
                skip = _PAD.unpack_from(mv, pos)[3]
                pos += max(skip, head_size)
                continue
            elif rtype == REC_AGG:
                head = _AGG_HEAD.unpack_from(mv, pos)
                r = (*head, struct.unpack_from(f"<{head[1]}Q", mv, pos + _AGG_HEAD.size))
                pos += _AGG_HEAD.size + 8 * head[1]
            elif rtype == REC_PEAK_HEAD:
                r = _PEAK_HEAD.unpack_from(mv, pos)
                pos += _PEAK_HEAD.size
            elif rtype == REC_PEAK:
                r = _PEAK.unpack_from(mv, pos)
                pos += _PEAK.size
            elif rtype == REC_LIVE:
                r = _LIVE.unpack_from(mv, pos)
                pos += _LIVE.size
            else:
                raise CaptureError(f"unknown agent record type {rtype} at offset {pos}")
            yield (tid, r) if with_tid else r
        pos = stop


def encode_agent_records(tid: int, records: list[AgentRecord]) -> bytes:
    """The inverse of :func:`decode_agent_records`, for tests and synthetic captures."""
    out = bytearray()
    for r in records:
        if isinstance(r, AllocRecord):
            out += _ALLOC.pack(REC_ALLOC, r.kind, r.flags, r.stack_id, r.ptr, r.size, r.weight)
        elif isinstance(r, FreeRecord):
            out += _FREE.pack(REC_FREE, r.kind, 0, 0, r.ptr, r.size)
        elif isinstance(r, AggRecord):
            fields = sorted((AGG_FIELDS[k], v) for k, v in r.values.items())
            mask = sum(1 << i for i, _ in fields)
            out += _AGG_HEAD.pack(REC_AGG, len(fields), 0, r.stack_id, mask, 0)
            out += struct.pack(f"<{len(fields)}Q", *(v for _, v in fields))
        elif isinstance(r, PeakHeadRecord):
            out += _PEAK_HEAD.pack(REC_PEAK_HEAD, 0, 0, r.nstacks, r.epoch, r.bytes, r.count, r.t_us)
        elif isinstance(r, PeakRecord):
            out += _PEAK.pack(REC_PEAK, 0, 0, r.stack_id, r.bytes, r.count)
        elif isinstance(r, LiveRecord):
            out += _LIVE.pack(REC_LIVE, r.k, 0, r.stack_id, r.ptr, r.size, r.tick, 0)
        else:
            out += _STACK_HEAD.pack(REC_STACK, len(r.frames), 0, r.stack_id)
            out += struct.pack(f"<{len(r.frames)}Q", *r.frames)
    return _CHUNK.pack(tid, len(out)) + bytes(out)


def record_to_json(record: Record) -> Iterator[dict[str, Any]]:
    """JSON-lines view of a record (BATCH expands to one line per agent record)."""
    name = record.type.name.lower()
    if record.type != RecordType.BATCH:
        yield {"record": name, **(record.body if isinstance(record.body, dict) else {"value": record.body})}
        return
    yield {"record": name, **record.body}
    for r in decode_agent_records(record.data):
        if isinstance(r, AllocRecord):
            yield {"record": "alloc", "tid": r.tid, "kind": KIND_NAMES.get(r.kind, r.kind), "flags": r.flags,
                   "stack": _sid(r.stack_id), "ptr": hex(r.ptr), "size": r.size, "weight": r.weight}
        elif isinstance(r, FreeRecord):
            yield {"record": "free", "tid": r.tid, "kind": KIND_NAMES.get(r.kind, r.kind),
                   "ptr": hex(r.ptr), "size": r.size}
        elif isinstance(r, AggRecord):
            yield {"record": "stack_totals", "stack": _sid(r.stack_id), **r.values}
        elif isinstance(r, PeakHeadRecord):
            yield {"record": "peak", "epoch": r.epoch, "bytes": r.bytes, "count": r.count, "stacks": r.nstacks,
                   "t_us": r.t_us}
        elif isinstance(r, PeakRecord):
            yield {"record": "peak_stack", "stack": _sid(r.stack_id), "bytes": r.bytes, "count": r.count}
        elif isinstance(r, LiveRecord):
            yield {"record": "live_block", "stack": _sid(r.stack_id), "ptr": hex(r.ptr), "size": r.size,
                   "tick": r.tick, "k": r.k}
        else:
            yield {"record": "stack", "tid": r.tid, "stack": r.stack_id, "frames": [hex(f) for f in r.frames]}


def _sid(stack_id: int) -> int | None | str:
    if stack_id == NO_STACK:
        return None
    if stack_id == DROPPED_STACK:
        return "dropped"
    if stack_id == NESTED_STACK:
        return "nested"
    return stack_id
