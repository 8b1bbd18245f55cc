"""Every number and layout the agent's C, its JavaScript and the Python host must agree on.

The one source: :mod:`memtrace.agentbuild` generates from it the C header prepended to every
CModule (``#define MT_K_MALLOC 0``, ``struct _MtConfig`` ...) and the ``layout.js`` module the
agents import, and :mod:`memtrace.capture` takes its record constants from here.  A number that
only one language uses stays in that language's file.

This module names the agent's side of things (what the CModule writes, what the agent reads out
of the target); the capture file's own bytes are :mod:`memtrace.capture`'s business.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# C type, struct format code and JS reader/writer suffix of every field type a layout uses.
FIELD_TYPES: dict[str, tuple[str, str, str]] = {
    "u8": ("guint8", "B", "U8"),
    "u16": ("guint16", "H", "U16"),
    "u32": ("guint32", "I", "U32"),
    "s32": ("gint32", "i", "S32"),
    "u64": ("guint64", "Q", "U64"),
    "s64": ("gint64", "q", "S64"),
}


@dataclass(frozen=True)
class Layout:
    """A C struct, little-endian, with every field at its natural alignment and no padding:
    the C compiler, :mod:`struct` (``format``) and the agent's readers then agree on every
    offset.  ``c_name`` empty: a foreign structure (the kernel's) that is only read."""

    c_name: str
    fields: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        off = 0
        for name, ftype in self.fields:
            size = struct.calcsize(FIELD_TYPES[ftype][1])
            if off % size:
                raise ValueError(f"{self.c_name}.{name}: a {ftype} at offset {off} would be padded")
            off += size

    @property
    def format(self) -> str:
        return "<" + "".join(FIELD_TYPES[t][1] for _, t in self.fields)

    @property
    def size(self) -> int:
        return struct.calcsize(self.format)

    @property
    def offsets(self) -> dict[str, int]:
        out, off = {}, 0
        for name, ftype in self.fields:
            out[name] = off
            off += struct.calcsize(FIELD_TYPES[ftype][1])
        return out


# ---- agent records: cmodule/core.c writes them, capture.py reads them -------------------------

REC_PAD, REC_STACK, REC_ALLOC, REC_FREE = 0, 1, 2, 3

PAD_RECORD = Layout("MtPadRecord", (("type", "u8"), ("reserved", "u8"), ("reserved2", "u16"),
                                    ("length", "u32")))
# Followed by u64 frames[nframes].
STACK_RECORD = Layout("MtStackRecord", (("type", "u8"), ("nframes", "u8"), ("reserved", "u16"),
                                        ("stack_id", "u32")))
ALLOC_RECORD = Layout("MtAllocRecord", (("type", "u8"), ("kind", "u8"), ("flags", "u16"), ("stack_id", "u32"),
                                        ("ptr", "u64"), ("size", "u64"), ("weight", "u64")))
FREE_RECORD = Layout("MtFreeRecord", (("type", "u8"), ("kind", "u8"), ("flags", "u16"), ("reserved", "u32"),
                                      ("ptr", "u64"), ("size", "u64")))
# A drained batch is a sequence of chunks: this header, then `length` bytes of one thread's records.
CHUNK_HEADER = Layout("MtChunkHeader", (("tid", "u32"), ("length", "u32")))

FLAG_LIVE, FLAG_SAMPLED, FLAG_TRUNCATED = 1, 2, 4
NO_STACK = 0xFFFFFFFF          # the record has no stack (below the stack threshold)
DROPPED_STACK = 0xFFFFFFFE     # it had one, but the stack table or the ring was full

# Call kinds: the record's `kind` byte and the index into the per-kind counters.
KINDS: dict[str, int] = {
    "malloc": 0, "calloc": 1, "realloc": 2, "free": 3, "posix_memalign": 4, "memalign": 5,
    "aligned_alloc": 6, "valloc": 7, "pvalloc": 8, "vm_allocate": 12, "vm_deallocate": 13,
    "mapped_file": 14,
}
N_KINDS = 16
RELEASE_KINDS = frozenset({KINDS["free"], KINDS["vm_deallocate"]})   # calls that give memory back

# ---- counters: a thread slot's (and a snapshot's) u64[N_COUNTERS] -----------------------------

C_CALLS = 0                    # + kind
C_BYTES = C_CALLS + N_KINDS    # + kind
C_TIER_CALLS = 32              # + tier
TIER_MAX_BYTES: tuple[int | None, ...] = (256, 1024, 4096, 8192, 65536, None)   # size <= max
N_TIERS = len(TIER_MAX_BYTES)
C_TIER_BYTES = C_TIER_CALLS + N_TIERS
COUNTERS: dict[str, int] = {
    "dropped_records": 44, "dropped_record_bytes": 45, "dropped_stacks": 46, "live_table_full": 47,
    "truncated_stacks": 48, "sampled": 49, "failed_allocs": 50, "nested_calls": 51,
    "tracked_frees": 52, "records": 53, "record_bytes": 54,
}
N_COUNTERS = 64

# ---- the CModule core's tables, sized by the agent --------------------------------------------

MAX_FRAMES = 64                # frames a stack record holds at most
LIVE_WAYS = 8                  # pointers per live-table bucket
MAX_RINGS = 4096               # recycled-ring stack in MtGlobals

# Written once by the agent before the hooks go in; read-only afterwards (but `enabled`).
CONFIG = Layout("MtConfig", (
    ("live_threshold", "u64"),
    ("stack_threshold", "u64"),
    ("max_frames", "u64"),
    ("sample_interval", "u64"),    # 0 = no sampling
    ("ring_size", "u64"),          # bytes, power of two
    ("n_slots", "u64"),
    ("n_rings", "u64"),
    ("stack_mask", "u64"),         # stack table size - 1
    ("live_mask", "u64"),          # live buckets - 1
    ("code_mask", "u64"),          # strips pointer-authentication bits
    ("tls_key", "u64"),
    ("gettid_nr", "u64"),          # Linux syscall number for gettid
    ("enabled", "u64"),
))

# ---- malloc tracer: libmalloc's logger events, decoded by cmodule/malloc.c --------------------

LOGGER_OPS: dict[str, int] = {"ignore": 0, "alloc": 1, "free": 2, "realloc": 3, "vm_alloc": 4, "vm_free": 5}
LOGGER_EVENT = Layout("MtLoggerEvent", (
    ("op", "u64"), ("kind", "u64"),
    ("ptr", "u64"),        # the new block
    ("size", "u64"),
    ("old_ptr", "u64"),    # the released block (free, realloc, vm_deallocate)
    ("tag", "u64"),        # VM user tag
))

# ---- purgeable tracer: cmodule/purgeable.c counts, agents/purgeable.js reads -------------------

# Entry numbers: the listener's function data, the C side's `fn`.
PURGEABLE_ENTRIES = ("vm_purgable_control", "mach_vm_purgable_control", "madvise", "mtdarwin_madvise",
                     "vm_allocate", "mach_vm_allocate", "mach_vm_map")
# vm_purgable_control's `control` argument (xnu osfmk/mach/vm_purgable.h).
PURGABLE_CONTROLS: dict[str, int] = {"set_state": 0, "get_state": 1, "purge_all": 2, "set_state_from_kernel": 3}
VM_FLAGS_ANYWHERE = 0x1
VM_FLAGS_PURGABLE = 0x2
# gint counters[PURGEABLE_N_COUNTS]:
#   control calls   PC_CONTROLS + fn * PC_CONTROL_STRIDE + control (PC_CONTROL_OTHER: any other value)
#   creation calls  PC_CREATION + fn
#   madvise calls   PC_MADVISE + table * PC_MADVISE_SLOTS + advice (the last slot: anything larger);
#                   table 0: the C library's madvise, 1: the stand-in's Darwin madvise
#   the C library's own streamable madvise calls, counted and never streamed: PC_MADVISE_INTERNAL
PC_CONTROLS = 0
PC_CONTROL_STRIDE = 8
PC_CONTROL_OTHER = 4
PC_CREATION = 16
PC_MADVISE_INTERNAL = 31
PC_MADVISE = 32
PC_MADVISE_SLOTS = 64
PURGEABLE_N_COUNTS = 256

# The reusable line's madvise advice values, per platform (the values are the platform's own);
# these are streamed with their stacks.
MADVISE_NAMES: dict[str, dict[int, str]] = {
    "darwin": {5: "MADV_FREE", 6: "MADV_ZERO_WIRED_PAGES", 7: "MADV_FREE_REUSABLE", 8: "MADV_FREE_REUSE",
               9: "MADV_CAN_REUSE", 10: "MADV_PAGEOUT"},
    "linux": {4: "MADV_DONTNEED", 8: "MADV_FREE", 20: "MADV_COLD", 21: "MADV_PAGEOUT"},
}

# ---- process lifecycle: cmodule/process.c (fork, exec), written by agents/runtime/process.js ----

FORK_ENTRIES = 64              # children posted in the page the parent shares with its fork children
FORK_PATH = 256                # bytes of an exec'd path kept per posted child
PATCH_BYTES = 48               # original bytes put back per patched range in a fork child
MAX_PATCHES = 64               # patched ranges at most (more: libc's file does not match memory)
FORK_ORIGINS: dict[str, int] = {"fork": 1, "spawn": 2}
PROC = Layout("MtProc", (
    ("agent_pid", "s32"),          # the traced process (a vfork child runs our code under another pid)
    ("follow", "s32"),             # 1: a forked child waits until the host's new agent releases it
    ("wait_ms", "s32"),            # ... for at most this long
    ("n_patches", "s32"),
    ("page_size", "s32"),
    ("exec_notify", "s32"),        # 1: the agent is told before the traced process execs
    ("forks", "s32"),              # fork children this copy has been (counted in the child)
    ("reserved", "s32"),
))

# ---- Darwin: task_info(TASK_VM_INFO) ----------------------------------------------------------

# struct task_vm_info (xnu osfmk/mach/task_info.h, #pragma pack(4)): the fields memtrace reads,
# at their byte offsets.  The kernel fills as many revisions as the count allows and writes back
# the count it filled; a field past it is unknown.  The Linux stand-in (demo/darwin/mtdarwin.c)
# writes the same offsets (tests/unit/test_layout.py holds it to them).
# DEVICE-UNVERIFIED: written from xnu's headers.
TASK_VM_INFO_FLAVOR = 22
TASK_VM_INFO_BUFFER = 512      # bytes: larger than any revision so far
TASK_VM_INFO_FIELDS: dict[str, tuple[int, str]] = {
    "resident_size": (16, "u64"),
    "internal": (48, "u64"),
    "reusable": (80, "u64"),
    "purgeable_volatile_pmap": (96, "u64"),
    "purgeable_volatile_virtual": (112, "u64"),
    "compressed": (120, "u64"),
    "phys_footprint": (144, "u64"),                        # rev1
    "ledger_phys_footprint_peak": (168, "s64"),            # rev3
    "ledger_purgeable_nonvolatile": (176, "s64"),
    "ledger_purgeable_volatile": (192, "s64"),
    "ledger_tag_graphics_footprint": (272, "s64"),
    "ledger_tag_graphics_footprint_compressed": (280, "s64"),
    "limit_bytes_remaining": (336, "u64"),                 # rev4
}

# Every record layout and C struct the generated header defines, in order.
C_STRUCTS: tuple[Layout, ...] = (PAD_RECORD, STACK_RECORD, ALLOC_RECORD, FREE_RECORD, CHUNK_HEADER,
                                 CONFIG, LOGGER_EVENT, PROC)
