"""The capture file format: the only module that knows its bytes.

A capture is a 16-byte header followed by checksummed, length-prefixed records, appended as data
arrives and handed to the OS after every record, so a reader can always get back everything up
to the last write, whatever happened to the target or to memtrace.

    header : b"MEMTRACE" | u16 format version (8) | u16 flags (0) | u32 crc32 of the 12 bytes before
    record : u8 type | u8 0 | u16 head check | u32 payload length | u32 crc32 of the 8 bytes before
             + payload | payload

The head check (the low 16 bits of crc32(type, 0, length)) lets a reader tell a damaged length
from a record cut short by a crash; the crc32 covers everything else.  Version 1 (memtrace 0.1)
had no checksums: its header ends in u32 0 and its record header is ``u8 type | u8 0 | u16 0 |
u32 length``.  Both are read; a later version keeps the header (and its checksum), so a reader
tells a newer capture from a damaged one.

Record payloads are UTF-8 JSON, except BATCH, whose payload is ``u32 json length | json | agent
records`` -- the agent's binary records are kept exactly as the agent produced them (layout named
in memtrace/layout.py, written by cmodule/core.c, decoded by :func:`decode_agent_records`), so a
capture can be re-interpreted later.  From version 3 the agent records of a BATCH may be stored
zlib-compressed, said by bit 31 of its json length (a complete capture's stacks of 64 return
addresses compress ~10x: cc1plus's capture went from 21 MB to about heaptrack's size); version 2
is version 3 without compression.  Version 4 compresses with zstd instead: bit 30 of the json
length says that what follows is one zstd frame of the JSON and the agent records (a small
batch's counters are most of it; zstd is smaller than zlib and several times faster to write and
read: cc1plus's agent records 1.42 MB with zlib, 1.28 MB with zstd), and a large JSON record (SYMBOLS: a third of a complete
capture) may be a zstd frame of its JSON -- told by the frame's magic number, which no JSON text
starts with.  Version 5 adds the GROUP record (type 12): one zstd frame of several BATCH,
SNAPSHOT and EVENTS records, each ``u8 type | u8 0 | u16 0 | u32 length | payload`` with its
uncompressed version-4 payload.  The writer groups what comes in up to GROUP_S seconds (the
agent's drains come ten a second: a quiet drain is ~600 bytes compressed alone, a third of that
beside its neighbours, which repeat its JSON keys, counters and stacks); SYMBOLS and MODULES rows,
which name addresses, are written at once, ahead of a group held; any other record after it.
bench_real's sqlite3 run, ~120 drains on a loaded machine: 98.8 KB with every drain alone, 61.6 KB
with 1 s of drains grouped between other records (heaptrack's file 63.0 KB); sizes for GROUP_S
and the level: bench/README.md, "capture_size_bench.py".  Version 6 groups SYMBOLS records too
(the symbol rounds of a run, a fifth of a short run's capture, are a few rows each after the
first: alone, each paid its own frame and learnt nothing from the others) and compresses small
frames harder (ZSTD_SMALL_LEVEL: a run's JSON records, its first drain, a quiet group); a
version-5 group holds no SYMBOLS.  A flipped byte still
costs one record: a group, about GROUP_S of drains (the counters are running totals the next
drain restores; a stack's AGG values, when that stack next changes); the first drain, the stack
definitions, is never held.  What the writer holds is written before any other record but those,
at END and at close -- only memtrace itself killed (SIGKILL) loses it.  A version-6 reader reads
versions 1 to 5 as they were written.  Version 7 stores a group of COLUMNS_FROM records or more
column by column: its first sub-record ``u8 0 | u8 0 | u16 0 | u32 length`` holds the records'
JSON bodies as one JSON table (:func:`_columns`: a column per record type and key path, integers
and lists of integers as differences from the record before), and each record after it has
SUB_COLUMNS in its flag byte and no JSON (a BATCH: its agent records alone) -- a drain's counters,
clocks and totals change by little from one drain to the next, and their differences side by side
compress to a few bytes where the numbers take tens.  Its frames are made with another shipped
dictionary, trained on the records as they are now (bench/capture_dictionary.py); a reader keeps
every shipped dictionary and picks the one a frame names.  A group is still one frame with one
checksum, written when it closes: durability and damage are version 6's (a flipped byte costs
that group).  The C++ program's capture, the same records re-encoded: 8,343 -> 6,941 bytes;
sqlite3's 61,031 -> 58,431 (bench/README.md, "capture_size_bench.py").  (Version 7 of the
rejected one-stream design, on a branch never merged, wrote no capture anyone kept.)  Version 8
is for short runs, whose capture is mostly records a run writes once, each a frame of its own
(~25 bytes of framing, and nothing learnt from the others): the writer holds the run's opening
records (OPENING: META, RECON, CALIBRATION, MODULES, a WARNING, and the SNAPSHOT and EVENTS
before the first drain) and writes them as one group when the first drain comes (the drain
itself still at once: its stack definitions), when GROUP_S has passed, or at END; the first
SYMBOLS round, which comes after the first drain, is grouped with the drains after it (the next
rounds name the same images); a column may name an earlier column of the table instead of
holding values (:func:`_columns`: "=" the same values of the same rows, a drain's ``live`` and
``tracked.blocks``; "<" each value that column's in the latest record before, a SNAPSHOT's
counters and totals its drain's); and frames are made with a third dictionary, capture-v8.zdict,
whose id, 8, a frame names in one byte (the others' random ids take four), built from the records
a run writes once and the shared libraries' symbol rows (bench/capture_dictionary.py).  A
flipped byte still costs its record: the opening group (the run's META with it), or a group.
The C++ program's 0.3 s run: 4,355 -> ~2,800 bytes, heaptrack's ~3,000 (bench/README.md).  A
version-8 reader reads versions 1 to 7 as they were written; a group framed again (a SYMBOLS
round replaced: :func:`replace_records`) keeps its capture's version.

Agent records (little-endian, 8-byte aligned) inside a BATCH, grouped in per-thread chunks
``u32 tid | u32 length | records``:

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

Reading checks every record -- its checksum, its JSON, its shape and the values it may hold
(:data:`RECORD_SCHEMAS`), a BATCH's agent records' framing and values as they are decoded (sizes,
totals, AGG masks against the fields and values, a PEAK_HEAD's count against the PEAK records
after it, stack ids against the STACK records that define them).  A record that fails is skipped
and named in :class:`CaptureInfo` (its byte, its type, what was wrong) and the next one is read;
a damaged header is skipped to the next record whose checks hold; only a torn tail ends reading.
Analyzers only ever see well-formed records, and a damaged capture is reported as damaged, never
turned into numbers.
"""

from __future__ import annotations

import contextlib
import errno as errno_names
import functools
import importlib
import itertools
import json
import math
import mmap
import operator
import os
import re
import shutil
import stat
import struct
import tempfile
import time
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any, BinaryIO, ClassVar, Union

import msgspec
from msgspec import Meta

from memtrace import layout
from memtrace.errors import MemtraceError
from memtrace.schema import UNSET, Addr, Amount, Count, Line, Maybe, Num, Row, Shape, Time, problem


def _zstd_module() -> Any:
    """compression.zstd (Python >= 3.14), else its backport (a dependency before 3.14), else None
    (then captures are written with zlib, and zstd records read as damaged, saying why)."""
    for name in ("compression.zstd", "backports.zstd"):
        with contextlib.suppress(ImportError):
            return importlib.import_module(name)
    return None


_zstd: Any = _zstd_module()
MAGIC = b"MEMTRACE"
FORMAT_VERSION = 8
BATCH_ZLIB = 0x80000000        # in a BATCH's json length (version >= 3): its agent records are zlib data
BATCH_ZSTD = 0x40000000        # in a BATCH's json length (version >= 4): its JSON and agent records are a zstd frame
GROUP_S = 2.0                  # the writer groups the records of at most this long (drains: ten a second)
GROUP_MAX = 1 << 20            # ... and of at most this many bytes (a larger one is a record of its own)
# A group of a quiet stretch (sqlite3's: ~40 KB of drains in 2 s) is compressed harder, ~7 ms a
# group for 10 % less; a busy one (cc1plus's new stacks) at ZSTD_LEVEL, so the host keeps up.
ZSTD_GROUP_LEVEL = 15
ZSTD_GROUP_LEVEL_UP_TO = 256 << 10
# (version >= 6) A quiet group this small, and a record alone (a JSON record, a run's first
# drain: a few a run) up to RECORD_SMALL_UP_TO, is compressed at ZSTD_SMALL_LEVEL: ~35 ms for
# 64 KB here, ~90 ms for 256 KB; sqlite3's capture 5 % smaller than at the levels above.
ZSTD_SMALL_LEVEL = 19
ZSTD_SMALL_UP_TO = 64 << 10
RECORD_SMALL_UP_TO = 256 << 10
DIGESTED_UP_TO = 256 << 10     # (_compress) a frame this small is made with the dictionary digested once
BATCH_ZLIB_MIN = 512           # smaller agent data is stored as it is
# (version >= 4) a JSON payload this large is stored as a zstd frame when that is smaller: SYMBOLS
# rounds and SNAPSHOTs of a few hundred bytes each are much of a short run's capture (sqlite3's:
# 72 KB with 4096 here, 60 KB so)
JSON_ZSTD_MIN = 128
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_LEVEL = 6                 # cc1plus's agent records: 1.28 MB in 0.40 s (zlib level 6: 1.42 MB, 0.72 s)
# A drain this large (--events on a busy target: 4 MiB every 100 ms) is compressed at level 3
# (cc1plus: 1.56 MB in 0.12 s): the host must keep up with the stream.
ZSTD_FAST_FROM = 1 << 20
ZSTD_FAST_LEVEL = 3
# MEMTRACE_CAPTURE_ZLIB=off writes the agent records uncompressed (raw bytes to look at; tests that
# need a capture to grow as fast as the records come).
BATCH_ZLIB_ON = os.environ.get("MEMTRACE_CAPTURE_ZLIB", "on") != "off"
BATCH_ZLIB_LEVEL = 6
BATCH_MAX_BYTES = 1 << 30      # a compressed BATCH's agent records inflate to at most this
MAX_JSON_BYTES = 256 << 20     # a compressed JSON record inflates to at most this
HEADER = struct.Struct("<8sHHI")
RECORD_HEADER = struct.Struct("<BBHII")      # version 2: type, 0, 0, length, crc32
RECORD_HEADER_V1 = struct.Struct("<BBHI")    # version 1: no checksum
# The largest payload a record may have.  The writer's largest is a BATCH: one drain of the agent,
# at most max(4 MiB, 4 x ring size) (agents/runtime/core.js drainCap; rings are 1 MiB); JSON
# records are far smaller.  A reader refuses a larger length without reading it.
MAX_RECORD = 64 << 20
FILE_NAME = "capture.mtc"
END_RESERVE = 64 << 10      # disk space held back from the start so the END record can be written
HELD_MAX = 32 << 10         # of which symbol and module records held back after a write failure
HOLD_MAX = 64 << 20         # bytes CaptureWriter.hold keeps unwritten at most (agent records and bodies)
HOLD_S = 15.0               # ... and seconds (the capture loop ends its hold after 5 s of the target's run)


class RecordType(IntEnum):
    META = 1          # who, what, where, options, start time
    RECON = 2         # hook symbols found / MISSING
    MODULES = 3       # loaded modules (name, path, base, size)
    BATCH = 4         # agent counters + binary records
    SYMBOLS = 5       # [address, module, offset, function, file, line, inlined?] rows
    CALIBRATION = 6   # allocator statistics and footprint at a phase
    EVENTS = 7        # low-frequency tracers' JSON events
    WARNING = 8       # something the user should know
    SNAPSHOT = 9      # periodic counters/rates, for death evidence
    END = 10          # how the capture ended, with evidence
    RESULT = 11       # a tracer's computed result (probe truth table, census, ...)
    GROUP = 12        # (version >= 5) one zstd frame of several BATCH, SNAPSHOT and EVENTS records


# What the writer groups (after the first BATCH: the stack definitions are written at once); what
# it writes at once, ahead of a group it holds (their rows name addresses: order does not matter;
# SYMBOLS when the round is large); anything else is written after the group it holds.
GROUPED = frozenset({RecordType.BATCH, RecordType.SNAPSHOT, RecordType.EVENTS, RecordType.SYMBOLS})
AHEAD_OF_GROUP = frozenset({RecordType.MODULES, RecordType.SYMBOLS})     # (SYMBOLS: a large round)
SYMBOLS_ALONE_FROM = 200 * 100      # rows x ~100 bytes: a round this large is not grouped
GROUPED_V5 = frozenset({RecordType.BATCH, RecordType.SNAPSHOT, RecordType.EVENTS})    # what a version-5 group holds
# (version >= 8) The records a run writes before its first drain (META, RECON, CALIBRATION,
# MODULES, a SNAPSHOT, a WARNING) are held and written as one group when it comes (or when
# GROUP_S has passed, or at END): a short run's capture is mostly these, each of them a frame of
# its own before, ~25 bytes of framing and nothing learnt from the others (the C++ program's:
# 510 -> ~370 bytes).  A version-8 group may hold them.  Only memtrace SIGKILLed before the first
# drain loses them (as it loses any group it holds).
OPENING = frozenset({RecordType.META, RecordType.RECON, RecordType.CALIBRATION, RecordType.MODULES,
                     RecordType.WARNING})
GROUPED_V8 = GROUPED | OPENING


# The agent's record layout and counters (memtrace/layout.py, shared with the agent's C and JS).
REC_PAD, REC_STACK, REC_ALLOC, REC_FREE = layout.REC_PAD, layout.REC_STACK, layout.REC_ALLOC, layout.REC_FREE
REC_STACK_TAIL = layout.REC_STACK_TAIL     # the wire's only: StackTails makes it a STACK record
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


def calls_total(counters: list[int]) -> int:
    """Every call the core counted, releases and Darwin's VM line included: the event rate's count."""
    return sum(counters[layout.calls_at(name)] for name in layout.KINDS)


def alloc_totals(counters: list[int]) -> tuple[int, int]:
    """Allocation calls and gross bytes of the malloc family from the agent's counters (releases and
    Darwin's VM line excluded: a VM region is not a malloc call)."""
    kinds = [name for name, k in layout.KINDS.items() if k not in RELEASE_KINDS and k not in layout.VM_KINDS]
    return (sum(counters[layout.calls_at(name)] for name in kinds),
            sum(counters[layout.bytes_at(name)] for name in kinds))


_CHUNK = struct.Struct(layout.CHUNK_HEADER.format)
_STACK_HEAD = struct.Struct(layout.STACK_RECORD.format)
_STACK_TAIL_HEAD = struct.Struct(layout.STACK_TAIL_RECORD.format)
_ALLOC = struct.Struct(layout.ALLOC_RECORD.format)
_FREE = struct.Struct(layout.FREE_RECORD.format)
_PAD = struct.Struct(layout.PAD_RECORD.format)
_AGG_HEAD = struct.Struct(layout.AGG_RECORD.format)
_AGG_NVALUES_AT = layout.AGG_RECORD.offsets["nvalues"]     # a u8 (iter_stacks_and_aggs reads it alone)
_PEAK_HEAD = struct.Struct(layout.PEAK_HEAD_RECORD.format)
_PEAK = struct.Struct(layout.PEAK_RECORD.format)
_LIVE = struct.Struct(layout.LIVE_RECORD.format)
_AGG_FIELD_NAMES = {i: name for name, i in layout.AGG_FIELDS.items()}


# ---- record schemas ------------------------------------------------------------------------------
#
# What every record's JSON body must look like before anyone reads it (memtrace/schema.py says how a
# schema reads): one Struct per record type (a new RecordType adds one entry to RECORD_SCHEMAS;
# tests/unit/test_capture.py checks none is missing).  A tracer's events and results are its own:
# declared beside its analyzer, registered by its Tracer (events=, result=), looked up here by the
# event's "type" and the result's "tracer".  A measured float may be null: the writer turns a NaN
# or infinity into null (see _dumps).


class _Inlined(Row):
    function: str | None
    file: str | None = None
    line: Line | None = None


class SymbolRow(Row):
    """[address, module, offset, function, file, line, inlined frames]"""

    address: Addr
    module: str | None
    offset: Count | None
    function: str | None
    file: str | None = None
    line: Line | None = None
    inlined: list[_Inlined] | None = None


class Module(Shape):
    name: str
    base: Addr
    size: Count
    path: str | None = None


# A capture from before the counters grew holds layout.MIN_COUNTERS of them (_decode pads the list).
Counters = Annotated[list[Count], Meta(min_length=layout.MIN_COUNTERS)]


class _Target(Shape):
    label: str | None = None
    device: str | None = None
    app: str | None = None
    pid: int | None = None
    name: str | None = None
    argv: list[str] | None = None


class _Options(Shape):
    window: Time | None = None
    attach_delay: Time | None = None
    agent: Maybe[dict[str, Any]] = UNSET


class MetaRecord(Shape):
    tracer: Maybe[str] = UNSET
    tool_version: str | None = None
    started_at: str | None = None
    host: Maybe[dict[str, Any]] = UNSET
    target: Maybe[_Target] = UNSET
    options: Maybe[_Options] = UNSET


class _HookSymbol(Shape):
    name: str
    status: Maybe[str] = UNSET
    module: str | None = None
    address: Addr | None = None


class _ReconInfo(Shape):
    release_hook: str | None = None
    census_at: Num | None = None
    census_step: Num | None = None
    default_stack_size: Count | None = None
    madvise_platform: str | None = None


class ReconRecord(Shape):
    symbols: Maybe[list[_HookSymbol]] = UNSET
    info: Maybe[_ReconInfo] = UNSET


class ModulesRecord(Shape):
    modules: Maybe[list[Module]] = UNSET


class _Tracked(Shape):
    bytes: Maybe[Count] = UNSET
    blocks: Maybe[Count] = UNSET


class _Peak(Shape):
    bytes: Maybe[Count] = UNSET
    epoch: Maybe[Count] = UNSET
    t: Time | None = None


class _Clock(Row):
    """[agent clock (us), host clock (ms)]"""

    agent: Time
    host: Time


class _StackBytes(Row):
    stack_id: Count
    bytes: Count


class _Sample(Shape):
    t: Maybe[Time] = UNSET
    tracked_bytes: Maybe[Count] = UNSET
    tracked_blocks: Maybe[Count] = UNSET
    peak_bytes: Maybe[Count] = UNSET
    in_use: Amount | None = None
    footprint: Amount | None = None
    top: Maybe[list[_StackBytes]] = UNSET


class BatchRecord(Shape):
    counters: Maybe[Counters] = UNSET
    t: Time | None = None
    lost: Maybe[Count] = UNSET
    live: Maybe[Count] = UNSET
    stacks: Maybe[Count] = UNSET
    # the aggregate core's (agents/malloc.js onBatch): which stream, the clocks, tracked bytes,
    # the peak so far, and on a drain's last batch the timeline sample
    mode: Maybe[str] = UNSET
    final: Maybe[bool] = UNSET
    t0: Time | None = None
    clock: Maybe[_Clock] = UNSET
    tracked: Maybe[_Tracked] = UNSET
    peak: Maybe[_Peak] = UNSET
    live_done: Maybe[bool] = UNSET
    sample: Maybe[_Sample] = UNSET


class SymbolsRecord(Shape):
    rows: Maybe[list[SymbolRow]] = UNSET
    by: str | None = None


class PhaseStats(Shape):
    source: str | None = None
    in_use: Maybe[Amount] = UNSET
    footprint: Maybe[Amount] = UNSET


class CalibrationRecord(Shape):
    phase: Maybe[str] = UNSET
    allocator: PhaseStats | None = None
    footprint: PhaseStats | None = None
    # ("after" only) how the hooks came out: the agent's world report (runtime/world.js worldReport)
    world: dict[str, Any] | None = None


class Event(Shape):
    """What every tracer's JSON event has.  A tracer's event types subclass it, say the "type" they
    check in ``TYPE`` and are listed in the tracer's ``Tracer.events``."""

    TYPE: ClassVar[str] = ""

    type: Maybe[str] = UNSET
    t: Num | None = None
    tid: int | None = None
    frames: Maybe[list[Addr]] = UNSET


class EventsRecord(Shape):
    # Each event is checked by _events_problem: as the type(s) its "type" names, or as an Event.
    events: Maybe[list[dict[str, Any]]] = UNSET


class WarningRecord(Shape):
    message: str | None = None
    agent_error: str | None = None
    stack: str | None = None


class SnapshotRecord(Shape):
    t: Time | None = None
    calls: Amount | None = None
    bytes: Amount | None = None
    calls_per_s: Amount | None = None
    bytes_per_s: Amount | None = None
    counters: Maybe[Counters] = UNSET


class _Timing(Shape):
    launch_to_attach_s: Time | None = None
    captured_s: Time | None = None
    phases: Maybe[dict[str, Num]] = UNSET       # the start's steps: CLOCK_MONOTONIC seconds by name
    symbolize_s: Time | None = None             # symbolizing on the host during the run, in all
    final_symbolize_s: Time | None = None       # ... of which its last round, after the target's end


class EndRecord(Shape):
    ended: Maybe[str] = UNSET
    reason: Maybe[str] = UNSET
    evidence: Maybe[dict[str, Any]] = UNSET
    ended_at: str | None = None
    counters: Maybe[Counters] = UNSET
    batches: Maybe[Count] = UNSET
    pid: int | None = None
    launch: Maybe[dict[str, Any]] = UNSET
    capture_error: Maybe[dict[str, Any]] = UNSET
    timing: Maybe[_Timing] = UNSET


class Result(Shape):
    """A tracer's computed result; the tracer's own type (Tracer.result) subclasses it."""

    tracer: Maybe[str] = UNSET


RECORD_SCHEMAS: dict[RecordType, type[Shape]] = {
    RecordType.META: MetaRecord,
    RecordType.RECON: ReconRecord,
    RecordType.MODULES: ModulesRecord,
    RecordType.BATCH: BatchRecord,
    RecordType.SYMBOLS: SymbolsRecord,
    RecordType.CALIBRATION: CalibrationRecord,
    RecordType.EVENTS: EventsRecord,
    RecordType.WARNING: WarningRecord,
    RecordType.SNAPSHOT: SnapshotRecord,
    RecordType.END: EndRecord,
    RecordType.RESULT: Result,
}


# Each tracer's event types and result type, as (tracer name, events, result) for every registered
# tracer: handed in by the registry when it loads (memtrace.tracers imports this module, never the
# reverse -- the registry imports the analyzers, which import this one).  Until then an event is
# checked for the fields every event has, a result for its tracer's name.
TracerSchemas = Callable[[], Iterable[tuple[str, tuple[type["Event"], ...], "type[Result] | None"]]]
_tracer_schema_source: TracerSchemas | None = None


def use_tracer_schemas(source: TracerSchemas) -> None:
    """The registry's tracers' event and result types, asked for on first use."""
    global _tracer_schema_source
    _tracer_schema_source = source
    _tracer_schemas.cache_clear()
    _events_decoder.cache_clear()


@functools.cache
def _tracer_schemas() -> tuple[dict[str, tuple[type[Event], ...]], dict[str, type[Result]]]:
    """Every registered tracer's event types (by their "type"; tracers that share a type name have
    each of their types checked) and result types (by tracer name)."""
    events: dict[str, tuple[type[Event], ...]] = {}
    results: dict[str, type[Result]] = {}
    for name, event_types, result in _tracer_schema_source() if _tracer_schema_source is not None else ():
        for event_type in event_types:
            events[event_type.TYPE] = (*events.get(event_type.TYPE, ()), event_type)
        if result is not None:
            results[name] = result
    return events, results


@functools.cache
def _events_decoder() -> msgspec.json.Decoder[Any] | None:
    """The fast check of an EVENTS record: one msgspec pass over its JSON text, every event by the
    Struct its "type" names (each type's fields merged with Event's and with those of any other
    tracer that writes the same type name, as _events_problem checks them one by one).  An event
    of a type no tracer declares fails it; _events_problem then says whether that is all."""
    members: list[type[msgspec.Struct]] = []
    for tag, types in _tracer_schemas()[0].items():
        fields: dict[str, msgspec.structs.FieldInfo] = {}
        checked: tuple[type[Event], ...] = (Event, *types)
        for event_type in checked:
            for f in msgspec.structs.fields(event_type):
                if f.encode_name == "type":
                    continue
                if f.encode_name in fields and fields[f.encode_name].type != f.type:
                    return None     # two tracers give one field two types: the slow check only
                fields[f.encode_name] = f
        members.append(msgspec.defstruct(
            f"_Event_{tag}", [(f.name, f.type) if f.required else (f.name, f.type, f.default) for f in fields.values()],
            kw_only=True, gc=False, tag_field="type", tag=tag, rename={f.name: f.encode_name for f in fields.values()}))
    if not members:
        return None
    one_of: Any = Union[tuple(members)]  # noqa: UP007 -- built at run time from the registry
    events_type: Any = Maybe[list[one_of]]  # type: ignore[misc]
    events = msgspec.defstruct("_EventsRecord", [("events", events_type, UNSET)])
    return msgspec.json.Decoder(events)


def _body_problem(kind: RecordType, body: Any, payload: bytes = b"") -> tuple[str, str] | None:
    if kind == RecordType.EVENTS and payload and (decoder := _events_decoder()) is not None:
        try:
            decoder.decode(payload)
            return None
        except msgspec.MsgspecError:
            pass                    # a bad event, or one of a type no tracer declares: said below
    found = problem(body, RECORD_SCHEMAS[kind])
    if found is not None:
        return found
    if kind == RecordType.EVENTS and body.get("events"):
        return _events_problem(body["events"])
    if kind == RecordType.RESULT:
        result_type = _tracer_schemas()[1].get(body.get("tracer"))
        return None if result_type is None else problem(body, result_type)
    return None


def admit_body(kind: RecordType, body: dict[str, Any]) -> list[str]:
    """Takes out of ``body``, in place, each top-level field the reader would refuse (and skip the
    whole record for, its group's records with it); returns what was taken out, as "where: what".

    For bodies that come from an agent (a BATCH): one bad value in its JSON would otherwise lose
    the batch's agent records -- its stack definitions -- when the capture is read.  Every field of
    a record's body is optional; a body wrong as a whole is left as it is (the reader says it)."""
    removed: list[str] = []
    while (found := problem(body, RECORD_SCHEMAS[kind])) is not None:
        where, what = found
        key = re.split(r"[.\[]", where[1:], maxsplit=1)[0] if where.startswith(".") else ""
        if key not in body:
            break
        del body[key]
        removed.append(f"{where}: {what}")
    return removed


def _events_problem(events: list[dict[str, Any]]) -> tuple[str, str] | None:
    """The first event that is not of the type(s) its "type" names (each subclasses Event), or not
    an Event when no tracer declares its type.  The events of one type are checked in one msgspec
    call: a capture of a thread storm holds tens of thousands of them."""
    by_type = _tracer_schemas()[0]
    groups: dict[Any, list[dict[str, Any]]] = {}
    for ev in events:
        tag = ev.get("type")
        groups.setdefault(tag if type(tag) is str and tag in by_type else None, []).append(ev)
    if all(_valid(group, list[event_type])  # type: ignore[valid-type]
           for tag, group in groups.items() for event_type in by_type.get(tag, (Event,))):
        return None
    for i, ev in enumerate(events):     # one is bad: say the first, in the order they came
        tag = ev.get("type")
        for event_type in by_type.get(tag, (Event,)) if type(tag) is str else (Event,):
            found = problem(ev, event_type)
            if found is not None:
                return f".events[{i}]{found[0]}", found[1]
    raise AssertionError("an event failed its check in a group but not alone")


def _valid(value: Any, schema: Any) -> bool:
    try:
        msgspec.convert(value, schema)
        return True
    except msgspec.ValidationError:
        return False


class CaptureError(Exception):
    """A capture that cannot be read; the message names the file and the problem."""


class CaptureWriteError(MemtraceError):
    """The capture could not be written (disk full, quota, I/O error); one line says where and why."""


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
    body: Any                       # decoded JSON, of the shape RECORD_SCHEMAS names
    data: bytes = b""               # BATCH only: the agent's binary records
    offset: int = -1                # where the record starts in its file


NO_END = "no END record: the capture was not closed (memtrace or the machine stopped before it could)"


@dataclass
class CaptureInfo:
    """What a reader learned about the file itself, beyond its records."""

    path: Path
    version: int = 0
    records: int = 0
    truncated: bool = False     # reading stopped before the end of the file: a torn tail or damage
    truncation: str = ""        # where and why: "truncated at byte N: ..." or "corrupt at byte N: ..."
    corrupt: bool = False       # ... because a checksum, a length or a record's shape is wrong
    ended: bool = False         # an END record was read
    stopped: str = ""           # the writer stopped early; its END record says why (disk full ...)
    unknown: dict[int, int] = field(default_factory=dict)   # record types this memtrace does not know
    extra: dict[str, Any] = field(default_factory=dict)
    # Records skipped because they say what cannot be (a checksum, a shape, a value): the reader
    # reads on past each.  The first few are named ("byte N: why"); all are counted.
    skipped: list[str] = field(default_factory=list)
    n_skipped: int = 0
    # Stack ids the records use and those STACK records define (agent records and JSON both):
    # an id used but never defined is said, by the byte of the first record that used it.
    stacks_used: dict[int, int] = field(default_factory=dict)
    stacks_defined: set[int] = field(default_factory=set)
    _skipped_at: set[tuple[int, int]] = field(default_factory=set)

    def skip(self, offset: int, why: str, within: int = -1) -> None:
        """A bad record at byte ``offset`` (agent record ``within`` its BATCH's data) was skipped."""
        key = (offset, within)
        if key in self._skipped_at:
            return                  # the same BATCH decoded twice in one read: said once
        if len(self._skipped_at) < SKIPS_REMEMBERED:
            self._skipped_at.add(key)
        self.n_skipped += 1
        self.corrupt = True
        if len(self.skipped) < SKIPS_NAMED:
            self.skipped.append(f"byte {offset}: {why}")

    @property
    def damage(self) -> str | None:
        """What of the capture could not be read although it was written (records refused, stack
        ids used but never defined), in one phrase -- the part of :attr:`problem` a complete read
        of a finished capture can still have; None when nothing was lost."""
        return self.problem if self.n_skipped or self.undefined_stacks() else None

    def undefined_stacks(self) -> list[int]:
        """Stack ids used by some record that no STACK record defines (pseudo stacks aside)."""
        return sorted(sid for sid in self.stacks_used if sid not in self.stacks_defined and sid < NESTED_STACK)

    @property
    def problem(self) -> str | None:
        """Why the records read are not the whole capture, in one phrase; None when they are."""
        said = []
        if self.n_skipped:
            more = self.n_skipped - 1
            said.append(f"corrupt at {self.skipped[0]}; skipped"
                        + (f", with {more} more bad record{'s' if more > 1 else ''} skipped" if more else "")
                        + " (the rest was read)")
        undefined = self.undefined_stacks()
        if undefined:
            first = min(undefined, key=lambda sid: self.stacks_used[sid])
            said.append(f"corrupt at byte {self.stacks_used[first]}: stack id {first} is used but no STACK record "
                        f"defines it" + (f" ({len(undefined)} such stack ids)" if len(undefined) > 1 else ""))
        if self.truncated:
            said.append(self.truncation)
        elif not self.ended:
            said.append(NO_END)
        if self.stopped:
            said.append(self.stopped)
        if self.unknown:
            kinds = ", ".join(f"{n} of type {t}" for t, n in sorted(self.unknown.items()))
            said.append(f"records of a type this memtrace does not know were skipped ({kinds}): upgrade memtrace")
        return "; ".join(said) if said else None


SKIPS_NAMED = 5             # bad records a CaptureInfo names (the rest are counted)
SKIPS_REMEMBERED = 1 << 16  # (offset, agent offset) pairs remembered to say each bad record once


class BatchData(bytes):
    """A BATCH's agent records, knowing where they came from: a decoder that skips one of them
    (a value no agent writes) says so to the CaptureInfo of the read, naming the BATCH's byte."""

    info: CaptureInfo | None = None     # set by the reader
    offset: int = -1
    # Stack ids its BATCH's JSON names (the sample's top rows): they count as used once these
    # agent records, which define them, are decoded -- a read that never decodes them cannot
    # know the definitions, and must not call the ids undefined.
    json_stacks: tuple[int, ...] = ()
    drain = 0                           # its place in a grouped BATCH (version 5)

    def skip(self, within: int, why: str) -> None:
        if self.info is not None:
            where = f" of drain {self.drain} of the group" if self.drain else ""
            self.info.skip(self.offset, f"BATCH agent record at offset {within}{where}: {why}",
                           (self.drain << 32) | within)

    def use_stack(self, sid: int) -> None:
        if self.info is not None and sid not in self.info.stacks_used:
            self.info.stacks_used[sid] = self.offset

    def define_stack(self, sid: int) -> None:
        if self.info is not None:
            self.info.stacks_defined.add(sid)


# ---- writing -----------------------------------------------------------------


def header_bytes(version: int = FORMAT_VERSION) -> bytes:
    """A capture's 16-byte header (version 1: no checksum)."""
    if version == 1:
        return HEADER.pack(MAGIC, 1, 0, 0)
    head = HEADER.pack(MAGIC, version, 0, 0)[:12]
    return head + struct.pack("<I", zlib.crc32(head))


def encode_record(rtype: RecordType | int, body: Any, data: bytes = b"", version: int = FORMAT_VERSION) -> bytes:
    """One whole record, framed for a capture of ``version``."""
    blob = _dumps(body)
    zstd_ok = version >= 4 and BATCH_ZLIB_ON and _zstd is not None
    if rtype == RecordType.BATCH:
        n = len(blob)
        if zstd_ok and _zstd is not None and n + len(data) >= BATCH_ZLIB_MIN:
            # Version 4: the JSON (its counters are most of a small batch) and the agent records
            # in one zstd frame.
            packed = _compress(blob + data, _zstd_level(n + len(data), small_up_to=RECORD_SMALL_UP_TO), version)
            if len(packed) < n + len(data):
                n, blob, data = n | BATCH_ZSTD, b"", packed
        elif version >= 3 and BATCH_ZLIB_ON and len(data) >= BATCH_ZLIB_MIN:
            packed = zlib.compress(data, BATCH_ZLIB_LEVEL)
            if len(packed) < len(data):
                n, data = n | BATCH_ZLIB, packed
        payload = struct.pack("<I", n) + blob + data
    elif zstd_ok and _zstd is not None and len(blob) >= JSON_ZSTD_MIN:
        packed = _compress(blob, _zstd_level(len(blob), small_up_to=RECORD_SMALL_UP_TO) if version >= 6
                           else ZSTD_LEVEL, version)
        payload = packed if len(packed) < len(blob) else blob
    else:
        payload = blob
    if version == 1:
        return RECORD_HEADER_V1.pack(int(rtype), 0, 0, len(payload)) + payload
    head = RECORD_HEADER_V1.pack(int(rtype), 0, _head_check(int(rtype), len(payload)), len(payload))
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


def group_bytes(records: list[tuple[RecordType, Any, bytes]], version: int = FORMAT_VERSION) -> bytes:
    """A GROUP record's records, before compression: each ``u8 type | u8 flags | u16 0 | u32
    length | payload`` with its uncompressed payload (a BATCH's: ``u32 json length | json | agent
    records``; the others': JSON); from version 7, COLUMNS_FROM records or more: first ``u8 0 | u8
    0 | u16 0 | u32 length | the JSON bodies in columns`` (:func:`_columns`), then each record with
    SUB_COLUMNS set and its payload without its JSON (a BATCH's: its agent records alone)."""
    assert _zstd is not None and len(records) > 1
    subs = []
    # (version 7) A group of COLUMNS_FROM records or more has their JSON in columns (_columns).
    columns = version >= 7 and len(records) >= COLUMNS_FROM and all(isinstance(body, dict) for _, body, _ in records)
    if columns:
        try:
            table = _dumps(_columns([(int(rtype), body) for rtype, body, _ in records], version))
        except TypeError:
            columns = False
        else:
            subs.append(RECORD_HEADER_V1.pack(0, 0, 0, len(table)) + table)
    # The AGG values as deltas (version 6, _agg_deltas): a walk of the agent records, ~20 ms per MB
    # each way; CPython's capture 10 % smaller.
    running: dict[int, dict[int, int]] | None = {}
    for rtype, body, data in records:
        flag = SUB_COLUMNS if columns else 0
        if rtype == RecordType.BATCH and running is not None and data:
            deltas = _agg_deltas(data, running, undo=False)
            if deltas is not None:
                data, flag = deltas, flag | SUB_AGG_DELTAS
        if columns:
            sub = data if rtype == RecordType.BATCH else b""
        else:
            blob = _dumps(body)
            sub = struct.pack("<I", len(blob)) + blob + data if rtype == RecordType.BATCH else blob
        subs.append(RECORD_HEADER_V1.pack(int(rtype), flag, 0, len(sub)) + sub)
    return b"".join(subs)


def encode_group(records: list[tuple[RecordType, Any, bytes]], version: int = FORMAT_VERSION) -> bytes:
    """One GROUP record (version >= 5): a zstd frame of several records (:func:`group_bytes`)."""
    raw = group_bytes(records, version)
    payload = _compress(raw, _group_level(len(raw)), version)
    head = RECORD_HEADER_V1.pack(int(RecordType.GROUP), 0, _head_check(int(RecordType.GROUP), len(payload)),
                                 len(payload))
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


SUB_AGG_DELTAS = 1      # (version >= 6) a grouped BATCH's flag byte: its AGG values are deltas
SUB_COLUMNS = 2         # (version >= 7) a grouped record's flag byte: its JSON is in the group's columns
# (version 7) A group of this many records or more has their JSON bodies in columns: the C++
# program's 40 drains 2,611 -> 2,001 bytes of JSON; two or three records are smaller as they are.
COLUMNS_FROM = 8


def _leaves(body: dict[str, Any], path: tuple[str, ...], out: dict[tuple[str, ...], Any]) -> None:
    for key, value in body.items():
        if not isinstance(key, str):
            raise TypeError("a key that is not a string")      # (JSON would make it one: not in columns)
        if isinstance(value, dict) and value:
            _leaves(value, path + (key,), out)
        else:
            out[path + (key,)] = value


def _is_int(v: Any) -> bool:
    return type(v) is int


def _ints(values: list[Any]) -> bool:
    return set(map(type, values)) <= {int}


def _columns(bodies: list[tuple[int, Any]], version: int = FORMAT_VERSION) -> list[Any]:
    """The JSON bodies of a group's records, column by column (version 7): ``[[type, path, rows,
    code, values], ...]``, one entry per record type and leaf path (a key path through nested
    objects) -- rows null when every record of that type has it, else the indices of those that
    do; code "d": integers, each the difference
    from the one before (the first from 0); "D": lists of integers of one length, each the
    element-wise difference from the one before (0: no element changed); "r": the values as they
    are.  A drain's counters and totals change by little from one drain to the next: its
    differences, side by side, compress to a few bytes where the numbers themselves take tens.

    From version 8 a column may instead name an earlier one (its index in the table) whose values
    it repeats: code "=", a column of the same type and rows with the same values (a drain's
    ``live``, ``tracked.blocks`` and ``sample.tracked_blocks``); code "<", each of its values
    that column's value in the latest record before it (a SNAPSHOT's counters and totals: the
    drain's just before it)."""
    cols: dict[tuple[int, tuple[str, ...]], tuple[list[int], list[Any]]] = {}
    of_type: dict[int, int] = {}
    for i, (rtype, body) in enumerate(bodies):
        of_type[rtype] = of_type.get(rtype, 0) + 1
        leaves: dict[tuple[str, ...], Any] = {}
        _leaves(body, (), leaves)
        for path, value in leaves.items():
            rows, values = cols.setdefault((rtype, path), ([], []))
            rows.append(i)
            values.append(value)
    out: list[Any] = []
    same: dict[tuple[int, tuple[int, ...], bytes], int] = {}    # (type, rows, values' JSON) -> column
    earlier: list[tuple[int, list[int], list[Any]]] = []           # each column's type, rows, values
    for (rtype, path), (rows, values) in cols.items():
        at = len(out)
        earlier.append((rtype, rows, values))
        if version >= 8:
            text = _dumps(values)
            k = at
            if len(text) > REPEAT_FROM:
                k = same.setdefault((rtype, tuple(rows), text), at)
                if k == at:
                    k = _repeated(rows, text, earlier)
            if k != at:
                out.append([rtype, list(path), None if len(rows) == of_type[rtype] else rows,
                            "=" if earlier[k][0] == rtype else "<", k])
                continue
        code, coded = "r", values
        if all(map(_is_int, values)):
            code, coded, before = "d", [], 0
            for v in values:
                coded.append(v - before)
                before = v
        elif (all(isinstance(v, list) and all(map(_is_int, v)) for v in values)
              and len({len(v) for v in values}) == 1 and values[0]):
            code, coded, last = "D", [], [0] * len(values[0])
            for v in values:
                diff = [a - b for a, b in zip(v, last, strict=True)]
                coded.append(diff if any(diff) or not coded else 0)    # the first says the width
                last = v
        out.append([rtype, list(path), None if len(rows) == of_type[rtype] else rows, code, coded])
    return out


# (version 8) A column whose values' JSON is no longer than this is written as it is: naming
# another column would cost as much.
REPEAT_FROM = 10


def _latest(rows: list[int], theirs: list[int]) -> list[int] | None:
    """For each of ``rows``, the index in ``theirs`` (sorted rows) of the latest one before it;
    None if one has none."""
    out = []
    j = -1
    for i in rows:
        while j + 1 < len(theirs) and theirs[j + 1] < i:
            j += 1
        if j < 0:
            return None
        out.append(j)
    return out


def _repeated(rows: list[int], text: bytes, earlier: list[tuple[int, list[int], list[Any]]]) -> int:
    """The index of an earlier column of another type whose value in the latest record before
    each of ``rows`` is this column's (values' JSON ``text``), else the column's own index."""
    at = len(earlier) - 1
    rtype = earlier[at][0]
    for k in range(at):
        their_type, theirs, values = earlier[k]
        if their_type == rtype:
            continue
        picks = _latest(rows, theirs)
        if picks is not None and _dumps([values[j] for j in picks]) == text:
            return k
    return at


def _uncolumns(table: Any, types: list[int], version: int = FORMAT_VERSION) -> list[dict[str, Any]]:
    """The bodies of a group's records of these types, from its columns (:func:`_columns`);
    _Damaged if the table is not one of them."""
    n = len(types)
    bad = _Damaged("GROUP record: its columns are not a column table")
    if not isinstance(table, list):
        raise bad
    bodies: list[dict[str, Any]] = [{} for _ in range(n)]
    read: list[tuple[int, list[int], list[Any]]] = []     # (version 8) each column's type, rows, values
    for col in table:
        if not (isinstance(col, list) and len(col) == 5):
            raise bad
        rtype, path, rows, code, coded = col
        if not (isinstance(path, list) and path and all(isinstance(k, str) for k in path)):
            raise bad
        if rows is None:
            rows = [i for i in range(n) if types[i] == rtype]
        elif not (isinstance(rows, list) and _ints(rows) and rows == sorted(set(rows))
                  and (not rows or rows[0] >= 0 and rows[-1] < n)):
            raise bad
        if code in ("=", "<") and version >= 8:
            if not (type(coded) is int and 0 <= coded < len(read)) or any(types[i] != rtype for i in rows):
                raise bad
            their_type, theirs, their_values = read[coded]
            if code == "=":
                if their_type != rtype or theirs != rows:
                    raise bad
                picked = list(range(len(rows)))
            else:
                latest = _latest(rows, theirs)
                if their_type == rtype or latest is None:
                    raise bad
                picked = latest
            # (a copy each: no two records share a list or an object)
            copies = [json.loads(_dumps(their_values[j])) for j in picked]
            _place(bodies, rows, copies, path, bad)
            read.append((rtype, rows, copies))
            continue
        if not isinstance(coded, list) or len(coded) != len(rows) or any(types[i] != rtype for i in rows):
            raise bad
        if code == "d":
            values = list(itertools.accumulate(coded)) if _ints(coded) else None
            if values is None:
                raise bad
        elif code == "D":
            first = coded[0] if coded else None
            if not (isinstance(first, list) and first):
                raise bad
            values, last, width = [], [0] * len(first), len(first)
            for d in coded:
                if d == 0 and type(d) is int:
                    values.append(list(last))
                    continue
                if not (type(d) is list and len(d) == width and _ints(d)):
                    raise bad
                last = list(map(operator.add, last, d))
                values.append(last)
        elif code == "r":
            values = coded
        else:
            raise bad
        _place(bodies, rows, values, path, bad)
        read.append((rtype, rows, values))
    return bodies


def _place(bodies: list[dict[str, Any]], rows: list[int], values: list[Any], path: list[str], bad: _Damaged) -> None:
    for i, value in zip(rows, values, strict=True):
        node = bodies[i]
        for key in path[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise bad
        if path[-1] in node:
            raise bad
        node[path[-1]] = value
_AGG_BITS: dict[int, list[int]] = {}       # an AGG mask's field bits, lowest first (filled as masks are seen)
_QS: dict[int, struct.Struct] = {}         # n little-endian u64s, by n


def _agg_deltas(data: bytes, running: dict[int, dict[int, int]], undo: bool) -> bytes | None:
    """A grouped BATCH's agent records with each AGG value (a stack's running total) replaced by
    its difference from that stack's same field in the group's last AGG record before it (mod
    2^64; the first one as it is), or, ``undo``, the other way back.  The drains of a quiet
    stretch repeat the same few stacks' totals, which change by little: sqlite3's AGG records
    compress a fifth smaller so, CPython's a tenth.  None: data this walk cannot frame (then it
    is stored as it is; read back, the group is damaged)."""
    out = bytearray(data)
    end = len(out)
    pos = 0
    mask64 = (1 << 64) - 1
    # Each stack's fields (bit -> value) so far; into ``running`` only once the whole data is framed.
    seen: dict[int, dict[int, int]] = {}
    head_size, chunk_size = _AGG_HEAD.size, _CHUNK.size
    fixed = {REC_ALLOC: _ALLOC.size, REC_FREE: _FREE.size, REC_PEAK_HEAD: _PEAK_HEAD.size,
             REC_PEAK: _PEAK.size, REC_LIVE: _LIVE.size}
    while pos + chunk_size <= end:
        _, length = _CHUNK.unpack_from(out, pos)
        pos += chunk_size
        stop = pos + length
        if stop > end:
            return None
        while pos + 8 <= stop:
            rtype = out[pos]
            if rtype == REC_AGG:
                if pos + head_size > stop:
                    return None
                _, nvalues, _, sid, mask, _ = _AGG_HEAD.unpack_from(out, pos)
                bits = _AGG_BITS.get(mask)
                if bits is None:
                    bits = _AGG_BITS[mask] = [bit for bit in range(32) if mask >> bit & 1]
                size = head_size + 8 * nvalues
                if len(bits) != nvalues or pos + size > stop:
                    return None
                at = pos + head_size
                # The record's values at once (one Struct per count), the stack's fields by bit.
                values = _QS.get(nvalues)
                if values is None:
                    values = _QS[nvalues] = struct.Struct(f"<{nvalues}Q")
                got = values.unpack_from(out, at)
                last = seen.get(sid)
                if last is None:
                    last = seen[sid] = dict(running.get(sid, ()))
                before = last.get
                if undo:
                    got = tuple([(v + before(bit, 0)) & mask64 for bit, v in zip(bits, got, strict=True)])
                    values.pack_into(out, at, *got)
                else:
                    values.pack_into(out, at, *[(v - before(bit, 0)) & mask64 for bit, v in zip(bits, got, strict=True)])
                last.update(zip(bits, got, strict=True))
            elif rtype == REC_STACK:
                size = 8 + 8 * (out[pos + 1] | out[pos + 2] << 8 | out[pos + 3] << 16)
            elif rtype == REC_PAD:
                size = 8 + int.from_bytes(out[pos + 4:pos + 8], "little")
            elif rtype in fixed:
                size = fixed[rtype]
            else:
                return None
            if pos + size > stop:
                return None
            pos += size
        if pos != stop:
            return None
    if pos != end:
        return None
    running.update(seen)
    return bytes(out)


# (version >= 6) Every zstd frame is made with a shipped dictionary (its id in the frame's header).
# Version 6's: 16 KB trained on the records of captures of sort, perl, xz, awk and find (META
# aside: it names the host) -- the keys, counters and hook names every capture repeats.  A run's
# small JSON records (META, RECON, MODULES, CALIBRATION, END) and each group's first drain are most
# of a short run's capture: the C++ program's 16.1 -> 9.6 KB record by record, sqlite3's 57 -> 45
# KB.  Version 7's: the same programs and a few more (bench/capture_dictionary.py), with the
# records as they are now (END's timing and guard, RECON's unwind tables) and version 7's column
# groups.  Version 8's (id 8, named in a frame's header in one byte): format 7's content, the
# symbol rows of the shared libraries every program's stacks pass through (libc, the loader,
# libstdc++), and the records a run writes once, the opening ones as the writer groups them --
# of programs in C and C++ other than the ones it is measured on -- with zstd's statistics from
# the samples.  Never changed once shipped (a capture names it by id): a better one is another
# file and id; a reader keeps every one.
DICTIONARY_FILES = {6: Path(__file__).with_name("capture-v6.zdict"), 7: Path(__file__).with_name("capture-v7.zdict"),
                    8: Path(__file__).with_name("capture-v8.zdict")}
DICTIONARY_FILE = DICTIONARY_FILES[8]


@functools.cache
def _dictionary(version: int = FORMAT_VERSION) -> Any:
    """The zstd dictionary a capture of ``version`` is written with (the newest shipped one at or
    before it), or None (a broken installation: frames are then made without it, and frames made
    with it read as damaged, saying which dictionary they need)."""
    if _zstd is None:
        return None
    for v in sorted((v for v in DICTIONARY_FILES if v <= version), reverse=True):
        try:
            return _zstd.ZstdDict(DICTIONARY_FILES[v].read_bytes())
        except (OSError, ValueError, _zstd.ZstdError):
            continue
    return None


@functools.cache
def _dictionaries() -> dict[int, Any]:
    """Every shipped dictionary a reader knows, by id."""
    found = (_dictionary(v) for v in DICTIONARY_FILES)
    return {d.dict_id: d for d in found if d is not None}


def _compress(data: bytes, level: int, version: int) -> bytes:
    assert _zstd is not None
    shipped = _dictionary(version) if version >= 6 else None
    if shipped is None:
        return _zstd.compress(data, level)
    # Up to DIGESTED_UP_TO, the dictionary digested once per level and kept (not loaded again
    # for every frame: version 8's 64 KB dictionary at levels 15 and 19 cost CPython's capture
    # 0.34 s of CPU instead of 0.25, the C++ program's 41 ms instead of 10; the same bytes).  A
    # larger frame's loaded for it: a digested dictionary's parameters are made for any size, and
    # cc1plus's large drains (level 6) came out 0.9 % larger so.
    if len(data) <= DIGESTED_UP_TO:
        return _zstd.compress(data, level, zstd_dict=shipped.as_digested_dict)
    return _zstd.compress(data, level, zstd_dict=shipped)


def _zstd_level(n: int, mid: int = ZSTD_LEVEL, mid_up_to: int = ZSTD_FAST_FROM,
                small_up_to: int = ZSTD_SMALL_UP_TO, large: int = ZSTD_FAST_LEVEL) -> int:
    """The zstd level for ``n`` bytes: harder the smaller (the host keeps up with a busy stream)."""
    return ZSTD_SMALL_LEVEL if n <= small_up_to else mid if n <= mid_up_to else large


def _group_level(n: int) -> int:
    """A group's level: 19 when quiet (small), 15 up to ZSTD_GROUP_LEVEL_UP_TO, ZSTD_LEVEL beyond."""
    return _zstd_level(n, ZSTD_GROUP_LEVEL, ZSTD_GROUP_LEVEL_UP_TO, large=ZSTD_LEVEL)


def _head_check(rtype: int, length: int) -> int:
    return zlib.crc32(struct.pack("<BBI", rtype, 0, length)) & 0xFFFF


def _dumps(body: Any) -> bytes:
    try:
        return json.dumps(body, separators=(",", ":"), default=_json_default, allow_nan=False).encode()
    except ValueError:
        # A NaN or infinity from a division somewhere: JSON has no such numbers, and a reader
        # refuses them; null says "no value" truthfully.
        return json.dumps(_finite(body), separators=(",", ":"), default=_json_default).encode()


def _finite(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _body_estimate(body: Any) -> int:
    """About the bytes a record's JSON body takes (a SYMBOLS row ~90, an event ~100, the rest ~256)."""
    if isinstance(body, dict):
        rows = body.get("rows", body.get("events"))
        if isinstance(rows, list):
            return 256 + 100 * len(rows)
    return 256


class DeferredBytes:
    """Bytes made when first asked for (``bytes(x)``), then kept: a record's agent data that the
    writer holds (CaptureWriter.hold) need not be made before it is written.  Whoever makes it
    first makes it; the capture loop's (the stack definitions made whole, capture_loop._route)
    are asked for in the order they came by each of their readers, as their making needs."""

    __slots__ = ("_make", "_size", "_value")

    def __init__(self, make: Callable[[], bytes], size: int) -> None:
        self._make: Callable[[], bytes] | None = make
        self._size = size
        self._value: bytes | None = None

    def __len__(self) -> int:
        return self._size if self._value is None else len(self._value)

    def __bytes__(self) -> bytes:
        if self._value is None:
            assert self._make is not None
            # (A make that raises -- an interrupt -- is kept, to be tried again: the capture loop's
            # leaves its StackTails as it found them.)
            self._value, self._make = self._make(), None
        return self._value


class CaptureWriter:
    """Appends checksummed records straight to the OS, so a crash loses nothing written; the
    agent's drains after the first are grouped, at most GROUP_S of them held here (module
    docstring, version 5), and a short local target's first seconds are held whole (:meth:`hold`).

    When a write fails (disk full, quota, I/O error) the writer cuts the file back to its last
    complete record, raises :class:`CaptureWriteError` once, and from then on only counts what it
    could not write.  The END record is written into disk space set aside at the start (a small
    reserve file beside the capture, freed just before END), so even a full disk gets a capture
    that reads back to the failure and says why.
    """

    def __init__(self, path: Path | str, fsync_interval: float = 1.0, reserve: int = END_RESERVE,
                 observer: Callable[[bytes], None] | None = None) -> None:
        self.path = Path(path)
        self.bytes_written = 0
        self.error: str | None = None      # why writing stopped
        self.error_at = 0                  # the byte where the capture stops
        self.lost_records = 0              # records not written after the failure
        self.lost_bytes = 0
        self.end_written = False
        self._end_tried = False
        self._held: list[bytes] = []       # after a failure: SYMBOLS/MODULES to write before END
        self._fsync_interval = fsync_interval
        # Given every piece of the file as it is written (the header, each whole record), in
        # order: what a reader of the finished file reads (frame_records decodes them).
        self.observer = observer
        # Records held for the next GROUP record: (type, body, agent records), the first one's
        # monotonic time, their bytes; None: not grouping (no zstd, or MEMTRACE_CAPTURE_ZLIB=off).
        self._group: list[tuple[RecordType, Any, bytes]] | None = [] if BATCH_ZLIB_ON and _zstd is not None else None
        self._group_t0 = 0.0
        self._group_bytes = 0
        self._batches = 0
        self._opening = True               # (version 8) holding the run's opening records (OPENING)
        # (hold) Records kept as they were written, to be written at release; their bytes (agent
        # records, and an estimate of the bodies'), since when.
        self._holding: list[tuple[RecordType, Any, bytes | DeferredBytes]] | None = None
        self._holding_bytes = 0
        self._holding_t0 = 0.0
        self._reserve: Path | None = self.path.with_name(f".{self.path.name}.reserve") if reserve else None
        # Written under a name of its own until its header is whole, then linked in place: whoever
        # watches the folder (a test, a user's script, `memtrace show` run early) finds no capture or
        # one that starts with its header, never an empty file it must call "not a capture".
        fresh = self.path.with_name(f".{self.path.name}.{os.getpid()}.new")
        try:
            self._fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as e:
            raise CaptureWriteError(f"{self.path}: cannot create the capture: {e.strerror}") from None
        try:
            if self._reserve is not None:
                _set_aside(self._reserve, reserve)
            self._append(header_bytes())
            _link_in_place(fresh, self.path)
        except (OSError, CaptureWriteError) as e:
            os.close(self._fd)
            self._fd = -1
            with contextlib.suppress(OSError):
                fresh.unlink()
            self._release_reserve()
            why = e.strerror if isinstance(e, OSError) else self.error
            raise CaptureWriteError(f"{self.path}: cannot start the capture: {why}{_free_space(self.path)}") from None

    def hold(self) -> None:
        """Keep every record written from here on, in order and unencoded, until :meth:`release`
        (or the END record, or :meth:`close`), HOLD_MAX bytes and HOLD_S seconds at most (then the
        next write releases them): the capture loop's quiet start
        of a short local target (capture_loop.CaptureLoop._start_quiet), where encoding each drain as
        it came -- the rows' deltas, zstd -- was host CPU spent beside the target on the machine they
        share.  A writer that does not group (MEMTRACE_CAPTURE_ZLIB=off: a capture that must grow as
        the records come) does not hold either.  What it held for a group is written first: the run's
        opening records (META first) are on disk whatever becomes of the host meanwhile -- killed
        while it holds, it leaves a capture that reads back to them (and says no END)."""
        if self._group is not None and self._holding is None and self.error is None:
            self.flush()
            self._holding, self._holding_bytes, self._holding_t0 = [], 0, time.monotonic()

    @property
    def holding(self) -> bool:
        return self._holding is not None

    def release(self) -> None:
        """Write what :meth:`hold` kept, as :meth:`write` would have then; raises CaptureWriteError
        (once) when one of those writes failed -- the rest are then counted as lost, as any write
        after a failure is.  Interrupted (Ctrl-C), it keeps holding what it had not handed to
        write yet, for the END or close to write."""
        held, self._holding, self._holding_bytes = self._holding, None, 0
        failed: CaptureWriteError | None = None
        done = 0
        try:
            for rtype, body, data in held or ():
                if isinstance(data, DeferredBytes):
                    data = bytes(data)      # (made before it is handed over: an interrupt here loses nothing)
                done += 1
                try:
                    self.write(rtype, body, data)
                except CaptureWriteError as e:
                    failed = failed or e
        finally:
            if held is not None and done < len(held):
                self._holding = held[done:]
        if failed is not None:
            raise failed

    def write(self, rtype: RecordType, body: Any, data: bytes | DeferredBytes = b"") -> None:
        """Append one record; raises CaptureWriteError on the first write that fails."""
        released = True
        if self._holding is not None:
            if rtype != RecordType.END:
                self._holding.append((rtype, body, data if isinstance(data, DeferredBytes) else bytes(data)))
                self._holding_bytes += len(data) + _body_estimate(body)
                if self._holding_bytes >= HOLD_MAX or time.monotonic() - self._holding_t0 >= HOLD_S:
                    self.release()
                return
            try:
                self.release()
            except CaptureWriteError:
                released = False        # as a failed flush before the END, below
        if isinstance(data, DeferredBytes):
            data = bytes(data)
        # (version 8) Before the first drain, and in the first group only, the run's opening records
        # are held too (OPENING).
        was_opening = self._opening
        opening = was_opening and rtype in GROUPED_V8 and rtype != RecordType.BATCH
        if rtype == RecordType.BATCH or not opening:
            self._opening = False
        if (rtype in GROUPED or opening) and self._group is not None and self.error is None:
            self._batches += rtype == RecordType.BATCH
            # (a SYMBOLS row's JSON is ~90 bytes, a drain's ~900)
            rows = body.get("rows") if rtype == RecordType.SYMBOLS and isinstance(body, dict) else None
            size = len(data) + (100 * len(rows) if isinstance(rows, list) else 256)
            # A large round of symbols is written alone, at once (at ZSTD_SMALL_LEVEL up to
            # RECORD_SMALL_UP_TO: harder than a busy group's level; cc1plus's capture 1.5 % smaller).
            alone = rtype == RecordType.SYMBOLS and size >= SYMBOLS_ALONE_FROM
            # (version 8) The run's first round of symbols, which comes after the first drain, is
            # held too: it and the next rounds name the same images (C++ program: 1,791 -> 1,646 bytes).
            later = self._batches > 1 or (rtype == RecordType.SYMBOLS and self._batches > 0)
            if (later or opening) and size < GROUP_MAX and not alone:
                if not self._group:
                    self._group_t0 = time.monotonic()
                self._group.append((rtype, body, bytes(data)))
                self._group_bytes += size
                if self._group_bytes >= GROUP_MAX or time.monotonic() - self._group_t0 >= GROUP_S:
                    self.flush()
                return
        flushed = released
        if rtype not in AHEAD_OF_GROUP or was_opening:      # (the opening records stay first)
            try:
                self.flush()            # what is held goes first: the records stay in order
            except CaptureWriteError:
                flushed = False         # this write is the one that failed: it says so, below
        if rtype == RecordType.END:
            self._write_end(body)
            if not flushed:     # the drains held before it could not be written: the END says so, and so does this
                raise CaptureWriteError(self.failure())
            return
        frame = encode_record(rtype, body, data)
        if self.error is not None:
            if rtype in (RecordType.SYMBOLS, RecordType.MODULES) and sum(map(len, self._held)) + len(frame) <= HELD_MAX:
                self._held.append(frame)    # what makes the records already written readable
            else:
                self.lost_records += 1
                self.lost_bytes += len(frame)
            if not flushed:
                raise CaptureWriteError(self.failure())
            return
        if len(frame) > MAX_RECORD + RECORD_HEADER.size:
            self._stop(f"a {rtype.name} record of {len(frame)} bytes is larger than a capture holds "
                       f"({MAX_RECORD} bytes)", len(frame))
            raise CaptureWriteError(self.failure())
        self._append(frame)

    def flush(self) -> None:
        """Write the records held for a GROUP record (one alone: as itself)."""
        if not self._group:
            return
        drains, self._group, self._group_bytes = self._group, [], 0
        self._opening = False
        if self.error is not None:
            self.lost_records += len(drains)
            self.lost_bytes += sum(len(d) for _, _, d in drains)
            return
        frame = encode_record(*drains[0]) if len(drains) == 1 else encode_group(drains)
        try:
            if len(frame) > MAX_RECORD + RECORD_HEADER.size:
                self._stop(f"a GROUP record of {len(frame)} bytes is larger than a capture holds "
                           f"({MAX_RECORD} bytes)", len(frame))
                raise CaptureWriteError(self.failure())
            self._append(frame)
        except CaptureWriteError:
            self.lost_records = len(drains)     # every drain of the group
            raise CaptureWriteError(self.failure()) from None

    def _write_end(self, body: Any) -> None:
        self._end_tried = True
        self._release_reserve()         # the END record goes into the space held back for it
        if self.error is not None:
            body = {**body, "capture_error": {"error": self.error, "at_byte": self.error_at,
                                              "lost_records": self.lost_records, "lost_bytes": self.lost_bytes}}
            if body.get("ended") == "completed":
                # The window did not complete: the failure ended it (a death, if any, is kept).
                body.update(ended="write-failed", reason=f"memtrace could not write the capture ({self.error}) "
                                                         f"and stopped tracing at byte {self.error_at}")
        frame = encode_record(RecordType.END, body)
        if self.error is None:
            self._append(frame)
            self.end_written = True
            return
        for held in self._held:         # symbols of the stacks already written, if they fit
            if not self._put_after_failure(held):
                self.lost_records += 1
                self.lost_bytes += len(held)
        self._held = []
        # Not even the END fits: the reader will say "no END record".
        self.end_written = self._put_after_failure(frame)

    def _put_after_failure(self, frame: bytes) -> bool:
        try:
            _pwrite_all(self._fd, frame, self.bytes_written)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self.bytes_written)
            return False
        self.bytes_written += len(frame)
        self._observe(frame)
        return True

    def _append(self, frame: bytes) -> None:
        try:
            _pwrite_all(self._fd, frame, self.bytes_written)
        except OSError as e:
            self._stop(e.strerror or str(e), len(frame), e.errno)
            raise CaptureWriteError(self.failure()) from None
        self.bytes_written += len(frame)
        self._observe(frame)

    def _observe(self, frame: bytes) -> None:
        if self.observer is not None:
            self.observer(frame)

    def _stop(self, why: str, lost: int, err: int | None = None) -> None:
        name = errno_names.errorcode.get(err or 0)
        self.error = f"{why} ({name})" if name else why
        self.error_at = self.bytes_written
        self.lost_records, self.lost_bytes = 1, lost
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, self.bytes_written)      # a torn record is no record

    def failure(self) -> str:
        """One line: where the capture stopped, why, and what it still holds."""
        if self.error is None:
            return ""
        end = ("" if not self._end_tried else "; its END record says so" if self.end_written
               else "; not even its END record could be written")
        lost = f"; {self.lost_records} record(s), {self.lost_bytes} bytes, not written" if self.lost_records else ""
        return (f"{self.path}: cannot write the capture: {self.error}; it holds "
                f"everything up to byte {self.error_at}{end}{lost}")

    def sync(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            with contextlib.suppress(CaptureWriteError):      # said by failure(), as any write's
                self.release()
                self.flush()
            os.fsync(self._fd)
        except OSError as e:
            if self.error is None:
                self.error, self.error_at = f"{e.strerror} (at fsync)", self.bytes_written
        finally:
            os.close(self._fd)
            self._fd = -1
            self._release_reserve()

    def _release_reserve(self) -> None:
        if self._reserve is not None:
            with contextlib.suppress(OSError):
                self._reserve.unlink()
            self._reserve = None

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno_names.EIO, "short write")
        view, offset = view[n:], offset + n


def _link_in_place(fresh: Path, path: Path) -> None:
    """fresh becomes path, never over an existing file (os.link's EEXIST is the O_EXCL of a direct
    create); a file system without hard links (FAT on a USB stick) gets a rename after a check."""
    try:
        os.link(fresh, path)
    except OSError as e:
        if e.errno == errno_names.EEXIST or path.exists():
            raise
        os.rename(fresh, path)
        return
    fresh.unlink()


def _set_aside(path: Path, size: int) -> None:
    """Hold ``size`` bytes of real disk blocks in ``path`` (not a sparse file: freeing it must free space)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        else:       # macOS hosts: written zeros are allocated blocks too
            _pwrite_all(fd, bytes(size), 0)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    os.close(fd)


def _free_space(path: Path) -> str:
    try:
        return f" ({shutil.disk_usage(path.parent).free} bytes free on its disk)"
    except OSError:
        return ""


def append_record(path: Path | str, rtype: RecordType, body: Any) -> None:
    """Add one record to a finished capture (e.g. a batch's verdict; the last END wins)."""
    p = resolve_capture_path(path)
    with _open_capture(p) as f:
        version = _read_header(p, f.read(HEADER.size))
    with open(p, "ab") as f:
        f.write(encode_record(rtype, body, version=version))
        f.flush()
        os.fsync(f.fileno())


def replace_records(path: Path | str, rtype: RecordType, bodies: list[Any]) -> Path:
    """Rewrite a capture with every ``rtype`` record replaced by ``bodies`` (JSON records, written
    where the first old one was, or after the last complete record when there was none), framed
    for the capture's own format version.

    Everything else is copied byte for byte -- record types this version does not know and a
    torn tail included -- into a new file beside the old one, which then replaces it: a reader
    sees the old capture or the new one, never half of either."""
    if rtype == RecordType.BATCH:
        raise ValueError("BATCH records carry binary data; replace_records writes JSON records only")
    p = resolve_capture_path(path)
    src = _open_capture(p)
    try:
        head = src.read(HEADER.size)
        version = _read_header(p, head)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as e:
        src.close()
        raise CaptureError(f"{p}: cannot write beside it: {e.strerror}") from None
    except CaptureError:
        src.close()
        raise
    frame = RECORD_HEADER_V1 if version == 1 else RECORD_HEADER
    fresh = b"".join(encode_record(rtype, body, version=version) for body in bodies)
    try:
        with src, os.fdopen(fd, "wb") as out:
            out.write(head)
            placed = False
            while True:
                rh = src.read(frame.size)
                if len(rh) < frame.size:
                    tail = rh
                    break
                kind, _, _, length, *_ = frame.unpack(rh)
                payload = src.read(length) if length <= MAX_RECORD else b""
                if length > MAX_RECORD or len(payload) < length:
                    tail = rh + payload
                    break
                if kind == int(rtype):
                    if not placed:
                        out.write(fresh)
                        placed = True
                    continue
                if kind == RecordType.GROUP and version >= 6 and rtype in (GROUPED_V8 if version >= 8 else GROUPED):
                    kept = _group_without(rh, payload, rtype, version)
                    if kept is not None:
                        if not placed:
                            out.write(fresh)
                            placed = True
                        out.write(kept)
                        continue
                out.write(rh + payload)
            if not placed:
                out.write(fresh)
            out.write(tail + src.read())        # a torn tail stays exactly as torn as it was
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, os.stat(p).st_mode & 0o7777)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def _group_without(rh: bytes, payload: bytes, rtype: RecordType, version: int) -> bytes | None:
    """A version-6 (or later) GROUP record framed again, for a capture of ``version``, without its
    ``rtype`` records (one left: a record of its own), or None: it holds none, or it is damaged
    (then it is copied as it is, for a reader to say so).  The others are decoded and encoded
    again: a column group's table has a row for every record it holds."""
    if zlib.crc32(payload, zlib.crc32(rh[:8])) != RECORD_HEADER.unpack(rh)[4]:
        return None
    try:
        held = _decode_group(_unzstd(payload, BATCH_MAX_BYTES, "GROUP record"), version)
    except _Damaged:
        return None
    if any(isinstance(r, _Refused) and r.body is None for r in held):
        return None         # a record whose JSON cannot be read: copied as it is, for a reader to say so
    # A refused record is written again as it was (for a reader to say so) unless of the type taken out.
    kept = [(RecordType(r.rtype), r.body, r.data) if isinstance(r, _Refused) else (r.type, r.body, bytes(r.data))
            for r in held if (r.rtype if isinstance(r, _Refused) else r.type) != rtype]
    if len(kept) == len(held):
        return None
    if not kept:
        return b""
    if len(kept) == 1:
        return encode_record(*kept[0], version=version)
    return encode_group(kept, version)


# ---- reading -----------------------------------------------------------------


def resolve_capture_path(path: Path | str) -> Path:
    """A capture file, or a capture folder holding ``capture.mtc``."""
    p = Path(path)
    if p.is_dir():
        p = p / FILE_NAME
    return p


def _open_capture(p: Path) -> BinaryIO:
    """The file, read-only; only a regular file (a FIFO would block a reader forever)."""
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CaptureError(f"{p}: no such capture") from None
    except OSError as e:
        raise CaptureError(f"{p}: cannot open: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CaptureError(f"{p}: not a regular file (a capture is a file, not a FIFO, device or socket)")
    return os.fdopen(fd, "rb")


def _read_header(p: Path, head: bytes) -> int:
    """The capture's format version, once its header has been checked."""
    if len(head) < HEADER.size or head[:8] != MAGIC:
        raise CaptureError(f"{p}: not a memtrace capture (bad magic)")
    _, version, flags, check = HEADER.unpack(head)
    if version == 1:
        if flags or check:
            raise CaptureError(f"{p}: corrupt header (version 1 with non-zero reserved bytes)")
        return 1
    if zlib.crc32(head[:12]) != check:
        raise CaptureError(f"{p}: corrupt header (checksum mismatch; format version field reads {version})")
    if version > FORMAT_VERSION:
        raise CaptureError(f"{p}: capture format version {version} is newer than this memtrace reads "
                           f"(up to {FORMAT_VERSION}); upgrade memtrace")
    if version < 1:
        raise CaptureError(f"{p}: corrupt header (format version {version})")
    return version


class _Damaged(Exception):
    """A record that is not what the format says; the message says what."""


def read_records(path: Path | str, info: CaptureInfo | None = None) -> Generator[Record, None, None]:
    """Yield every complete, intact record.  A damaged or malformed one is skipped, and ``info``
    names it (``info.skipped``: where and why) while reading goes on; a torn tail ends reading and
    ``info`` says where.  Unknown record types of a newer writer are skipped and counted in
    ``info.unknown``."""
    p = resolve_capture_path(path)
    info = info if info is not None else CaptureInfo(p)
    info.path = p
    f = _open_capture(p)
    with f:
        version = _read_header(p, f.read(HEADER.size))
        info.version = version
        frame = RECORD_HEADER_V1 if version == 1 else RECORD_HEADER
        size = os.fstat(f.fileno()).st_size
        offset = HEADER.size
        while True:
            rh = f.read(frame.size)
            if not rh:
                return
            if len(rh) < frame.size:
                _stop(info, offset, "record header cut short", corrupt=False)
                return
            rtype, zero, head_check, length, *check = frame.unpack(rh)
            if check and (zero or head_check != _head_check(rtype, length)):
                # The length cannot be trusted: look for the next record whose header check and
                # checksum both hold (a chance of 2^-48 per candidate to be wrong), and read on.
                found = _next_intact_record(f, offset + 1)
                if found is None:
                    _stop(info, offset, "record header checksum mismatch")
                    return
                info.skip(offset, f"record header checksum mismatch; {found - offset} bytes skipped to the next "
                                  f"intact record")
                offset = found
                f.seek(offset)
                continue
            if length > MAX_RECORD:
                _stop(info, offset, f"record length {length} is larger than any memtrace writes ({MAX_RECORD})")
                return
            if offset + frame.size + length > size:
                size = os.fstat(f.fileno()).st_size      # a capture still being written grows
            if offset + frame.size + length > size:
                have = max(0, size - offset - frame.size)
                _stop(info, offset, f"record cut short ({have} of {length} bytes)", corrupt=False)
                return
            payload = f.read(length)
            if len(payload) < length:
                _stop(info, offset, f"record cut short ({len(payload)} of {length} bytes)", corrupt=False)
                return
            # From here the record's length is known good (its header's check held): a record
            # that fails is skipped, said, and the next one read.
            if check and zlib.crc32(payload, zlib.crc32(rh[:8])) != check[0]:
                info.skip(offset, f"{_type_name(rtype)} record: checksum mismatch")
                offset += frame.size + length
                continue
            records = _records_at(rtype, payload, version, offset, info)
            offset += frame.size + length
            yield from records


def _records_at(rtype: int, payload: bytes, version: int, offset: int, info: CaptureInfo) -> list[Record]:
    """The records of one intact record's payload at byte ``offset`` (a grouped BATCH: several),
    noted in ``info``; none when it is damaged (``info`` says why) or of an unknown type."""
    try:
        decoded = _decode(rtype, payload, version)
    except _Damaged as e:
        info.skip(offset, str(e))
        return []
    if decoded is None:
        info.unknown[rtype] = info.unknown.get(rtype, 0) + 1
        return []
    # A grouped BATCH (version 5) is several drains: each a record at the group's byte.
    records: list[Record] = []
    for k, one in enumerate(decoded if isinstance(decoded, list) else [decoded]):
        if isinstance(one, _Refused):
            info.skip(offset, f"GROUP record: {one.why}", within=-2 - k)
            continue
        record = one
        records.append(record)
        record.offset = offset
        info.records += 1
        if isinstance(record.data, BatchData):
            record.data.info, record.data.offset, record.data.drain = info, offset, k
        _note_json_stacks(record, info)
        if record.type == RecordType.END:
            info.ended = True
            err = record.body.get("capture_error")
            info.stopped = (f"the capture stopped early at byte {err.get('at_byte')}: {err.get('error')}"
                            if err else "")
    return records


def frame_records(frames: Iterable[bytes], path: Path | str = "", info: CaptureInfo | None = None) -> Iterator[Record]:
    """The records of the bytes a :class:`CaptureWriter` appends, in the pieces it appends them
    (``CaptureWriter.observer``: the header, then one whole record at a time): what
    :func:`read_records` yields reading the finished file, decoded as it is written -- a
    command folds its summary during the capture instead of reading the capture again at the
    end (issue 21: fixed cost).  ``info``, when given, says what was skipped, as read_records' does."""
    info = info if info is not None else CaptureInfo(Path(path))
    version = 0
    offset = 0
    for frame in frames:
        if not version:
            version = info.version = _read_header(info.path, bytes(frame[:HEADER.size]))
            offset = len(frame)
            continue
        head = RECORD_HEADER_V1 if version == 1 else RECORD_HEADER
        rtype, _, _, length, *_ = head.unpack_from(frame)
        records = _records_at(rtype, bytes(frame[head.size:head.size + length]), version, offset, info)
        offset += len(frame)
        yield from records


_RECORD_START = re.compile(rb"[\x01-\x0c]\x00", re.DOTALL)    # a known record type, then its 0 byte


def _next_intact_record(f: BinaryIO, start: int) -> int | None:
    """The offset of the first version-2 record at or after ``start`` whose header check and
    payload checksum hold, or None (a damaged header's length says nothing of where the next
    record is)."""
    try:
        view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    with view:
        end = len(view)
        for m in _RECORD_START.finditer(view, start):
            at = m.start()
            if at + RECORD_HEADER.size > end:
                return None
            rtype, _, head_check, length, crc = RECORD_HEADER.unpack_from(view, at)
            if head_check != _head_check(rtype, length) or length > MAX_RECORD:
                continue
            stop = at + RECORD_HEADER.size + length
            if stop > end:
                continue
            if zlib.crc32(view[at + RECORD_HEADER.size:stop], zlib.crc32(view[at:at + 8])) == crc:
                return at
    return None


def _type_name(rtype: int) -> str:
    try:
        return RecordType(rtype).name
    except ValueError:
        return f"type-{rtype}"


LEAK_ROW_KEYS = ("definitely_by_stack", "indirectly_by_stack", "possibly_by_stack", "reachable_by_stack",
                 "leaked_by_stack")


def _note_json_stacks(record: Record, info: CaptureInfo) -> None:
    """Stack ids a JSON record names (a leak scan's rows): used, to be defined by a STACK record."""
    body = record.body
    rows: list[Any] = []
    if record.type == RecordType.RESULT:
        # Rows of the keys its tracer's Result type declares (malloc's leak scan), which checked them.
        result_type = _tracer_schemas()[1].get(body.get("tracer"))
        declared = result_type.__struct_fields__ if result_type is not None else ()
        rows = [r for key in LEAK_ROW_KEYS if key in declared for r in body.get(key) or ()]
    elif record.type == RecordType.BATCH and isinstance(body.get("sample"), dict):
        rows = body["sample"].get("top") or []
        if isinstance(record.data, BatchData):
            record.data.json_stacks = tuple(r[0] for r in rows)
            return
    for r in rows:
        if r[0] not in info.stacks_used:
            info.stacks_used[r[0]] = record.offset


def _stop(info: CaptureInfo, offset: int, why: str, corrupt: bool = True) -> None:
    info.truncated = True
    info.corrupt = corrupt
    info.truncation = f"{'corrupt' if corrupt else 'truncated'} at byte {offset}: {why}"


def _decode(rtype: int, payload: bytes, version: int, body: Any = None) -> Record | list[Record | _Refused] | None:
    """One record from its payload (``body``: its JSON already read, from a group's columns: the
    payload is then the rest, a BATCH's ``u32 0 | agent records``)."""
    try:
        kind = RecordType(rtype)
    except ValueError:
        if version == 1:            # version 1 had exactly the types 1 to 11
            raise _Damaged(f"unknown record type {rtype}") from None
        return None                 # a record type from a newer writer (its checksum held)
    if kind == RecordType.GROUP:
        if version < 5:             # not this type then: a newer writer's, as above
            if version == 1:
                raise _Damaged(f"unknown record type {rtype}")
            return None
        return _decode_group(_unzstd(payload, BATCH_MAX_BYTES, "GROUP record"), version)
    data = b""
    if kind == RecordType.BATCH:
        if len(payload) < 4:
            raise _Damaged("BATCH record shorter than its JSON length")
        (n,) = struct.unpack_from("<I", payload)
        flags = n & (BATCH_ZLIB | BATCH_ZSTD) if version >= 4 else n & BATCH_ZLIB if version >= 3 else 0
        n &= ~flags
        if flags == BATCH_ZLIB | BATCH_ZSTD:
            raise _Damaged("BATCH record says its agent records are both zlib and zstd data")
        if flags == BATCH_ZSTD:         # its JSON and agent records, one zstd frame
            payload = b"\0\0\0\0" + _unzstd(memoryview(payload)[4:], BATCH_MAX_BYTES, "BATCH record")
            flags = 0
        if 4 + n > len(payload):
            raise _Damaged(f"BATCH JSON length {n} overruns its record ({len(payload) - 4} bytes)")
        data = BatchData(memoryview(payload)[4 + n:])     # one copy of the agent's bytes
        payload = payload[4:4 + n]
        if flags == BATCH_ZLIB:
            data = BatchData(_inflate(data))   # still the decoder that reports back to the read
        # Version 2's checksum already vouches for the agent's bytes: only the chunk framing is
        # checked here (the decoder checks each record as it goes); version 1 gets the full walk.
        problem = _agent_data_problem(data, records=version == 1)
        if problem is not None:
            raise _Damaged(f"BATCH agent records: {problem}")
    elif version >= 4 and payload[:4] == ZSTD_MAGIC:
        payload = _unzstd(payload, MAX_JSON_BYTES, f"{kind.name} record")
    if body is None:
        body = _loads(kind, payload)
    found = _body_problem(kind, body, payload)
    if found is not None:
        where, what = found
        raise _Damaged(f"{kind.name} record{where}: {what}")
    counters = body.get("counters") if isinstance(body, dict) else None
    if counters is not None and len(counters) < layout.N_COUNTERS:
        counters.extend([0] * (layout.N_COUNTERS - len(counters)))    # counters added since: none counted
    return Record(kind, body, data)


@dataclass
class _Refused:
    """A record of a GROUP whose content the reader refuses (said and skipped by _records_at),
    with what it held, so that a group rewritten without some other type keeps it as it was."""

    why: str
    rtype: int
    body: Any               # its JSON, when that could be read (None: its group is copied as it is on a rewrite)
    data: bytes


def _refused_parts(rtype: int, payload: bytes, body: Any) -> tuple[Any, bytes]:
    """A refused group record's JSON body and agent records, as far as they can be read."""
    data = b""
    if rtype == RecordType.BATCH and len(payload) >= 4:
        (n,) = struct.unpack_from("<I", payload)
        payload, data = payload[4:4 + n], bytes(payload[4 + n:])
    if body is None:
        try:
            body = _loads(RecordType(rtype), payload)
        except _Damaged:
            body = None
    return body, data


def _decode_group(records: bytes, version: int = FORMAT_VERSION) -> list[Record | _Refused]:
    """The records of a GROUP record: ``u8 type | u8 0 | u16 0 | u32 length | payload``, each
    payload as a version-4 record's uncompressed one."""
    out: list[Record | _Refused] = []
    at = 0
    held = GROUPED_V8 if version >= 8 else GROUPED if version >= 6 else GROUPED_V5
    running: dict[int, dict[int, int]] = {}        # the AGG values so far, by stack and field bit (version 6's deltas)
    bodies: list[dict[str, Any]] | None = None      # (version 7) the records' JSON, from the columns
    if version >= 7 and records[:1] == b"\0":
        _, zero, check, length = RECORD_HEADER_V1.unpack_from(records) if len(records) >= 8 else (0, 1, 0, 0)
        if zero or check or 8 + length > len(records):
            raise _Damaged("GROUP record: its columns' header is wrong")
        table = _loads(RecordType.GROUP, records[8:8 + length])
        at = 8 + length
        bodies = _uncolumns(table, _group_types(records, at), version)
    while at < len(records):
        if at + RECORD_HEADER_V1.size > len(records):
            raise _Damaged(f"GROUP record: its record {len(out)} cut short")
        rtype, flag, check, length = RECORD_HEADER_V1.unpack_from(records, at)
        at += RECORD_HEADER_V1.size
        columns = bodies is not None
        if columns:
            if flag & SUB_COLUMNS:
                flag &= ~SUB_COLUMNS
            else:
                flag = -1       # every record of a column group says so
        deltas = flag == SUB_AGG_DELTAS and rtype == RecordType.BATCH and version >= 6
        if rtype not in held or (flag and not deltas) or check or at + length > len(records):
            raise _Damaged(f"GROUP record: its record {len(out)} has a wrong type, header or length")
        payload = records[at:at + length]
        body = None
        if bodies is not None:
            if rtype != RecordType.BATCH and payload:
                raise _Damaged(f"GROUP record: its record {len(out)} has bytes besides its columns")
            body = bodies[len(out)]
            payload = b"\0\0\0\0" + payload if rtype == RecordType.BATCH else b""
        if rtype == RecordType.BATCH and (len(payload) < 4 or struct.unpack_from("<I", payload)[0] & (BATCH_ZLIB | BATCH_ZSTD)):
            raise _Damaged(f"GROUP record: its record {len(out)} is a BATCH compressed again")
        if deltas:
            n = 4 + struct.unpack_from("<I", payload)[0]
            values = _agg_deltas(payload[n:], running, undo=True) if n <= len(payload) else None
            if values is None:
                raise _Damaged(f"GROUP record: its record {len(out)}'s AGG deltas cannot be framed")
            payload = payload[:n] + values
        if rtype != RecordType.BATCH and payload[:4] == ZSTD_MAGIC:
            raise _Damaged(f"GROUP record: its record {len(out)} is compressed again")
        try:
            decoded = _decode(rtype, payload, 5, body)     # (zstd inside a group: refused above)
            assert isinstance(decoded, Record)
            one: Record | _Refused = decoded
        except _Damaged as e:
            # Framed and checksummed with the group, only its content is wrong (a value out of
            # range): that record alone is skipped, never the group's other records with it.
            one = _Refused(f"its record {len(out)} ({_type_name(rtype)}): {e}", rtype,
                           *_refused_parts(rtype, payload, body))
        out.append(one)
        at += length
    if len(out) < 2:
        raise _Damaged("GROUP record of fewer than two records")
    return out


def _group_types(records: bytes, at: int) -> list[int]:
    """The types of the records a group's framing holds from ``at`` (its columns' rows); _Damaged
    if it does not end exactly at the group's end."""
    types = []
    while at + RECORD_HEADER_V1.size <= len(records):
        rtype, _, _, length = RECORD_HEADER_V1.unpack_from(records, at)
        types.append(rtype)
        at += RECORD_HEADER_V1.size + length
    if at != len(records):
        raise _Damaged(f"GROUP record: its record {len(types)} cut short")
    return types


def _inflate(data: bytes) -> bytes:
    """A BATCH's compressed agent records, bounded (a hostile record cannot claim unbounded memory)."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, BATCH_MAX_BYTES)
    except zlib.error as e:
        raise _Damaged(f"BATCH agent records: bad zlib data ({e})") from None
    if d.unconsumed_tail or not d.eof:
        raise _Damaged(f"BATCH agent records: zlib data {'inflates past 1 GiB' if d.unconsumed_tail else 'cut short'}")
    return out


def _unzstd(data: bytes | memoryview, limit: int, what: str) -> bytes:
    """One zstd frame, bounded by ``limit`` (a hostile record cannot claim unbounded memory)."""
    if _zstd is None:
        raise _Damaged(f"{what}: zstd data, and no zstd module here (pip install backports.zstd)")
    try:
        wanted = _zstd.get_frame_info(data).dictionary_id
    except _zstd.ZstdError as e:
        raise _Damaged(f"{what}: bad zstd data ({e})") from None
    shipped = _dictionaries().get(wanted) if wanted else None
    if wanted and shipped is None:
        raise _Damaged(f"{what}: zstd data made with dictionary {wanted}, which this memtrace does not have")
    d = _zstd.ZstdDecompressor(zstd_dict=shipped)
    try:
        out = d.decompress(data, limit)
    except _zstd.ZstdError as e:
        raise _Damaged(f"{what}: bad zstd data ({e})") from None
    if not d.eof:
        raise _Damaged(f"{what}: zstd data {'cut short' if d.needs_input else f'inflates past {limit:,} bytes'}")
    if d.unused_data:
        raise _Damaged(f"{what}: {len(d.unused_data)} bytes after its zstd frame")
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):        # 1e999: JSON's grammar allows it, no double holds it
        raise ValueError(f"{text[:40]} is beyond any finite number")
    return value


def _loads(kind: RecordType, payload: bytes) -> Any:
    try:
        # msgspec's parser is about twice the standard library's speed; whatever it refuses (or
        # might read differently: NaN, 1e999, a lone surrogate, deep nesting) the standard one
        # reads again, to accept it as before or to say why not in the words it always has.
        return msgspec.json.decode(payload)
    except (msgspec.MsgspecError, ValueError, RecursionError):
        pass
    try:
        return json.loads(payload.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float)
    except UnicodeDecodeError as e:
        raise _Damaged(f"{kind.name} record is not UTF-8 (byte {e.start} of its JSON)") from None
    except ValueError as e:         # JSONDecodeError, or a number too long to convert
        raise _Damaged(f"{kind.name} record is not valid JSON: {str(e).splitlines()[0]}") from None
    except RecursionError:
        raise _Damaged(f"{kind.name} record nests too deeply to be JSON memtrace wrote") from None


# ---- agent records -----------------------------------------------------------


def _agent_data_problem(data: bytes, records: bool = True) -> str | None:
    """What is wrong with a BATCH's chunk framing (and, with ``records``, its records'), or None:
    every chunk lies within the data, every record within its chunk, every record type is known."""
    end = len(data)
    pos = 0
    chunk_size, head_size = _CHUNK.size, _STACK_HEAD.size
    alloc_size, free_size = _ALLOC.size, _FREE.size
    rec_alloc, rec_free, rec_stack, rec_pad = REC_ALLOC, REC_FREE, REC_STACK, REC_PAD
    while pos < end:
        if pos + chunk_size > end:
            return f"chunk header cut short at offset {pos}"
        _, length = _CHUNK.unpack_from(data, pos)
        pos += chunk_size
        stop = pos + length
        if stop > end:
            return f"chunk at offset {pos - chunk_size} claims {length} bytes, {end - pos} remain"
        if not records:
            pos = stop
            continue
        while pos < stop:
            rtype = data[pos]
            if rtype == rec_alloc:
                pos += alloc_size
            elif rtype == rec_free:
                pos += free_size
            elif rtype == rec_stack:
                pos += head_size + 8 * (data[pos + 1] | data[pos + 2] << 8) if pos + 2 < stop else head_size
            elif rtype == rec_pad:
                skip = _PAD.unpack_from(data, pos)[3] if pos + head_size <= stop else 0
                if skip < head_size:
                    return f"padding record at offset {pos} of length {skip}"
                pos += skip
            else:
                return f"unknown agent record type {rtype} at offset {pos}"
        if pos != stop:
            return f"agent record overruns its chunk (ends at offset {pos}, chunk at {stop})"
    return None


def damage_at(record: Record, error: CaptureError) -> str:
    """The one phrase for a record whose agent data failed to decode: where it starts, and why."""
    return f"corrupt at byte {record.offset}: {record.type.name} agent records: {error}"


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


# Fixed sizes of the records iter_stacks_and_aggs steps over (0: sized by its head, or unknown).
_FIXED_SIZE = [0] * 256
for _rtype, _st in ((REC_ALLOC, _ALLOC), (REC_FREE, _FREE), (REC_PEAK_HEAD, _PEAK_HEAD), (REC_PEAK, _PEAK),
                    (REC_LIVE, _LIVE)):
    _FIXED_SIZE[_rtype] = _st.size


def iter_stacks_and_aggs(data: bytes, allocs: bool = False, aggs: bool = True,
                         raw_frames: bool = False) -> Iterator[tuple[Any, ...]]:
    """The STACK and AGG records of a batch (and ALLOC with ``allocs``; AGG only with ``aggs``), as
    iter_agent_tuples gives them (with ``raw_frames`` a STACK's frames are a memoryview of their
    little-endian u64 bytes, not a tuple); every other record is stepped over by its size without being
    decoded.  For a live fold of the stream (stacks_seen): with --events a storm ships millions of
    ALLOC and FREE records a second, and decoding each in Python made the host fall behind its
    target (issue 21); a folder that wants only the stacks has every drain's changed rows stepped
    over too (CPython's were most of the host's work while its target ran).  Only the framing is
    checked; anything wrong raises CaptureError (the capture keeps the bytes, and reading it back
    checks and names each record)."""
    mv = memoryview(data)
    end = len(data)
    pos = 0
    fixed, chunk_from = _FIXED_SIZE, _CHUNK.unpack_from
    stack_from, agg_from, alloc_from = _STACK_HEAD.unpack_from, _AGG_HEAD.unpack_from, _ALLOC.unpack_from
    head_size, agg_size, rec_alloc = _STACK_HEAD.size, _AGG_HEAD.size, REC_ALLOC
    while pos + _CHUNK.size <= end:
        _, length = chunk_from(mv, pos)
        pos += _CHUNK.size
        stop = pos + length
        if stop > end:
            raise CaptureError(f"agent chunk at offset {pos - _CHUNK.size} claims {length} bytes, {end - pos} remain")
        while pos + head_size <= stop:
            rtype = mv[pos]
            size = fixed[rtype]
            if size:
                if allocs and rtype == rec_alloc and pos + size <= stop:
                    yield alloc_from(mv, pos)
                pos += size
            elif rtype == REC_STACK:
                head = stack_from(mv, pos)
                nframes = head[1] | head[2] << 8     # nframes_hi: stacks of 256 frames and more
                size = head_size + 8 * nframes
                if pos + size > stop:
                    break
                if raw_frames:
                    yield (*head, mv[pos + head_size:pos + size])
                else:
                    yield (*head, struct.unpack_from(f"<{nframes}Q", mv, pos + head_size))
                pos += size
            elif rtype == REC_AGG:
                if pos + agg_size > stop:
                    break
                nvalues = mv[pos + _AGG_NVALUES_AT]
                size = agg_size + 8 * nvalues
                if pos + size > stop:
                    break
                if aggs:
                    yield (*agg_from(mv, pos), struct.unpack_from(f"<{nvalues}Q", mv, pos + agg_size))
                pos += size
            elif rtype == REC_PAD:
                skip = _PAD.unpack_from(mv, pos)[3]
                if skip < head_size:
                    break
                pos += skip
            else:
                raise CaptureError(f"unknown agent record type {rtype} at offset {pos}")
        if pos != stop:
            raise CaptureError(f"agent record at offset {pos} overruns its chunk (ends at {stop})")
    if pos != end:
        raise CaptureError("agent record chunk header cut short")


class StackTails:
    """The agent's STACK_TAIL records (layout.REC_STACK_TAIL: a stack as its inner frames and the
    count of outer frames it shares with the stack defined just before it) made STACK records again,
    batch by batch in the order the agent sent them, before anything else sees the batch: a capture
    only ever holds STACK records.  Only the definitions' chunks are walked (thread 0, opening with a
    definition, padding or one of the logger path's VM events); the rows', the composition's and the
    live table's are copied as they are.
    A tail whose parent is not the stack defined before it (a batch lost on the way) keeps its own
    frames only and is counted in ``broken``, and so is a tail of it (the agent starts each drain's
    definitions with a whole stack, so the loss ends with the batch after the lost one)."""

    def __init__(self) -> None:
        self.last_id: int | None = None
        self.last_frames = b""      # the last stack defined: its frames' bytes, innermost first
        self.expanded = 0           # tails made whole
        self.broken = 0             # tails whose outer frames were not known

    def expand(self, data: bytes) -> bytes:
        """The batch with every STACK_TAIL record a STACK record (the same bytes when it has none)."""
        mv = memoryview(data)
        end = len(data)
        pos = copied = 0
        out: list[bytes | memoryview] = []
        chunk_size, chunk_from = _CHUNK.size, _CHUNK.unpack_from
        while pos + chunk_size <= end:
            tid, length = chunk_from(mv, pos)
            body, stop = pos + chunk_size, pos + chunk_size + length
            if stop > end:
                break               # the capture's reader names it
            if tid == 0 and length >= _STACK_HEAD.size and mv[body] in _DEFINITIONS_OPEN:
                pieces, grew = self._definitions(mv, body, stop)
                if pieces is not None:
                    out += [mv[copied:pos], _CHUNK.pack(tid, length + grew), *pieces]
                    copied = stop
            pos = stop
        if not out:
            return data
        out.append(mv[copied:])
        return b"".join(out)

    def _definitions(self, mv: memoryview, pos: int, stop: int) -> tuple[list[bytes | memoryview] | None, int]:
        pieces: list[bytes | memoryview] | None = None
        copied, grew = pos, 0
        last_at: tuple[int, int] | None = None      # the last STACK record's frames, read at the end
        head_size, tail_size, fixed = _STACK_HEAD.size, _STACK_TAIL_HEAD.size, _FIXED_SIZE
        while pos + head_size <= stop:
            rtype = mv[pos]
            if rtype == REC_STACK:
                n = mv[pos + 1] | mv[pos + 2] << 8
                size = head_size + 8 * n
                if pos + size > stop:
                    break
                self.last_id = _STACK_HEAD.unpack_from(mv, pos)[3]
                last_at = (pos + head_size, pos + size)
            elif rtype == REC_STACK_TAIL:
                _, lo, hi, sid, parent, shared = _STACK_TAIL_HEAD.unpack_from(mv, pos)
                size = tail_size + 8 * (lo | hi << 8)
                if pos + size > stop:
                    break
                if last_at is not None:
                    self.last_frames, last_at = bytes(mv[last_at[0]:last_at[1]]), None
                whole = parent == self.last_id and 8 * shared <= len(self.last_frames)
                if whole:
                    frames = bytes(mv[pos + tail_size:pos + size]) + self.last_frames[len(self.last_frames) - 8 * shared:]
                    self.expanded += 1
                else:
                    frames, shared = bytes(mv[pos + tail_size:pos + size]), 0
                    self.broken += 1
                n = len(frames) // 8
                if pieces is None:
                    pieces = []
                pieces += [mv[copied:pos], _STACK_HEAD.pack(REC_STACK, n & 0xFF, n >> 8, sid), frames]
                grew += head_size - tail_size + 8 * shared
                copied = pos + size
                # (A broken stack is no parent: a tail of it is broken too, not made up.)
                self.last_id, self.last_frames = (sid if whole else None), frames
            elif rtype == REC_PAD:
                size = _PAD.unpack_from(mv, pos)[3]
                if size < head_size:
                    break
            elif fixed[rtype]:
                size = fixed[rtype]     # the logger path's VM events share the definitions' buffer
            else:
                break                   # not a definitions chunk after all: the reader names it
            pos += size
        if last_at is not None:
            self.last_frames = bytes(mv[last_at[0]:last_at[1]])
        if pieces is None:
            return None, 0
        pieces.append(mv[copied:stop])
        return pieces, grew


# What a chunk of the definitions' buffer can open with (mt_drain_defs).
_DEFINITIONS_OPEN = frozenset({REC_STACK, REC_STACK_TAIL, REC_PAD, REC_ALLOC, REC_FREE})


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
    # Records of a version-2 capture had their chunks checked when read, but not each record
    # (checking costs as much as decoding); data straight from an agent was not checked at all.
    # So each record's framing and values are checked here, as it is decoded: one that overruns
    # its chunk, has a type no agent writes or a value no agent writes is skipped and said to the
    # read's CaptureInfo (BatchData), which names it; the rest is decoded.  Without a CaptureInfo
    # to tell (bytes from elsewhere), the first bad record raises CaptureError -- never a
    # struct.error, and never a silent misreading.
    sink = data if isinstance(data, BatchData) and data.info is not None else None
    info = sink.info if sink is not None else None
    used = info.stacks_used if info is not None else None
    defined = info.stacks_defined if info is not None else None
    at = sink.offset if sink is not None else -1
    if sink is not None:
        for sid in sink.json_stacks:
            sink.use_stack(sid)

    def bad(where: int, why: str) -> None:
        if sink is None:
            raise CaptureError(f"agent record at offset {where}: {why}")
        sink.skip(where, why)

    mv = memoryview(data)
    end = len(data)
    pos = 0
    alloc_from = _ALLOC.unpack_from
    free_from = _FREE.unpack_from
    rec_alloc, rec_free = REC_ALLOC, REC_FREE
    alloc_size, free_size, chunk_size = _ALLOC.size, _FREE.size, _CHUNK.size
    head_size = _STACK_HEAD.size       # every record starts with an 8-byte head (PAD's too)
    kinds, max_block = _KNOWN_KINDS, MAX_BLOCK
    agg_masks: dict[int, int] = {}      # AGG masks found good in this data: how many values each names
    max_total = MAX_TOTAL
    try:
        while pos + chunk_size <= end:
            tid, length = _CHUNK.unpack_from(mv, pos)
            pos += chunk_size
            stop = pos + length
            if stop > end:
                bad(pos - chunk_size, f"chunk claims {length} bytes, {end - pos} remain")
                return
            peaks_owed = 0          # PEAK records still to come of the composition being read
            while pos + head_size <= stop:
                rtype = mv[pos]
                if rtype == rec_alloc:
                    if pos + alloc_size > stop:
                        bad(pos, "ALLOC record overruns its chunk")
                        pos = stop
                        break
                    r: tuple[Any, ...] = alloc_from(mv, pos)
                    pos += alloc_size
                    if (r[5] | r[6]) > max_block or r[1] not in kinds:    # (one test for both: hot path)
                        bad(pos - alloc_size, _alloc_problem(r))
                        continue
                    if used is not None and r[3] not in used:
                        used[r[3]] = at
                elif rtype == rec_free:
                    if pos + free_size > stop:
                        bad(pos, "FREE record overruns its chunk")
                        pos = stop
                        break
                    r = free_from(mv, pos)
                    pos += free_size
                    if r[5] > max_block or r[1] not in kinds:
                        bad(pos - free_size, f"FREE record: kind {r[1]} is no call memtrace hooks"
                            if r[1] not in kinds else f"FREE record: size {r[5]} {_TOO_BIG_BLOCK}")
                        continue
                elif rtype == REC_STACK:
                    head = _STACK_HEAD.unpack_from(mv, pos)
                    nframes = head[1] | head[2] << 8     # nframes_hi: 0 in captures before 256 frames
                    size = head_size + 8 * nframes
                    if pos + size > stop:
                        bad(pos, f"STACK record of {nframes} frames overruns its chunk")
                        pos = stop
                        break
                    if nframes > layout.MAX_FRAMES or head[3] >= NESTED_STACK:
                        bad(pos, f"STACK record of {nframes} frames (at most {layout.MAX_FRAMES})"
                            if nframes > layout.MAX_FRAMES else f"STACK record defines pseudo stack id {head[3]:#x}")
                        pos += size
                        continue
                    r = (*head, struct.unpack_from(f"<{nframes}Q", mv, pos + head_size))
                    pos += size
                    if defined is not None:
                        defined.add(head[3])
                elif rtype == REC_AGG:
                    head = _AGG_HEAD.unpack_from(mv, pos)
                    size = _AGG_HEAD.size + 8 * head[1]
                    if pos + size > stop:
                        bad(pos, f"AGG record of {head[1]} values overruns its chunk")
                        pos = stop
                        break
                    values = struct.unpack_from(f"<{head[1]}Q", mv, pos + _AGG_HEAD.size)
                    # The checks of _agg_problem, a mask seen good once not counted again (hot path).
                    if head[2] or head[5] or agg_masks.get(head[4]) != head[1] or (values and max(values) > max_total):
                        problem = _agg_problem(head, values)
                        if problem is not None:
                            bad(pos, problem)
                            pos += size
                            continue
                        agg_masks[head[4]] = head[1]
                    r = (*head, values)
                    pos += size
                    if used is not None and head[3] not in used:
                        used[head[3]] = at
                elif rtype == REC_PEAK_HEAD:
                    if pos + _PEAK_HEAD.size > stop:
                        bad(pos, "PEAK_HEAD record overruns its chunk")
                        pos = stop
                        break
                    r = _PEAK_HEAD.unpack_from(mv, pos)
                    problem = _composition_problem(r, mv, pos + _PEAK_HEAD.size, stop)
                    if problem is not None:
                        bad(pos, problem)       # the head and every PEAK record of its chunk
                        pos = stop
                        break
                    pos += _PEAK_HEAD.size
                    peaks_owed = r[3]
                elif rtype == REC_PEAK:
                    if pos + _PEAK.size > stop:
                        bad(pos, "PEAK record overruns its chunk")
                        pos = stop
                        break
                    r = _PEAK.unpack_from(mv, pos)
                    pos += _PEAK.size
                    if peaks_owed == 0:
                        bad(pos - _PEAK.size, "PEAK record with no PEAK_HEAD before it in its chunk")
                        continue
                    peaks_owed -= 1
                    if used is not None and r[3] not in used:
                        used[r[3]] = at
                elif rtype == REC_LIVE:
                    if pos + _LIVE.size > stop:
                        bad(pos, "LIVE record overruns its chunk")
                        pos = stop
                        break
                    r = _LIVE.unpack_from(mv, pos)
                    pos += _LIVE.size
                    if r[5] > max_block or r[2] or r[7]:
                        bad(pos - _LIVE.size, f"LIVE record: size {r[5]} {_TOO_BIG_BLOCK}" if r[5] > max_block
                            else _RESERVED.format("LIVE"))
                        continue
                    if used is not None and r[3] not in used:
                        used[r[3]] = at
                elif rtype == REC_PAD:
                    skip = _PAD.unpack_from(mv, pos)[3]
                    if skip < head_size or pos + skip > stop:
                        bad(pos, f"padding record of length {skip} (its chunk has {stop - pos} bytes left)")
                        pos = stop
                        break
                    pos += skip
                    continue
                else:
                    bad(pos, f"unknown agent record type {rtype} (the rest of its chunk skipped)")
                    pos = stop
                    break
                yield (tid, r) if with_tid else r
            if pos != stop:
                bad(pos, f"agent record cut short by the end of its chunk (at offset {stop})")
                pos = stop
        if pos != end:
            bad(pos, "agent record chunk header cut short")
    except struct.error:
        raise CaptureError(f"agent record at offset {pos} overruns its batch ({end} bytes)") from None


# What a value in an agent record may be.  A block is smaller than any address space memtrace
# traces (2^57: x86-64 with 5-level paging; arm64 has less); a running total (bytes, calls) fits
# an int64 -- what pprof, JSON readers and every exporter can hold -- as no real run comes near.
MAX_BLOCK = 1 << 57
MAX_TOTAL = (1 << 63) - 1
_RESERVED = "{} record: a reserved field is not 0 (not a record memtrace writes)"
_TOO_BIG_BLOCK = "is larger than any block (2^57 bytes: more than any address space)"
_KNOWN_KINDS = frozenset(KIND_NAMES)
_AGG_FIELD_BITS = sum(1 << i for i in layout.AGG_FIELDS.values())


def _alloc_problem(r: tuple[Any, ...]) -> str:
    if r[1] not in _KNOWN_KINDS:
        return f"ALLOC record: kind {r[1]} is no call memtrace hooks"
    if r[5] > MAX_BLOCK:
        return f"ALLOC record: size {r[5]} {_TOO_BIG_BLOCK}"
    return f"ALLOC record: weight {r[6]} is larger than any block's (2^57 bytes)"


def _agg_problem(head: tuple[int, ...], values: tuple[int, ...]) -> str | None:
    mask = head[4]
    if head[2] or head[5]:
        return _RESERVED.format("AGG")
    if mask & ~_AGG_FIELD_BITS:
        return f"AGG record: mask {mask:#x} has bits beyond the {len(layout.AGG_FIELDS)} fields ({_AGG_FIELD_BITS:#x})"
    named = bin(mask).count("1")
    if named != head[1]:
        return f"AGG record: mask {mask:#x} names {named} fields, {head[1]} values follow"
    big = next((v for v in values if v > MAX_TOTAL), None)
    if big is not None:
        return f"AGG record of stack {head[3]}: total {big} is larger than any total (2^63 - 1)"
    return None


def _composition_problem(head: tuple[int, ...], mv: memoryview, pos: int, stop: int) -> str | None:
    """What is wrong with a PEAK_HEAD and the ``nstacks`` PEAK records that must follow it in
    its chunk, or None."""
    n = head[3]
    if head[1] or head[2]:
        return _RESERVED.format("PEAK_HEAD") + " (composition skipped)"
    if pos + n * _PEAK.size > stop:
        room = (stop - pos) // _PEAK.size
        return f"PEAK_HEAD names {n} stacks, its chunk has room for {room} PEAK records (composition skipped)"
    if head[5] > MAX_TOTAL or head[6] > MAX_TOTAL:
        return f"PEAK_HEAD: peak of {head[5]} bytes in {head[6]} blocks is larger than any total (2^63 - 1)"
    seen: set[int] = set()
    for i in range(n):
        r = _PEAK.unpack_from(mv, pos + i * _PEAK.size)
        if r[0] != REC_PEAK:
            return f"PEAK_HEAD names {n} stacks, but record {i} after it is of type {r[0]} (composition skipped)"
        if r[1] or r[2]:
            return _RESERVED.format("PEAK") + " (composition skipped)"
        if r[4] > MAX_TOTAL or r[5] > MAX_TOTAL:
            return f"PEAK record of stack {r[3]}: {r[4]} bytes in {r[5]} blocks is larger than any total (2^63 - 1)"
        if r[3] in seen:
            return f"PEAK_HEAD's composition names stack {r[3]} twice (composition skipped)"
        seen.add(r[3])
    return None


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
            out += _STACK_HEAD.pack(REC_STACK, len(r.frames) & 0xFF, len(r.frames) >> 8, r.stack_id)
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
