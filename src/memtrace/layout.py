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
# Darwin's VM line (__syscall_logger): counted and recorded apart from the malloc family, never in
# its gross bytes or size tiers.  mapped_file is libsyscall's "might be a mapped file or shared
# memory" hint (mach_vm_map and file mmaps set it), vm_allocate the rest (mach_vm_allocate,
# anonymous mmap).  Their ALLOC records carry the VM user tag in flags bits 8..15.
VM_KINDS = frozenset({KINDS["vm_allocate"], KINDS["vm_deallocate"], KINDS["mapped_file"]})
FLAG_TAG_SHIFT = 8
# VM_MEMORY_MALLOC (1) .. VM_MEMORY_MALLOC_PROB_GUARD (13), xnu osfmk/mach/vm_statistics.h: libmalloc's
# own regions and large blocks (already counted as the malloc calls they serve).
VM_TAG_MALLOC_FIRST, VM_TAG_MALLOC_LAST = 1, 13
VM_TAG_IOSURFACE = 88

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
    # Darwin's logger path: VM events left out (each counted once, never silently), and the
    # realloc race (libmalloc logs a moved realloc after the old block is free again).
    "vm_allocator_own": 55, "vm_failed": 56, "vm_other_task": 57, "vm_untracked_frees": 58,
    "realloc_reuse_seen": 59,
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

# ---- unwinding through code without frame pointers (cmodule/unwind.c, runtime/unwind.js) --------

# The host turns a module's call frame information (.eh_frame) into rows sorted by `start` (code
# offset from the module's base); a row holds from its start to the next row's.  The return
# address is at CFA - 8 (x86-64).  cfa_reg: UNWIND_CFA_SP or UNWIND_CFA_FP (CFA = that register
# + cfa_offset), UNWIND_NONE: no rule here (a gap between functions, a rule the walk cannot
# follow).  fp_slot: 0 = the frame pointer register is unchanged in this frame, k = saved at
# CFA - 8k.  An index of u32 row numbers follows the rows: entry b is the row in force at offset
# b << UNWIND_INDEX_SHIFT, so a lookup reads one index entry and a few rows instead of a binary
# search over tens of thousands.  symbols/cfi.py writes both, the agent copies them as they are.
UNWIND_CFA_SP, UNWIND_CFA_FP, UNWIND_NONE = 0, 1, 255
UNWIND_INDEX_SHIFT = 8
UNWIND_ROW = Layout("MtUnwindRow", (("start", "u32"), ("cfa_offset", "u16"), ("cfa_reg", "u8"),
                                    ("fp_slot", "u8")))
# The agent's registry, read by the C walk: [start, end) in the target, rows and index; a module
# without a table (it keeps frame pointers) is listed with n_rows 0, so the walk knows it at once.
UNWIND_MODULE = Layout("MtUnwindModule", (("start", "u64"), ("end", "u64"), ("rows", "u64"), ("index", "u64"),
                                          ("n_rows", "u32"), ("n_index", "u32")))
MAX_UNWIND_MODULES = 512

# ---- malloc tracer: libmalloc's logger events, decoded by cmodule/malloc.c --------------------

LOGGER_OPS: dict[str, int] = {"ignore": 0, "alloc": 1, "free": 2, "realloc": 3, "vm_alloc": 4, "vm_free": 5,
                              "vm_skip": 6}
LOGGER_EVENT = Layout("MtLoggerEvent", (
    ("op", "u64"), ("kind", "u64"),
    ("ptr", "u64"),        # the new block
    ("size", "u64"),
    ("old_ptr", "u64"),    # the released block (free, realloc, vm_deallocate)
    ("tag", "u64"),        # VM user tag
    ("skip", "u64"),       # vm_skip: the counter (COUNTERS index) the left-out event bumps
))
# Shards of the logger's in-flight count (one cache line each): uninstall waits for them to drain.
LOGGER_INFLIGHT_SHARDS = 64
LOGGER_INFLIGHT_STRIDE = 16    # gints between shards

# ---- malloc --leaks: the conservative reachability scan (cmodule/leaks.c, agents/leaks.js) --------

# One candidate block: a tracked live block, sorted by address for the scan.
LEAK_BLOCK = Layout("MtLeakBlock", (("ptr", "u64"), ("size", "u64")))
# One root range; flags say how the scan treats it.
LEAK_RANGE = Layout("MtLeakRange", (("base", "u64"), ("size", "u64"), ("flags", "u64")))
LEAK_RANGE_STACK = 1           # shaped like a thread stack: scanned from a stopped thread's sp, else skipped
LEAK_REGS = 34                 # u64 registers kept per stopped thread (x86-64 and arm64 both fit)
LEAK_THREAD = Layout("MtLeakThread", (("tid", "u64"), ("sp", "u64")))   # its registers: MtLeakJob.regs
# Scan states (MtLeakJob.state), written by the scanner and by the Linux tracer process.
LEAK_STATES: dict[str, int] = {"idle": 0, "stopping": 1, "stopped": 2, "resume": 3, "resumed": 4, "failed": 5}
LEAK_JOB = Layout("MtLeakJob", (
    ("state", "u64"),
    ("tgid", "u64"),               # Linux: the process id (the tracer reads /proc/<tgid>/task)
    ("self_tid", "u64"),           # the scanning thread: never stopped
    ("skip", "u64"), ("n_skip", "u64"),                 # u64 thread ids never stopped (Frida's own)
    ("threads", "u64"), ("threads_cap", "u64"),         # MtLeakThread[]
    ("regs", "u64"),               # u64[threads_cap * LEAK_REGS]: each stopped thread's registers
    ("n_threads", "u64"),          # stopped
    ("n_failed", "u64"),           # could not be stopped (they ran on during the scan)
    ("tracer_stack", "u64"), ("tracer_stack_size", "u64"),
    ("tracer_pid", "u64"),
    ("error", "u64"),              # first errno seen while stopping
    ("ranges", "u64"), ("n_ranges", "u64"),             # MtLeakRange[]
    ("blocks", "u64"), ("blocks_cap", "u64"), ("n_blocks", "u64"), ("blocks_total", "u64"),
    ("marks", "u64"),              # u8 per block: 1 = reachable
    ("worklist", "u64"), ("n_work", "u64"),             # u32 block indexes to scan
    ("scratch", "u64"), ("scratch_size", "u64"),
    ("phase", "u64"),              # 0 registers, 1 roots, 2 done
    ("range_index", "u64"), ("range_offset", "u64"),
    ("root_bytes", "u64"),         # root bytes read
    ("block_bytes", "u64"),        # bytes of reachable blocks read
    # bytes not scanned, by reason: stacks of no stopped thread (exited threads' cached stacks,
    # Frida's own), the scanning thread's stack, unreadable memory
    ("skip_stack", "u64"), ("skip_own", "u64"), ("skip_unreadable", "u64"),
    ("unsized_blocks", "u64"),     # candidates whose size the allocator would not tell
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
#   the allocator's own streamable madvise calls, counted and never streamed: PC_MADVISE_INTERNAL
#   (the allocator: libsystem_malloc on Darwin; the C library and the stand-in libmtmalloc on Linux)
PC_CONTROLS = 0
PC_CONTROL_STRIDE = 8
PC_CONTROL_OTHER = 4
PC_CREATION = 16
# Calls made from inside another traced entry (xnu: vm_purgable_control -> mach_vm_purgable_control,
# vm_allocate -> mach_vm_allocate): PC_NESTED + fn, counted apart so each call counts once, outermost.
PC_NESTED = 24
PC_MADVISE_INTERNAL = 31
PC_MADVISE = 32
PC_MADVISE_SLOTS = 64
PURGEABLE_N_COUNTS = 256
ALLOCATOR_RANGES = 4           # [start, end) code ranges of the allocator's own madvise calls

# The reusable line's madvise advice values, per platform (the values are the platform's own);
# these are streamed with their stacks.
MADVISE_NAMES: dict[str, dict[int, str]] = {
    "darwin": {5: "MADV_FREE", 6: "MADV_ZERO_WIRED_PAGES", 7: "MADV_FREE_REUSABLE", 8: "MADV_FREE_REUSE",
               9: "MADV_CAN_REUSE", 10: "MADV_PAGEOUT"},
    "linux": {4: "MADV_DONTNEED", 8: "MADV_FREE", 20: "MADV_COLD", 21: "MADV_PAGEOUT"},
}

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
                                 CONFIG, LOGGER_EVENT, LEAK_BLOCK, LEAK_RANGE, LEAK_THREAD, LEAK_JOB, UNWIND_ROW, UNWIND_MODULE)
