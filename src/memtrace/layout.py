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
# The aggregate stream (the default): per-stack running totals, the composition at the peak, and
# at the end of the window the live table itself.  See "aggregates" below.
REC_AGG, REC_PEAK_HEAD, REC_PEAK, REC_LIVE = 4, 5, 6, 7
# On the wire only (agent to host), never in a capture: a stack whose outer frames are the stack
# defined just before it, as its own inner frames and a count of the shared ones.  The host
# expands it into a STACK record as the batch arrives (capture.StackTails).
REC_STACK_TAIL = 8

PAD_RECORD = Layout("MtPadRecord", (("type", "u8"), ("reserved", "u8"), ("reserved2", "u16"),
                                    ("length", "u32")))
# Followed by u64 frames[nframes + 256 * nframes_hi] (nframes_hi was a reserved 0 before stacks could
# be 256 frames deep: older captures read the same).
STACK_RECORD = Layout("MtStackRecord", (("type", "u8"), ("nframes", "u8"), ("nframes_hi", "u16"),
                                        ("stack_id", "u32")))
# Followed by u64 frames[nframes + 256 * nframes_hi]: the stack's innermost frames; its outermost
# `shared` frames are the outermost `shared` of stack parent_id, the stack defined just before it.
# STACK's head, then two fields (the core writes the head through either struct: core.c).
STACK_TAIL_RECORD = Layout("MtStackTailRecord", (*STACK_RECORD.fields, ("parent_id", "u32"), ("shared", "u32")))
ALLOC_RECORD = Layout("MtAllocRecord", (("type", "u8"), ("kind", "u8"), ("flags", "u16"), ("stack_id", "u32"),
                                        ("ptr", "u64"), ("size", "u64"), ("weight", "u64")))
FREE_RECORD = Layout("MtFreeRecord", (("type", "u8"), ("kind", "u8"), ("flags", "u16"), ("reserved", "u32"),
                                      ("ptr", "u64"), ("size", "u64")))
# A drained batch is a sequence of chunks: this header, then `length` bytes of one thread's records.
CHUNK_HEADER = Layout("MtChunkHeader", (("tid", "u32"), ("length", "u32")))

FLAG_LIVE, FLAG_SAMPLED, FLAG_TRUNCATED = 1, 2, 4
NO_STACK = 0xFFFFFFFF          # the record has no stack (below the stack threshold)
DROPPED_STACK = 0xFFFFFFFE     # it had one, but the stack table or the ring was full
NESTED_STACK = 0xFFFFFFFD      # made inside another hooked call (a signal handler): counted, stack skipped
# Pseudo stacks get aggregate rows after the stack table's own: NO_STACK, DROPPED_STACK, NESTED_STACK.
PSEUDO_STACKS = (NO_STACK, DROPPED_STACK, NESTED_STACK)

# Call kinds: the record's `kind` byte and the index into the per-kind counters.
KINDS: dict[str, int] = {
    "malloc": 0, "calloc": 1, "realloc": 2, "free": 3, "posix_memalign": 4, "memalign": 5,
    "aligned_alloc": 6, "valloc": 7, "pvalloc": 8, "reallocarray": 9, "vm_allocate": 12, "vm_deallocate": 13,
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
    "truncated_stacks": 48, "sampled": 49, "failed_allocs": 50,
    # Calls made while the thread was already inside a hook (a signal handler's malloc): counted by
    # kind, bytes and tier like any other, their stack skipped.  (Before the aggregate core this
    # counted calls that went uncounted.)
    "nested_calls": 51,
    "tracked_frees": 52, "records": 53, "record_bytes": 54,
    # Temporary allocations (heaptrack's definition): freed by the thread that made them with no
    # other allocation on that thread in between.
    "temp_calls": 55, "temp_bytes": 56,
    "nested_bytes": 57,
    # Calls the allocator made inside one of its own hooked entries (glibc's realloc(NULL, n) calls
    # malloc; memalign with a small alignment calls malloc): recognised and not counted twice.
    "nested_internal": 58,
    # Allocations memtrace's own code made on a thread while setting it up: not the target's, not counted.
    "own_calls": 59,
    # Nested calls inside a compound entry that could not all be checked against it (more than
    # NESTED_LOG of them in one call): the allocator's own among them may be counted twice.
    "nested_unreconciled": 60,
    # Darwin's logger path: VM events left out (each counted once, never silently), and the
    # realloc race (libmalloc logs a moved realloc after the old block is free again).
    "vm_allocator_own": 61, "vm_failed": 62, "vm_other_task": 63, "vm_untracked_frees": 64,
    "realloc_reuse_seen": 65,
    # A nested logger event (a signal handler's) whose live-table bucket the interrupted call held:
    # its release or claim was skipped (the entry stays as it was).
    "nested_table_busy": 66,
    # An outermost logger event whose live-table bucket stayed locked for ~a second (its holder
    # gone: a thread that did not survive a fork): skipped like a nested one, instead of hanging.
    "table_busy": 67,
    # Tracked bytes that reached a new high while the peak's lock could not be had (TinyCC builds
    # only; gcc builds raise the peak lock-free): the peak may be below the true high-water mark.
    "peak_missed": 68,
    # Calls of threads that found no thread slot of their own (more threads alive at once than
    # slots): counted exactly like any call, their stacks dropped (in dropped_stacks) and said.
    "unslotted_calls": 69,
    # The usable bytes memtrace's own thread (the agent's JavaScript: symbolization, its runtime)
    # allocated and freed through the hooked allocator: what calibration takes out of the
    # allocator's in-use figures (the target's heap is what they are about).
    "own_bytes": 70, "own_freed_bytes": 71,
}
# Allocation calls that returned NULL, by kind (also in C_CALLS + kind; never in bytes or tiers).
C_FAILED = 72                  # + kind
# Stack walks through unwind tables that reused frames of the thread's previous walk (cmodule/unwind.c,
# the frame cache): every word they reused was checked, the stack is the full walk's.
COUNTERS["frame_cache_walks"] = C_FAILED + N_KINDS
# Stacks taken from the thread's stack memo (cmodule/unwind.c): every word the walk had read was
# checked unchanged, so the stack is the walk's, without walking, hashing or looking it up again.
COUNTERS["stack_memo_hits"] = C_FAILED + N_KINDS + 1
# Solo mode (cmodule/core.c, mt_solo_joined): started when the target's first thread got a slot (its
# read-modify-writes on shared state then lock-free), ended when another did (1 each at most).
COUNTERS["solo_started"] = C_FAILED + N_KINDS + 2
COUNTERS["solo_ended"] = C_FAILED + N_KINDS + 3
N_COUNTERS = C_FAILED + N_KINDS + 4
# Captures made before the counters grew past 64 hold 64 of them: readers get the rest as 0
# (capture.py pads every counters list to N_COUNTERS).
MIN_COUNTERS = 64


# Where a per-kind or per-tier counter sits, by the kind's name (a KINDS key) or the tier's number
# (an index into TIER_MAX_BYTES): Python asks these instead of adding offsets to C_* itself, so the
# block arithmetic lives here only, beside the layout it describes.
def calls_at(kind: str) -> int:
    return C_CALLS + KINDS[kind]


def bytes_at(kind: str) -> int:
    return C_BYTES + KINDS[kind]


def failed_at(kind: str) -> int:
    return C_FAILED + KINDS[kind]


def tier_calls_at(tier: int) -> int:
    if not 0 <= tier < N_TIERS:
        raise IndexError(f"no size tier {tier} (there are {N_TIERS})")
    return C_TIER_CALLS + tier


def tier_bytes_at(tier: int) -> int:
    if not 0 <= tier < N_TIERS:
        raise IndexError(f"no size tier {tier} (there are {N_TIERS})")
    return C_TIER_BYTES + tier

# ---- the CModule core's tables, sized by the agent --------------------------------------------

# Frames a stack record holds at most (--frames up to MAX_FRAMES - 1, issue 21: at least 256); the
# hooks walk into an array of this many u64 on the target thread's stack (4 KiB).
MAX_FRAMES = 512
# The last frame of a stack cut at --frames: its innermost frames are kept, this marks the cut (so
# --frames is at most MAX_FRAMES - 1).
TRUNCATED_FRAME = 1
LIVE_WAYS = 8                  # blocks per live-table bucket
# Each thread's last stack walk through unwind tables, frame by frame (cmodule/unwind.c, "the frame
# cache"): a walk that reaches one of its frames unchanged copies the rest.  Levels held at most
# (a stack deeper than this is walked in full every time), and the bytes of one thread's cache: an
# 80-byte header, then the cached levels and the walk's own, 32 bytes each, then the cached levels'
# running stack hashes (8 bytes each) and the powers of the hash's base (FRAME_CACHE_LEVELS + 2); then
# the thread's unwind rules by return address (RULE_CACHE_ENTRIES (key, rule) pairs after their
# generation word: the MtSlot's own 128 missed on most of a compiler's frames).
FRAME_CACHE_LEVELS = 128
RULE_CACHE_ENTRIES = 2048
# Then the thread's stack memo (cmodule/unwind.c, "the stack memo"): whole walks by their first state
# (return address, stack pointer), each with the words it read, its frames, its hash and its stack id,
# so that an allocation from a call path seen before is checked instead of walked, hashed and looked
# up.  STACK_MEMO_ENTRIES of them in sets of STACK_MEMO_WAYS (a direct-mapped memo lost half of sqlite3's
# hits in one run of two, its hot paths colliding under that run's addresses; and every entry of one
# first state shares its set: CPython's PyUnicode_New at one depth under 5 or more hot Python-level
# paths thrashed a set of 4 in about one run of three, 390 K walks more, where 8 ways keep them), the
# least recently used of a set replaced; walks of at most STACK_MEMO_LEVELS levels (the default 64
# frames and a truncated stack's limit state).  First the use clock and the store policy's counts
# (24 bytes, which bring the tags to a cache line's start), the entries' tags (8 bytes each), their
# last uses (4 bytes each); then the entries, each a 64-byte header, 2 * LEVELS checked words' values
# (u64) and then their addresses (u16: words above the first state's frame), and LEVELS frames.
STACK_MEMO_ENTRIES = 32
STACK_MEMO_WAYS = 8
STACK_MEMO_LEVELS = 66
STACK_MEMO_BYTES = 64 + 2 * STACK_MEMO_LEVELS * (8 + 2) + 8 * STACK_MEMO_LEVELS
FRAME_CACHE_BYTES = (80 + 2 * FRAME_CACHE_LEVELS * 32 + 8 * FRAME_CACHE_LEVELS + 8 * (FRAME_CACHE_LEVELS + 2)
                     + 8 + 16 * RULE_CACHE_ENTRIES + 12 * STACK_MEMO_ENTRIES + 24
                     + STACK_MEMO_ENTRIES * STACK_MEMO_BYTES)
MAX_RINGS = 4096               # recycled-ring stack in MtGlobals
NESTED_LOG = 8                 # nested calls remembered per slot during a compound entry's real call
TOP_STACKS = 8                 # stacks by live bytes in each timeline sample
TOP_CHANGED_MAX = 4096         # rows noted as changed between two tops (drain.c); past it, a full walk
N_SITES = 256                  # call sites remembered for an entry point several names share
# Threads that are Frida's, never the target's (core.c, mt_own_thread): mt_own_threads is u64
# words -- [OWN_START_OFFSET] the offset of start_routine in glibc's struct pthread (0: unknown),
# [OWN_N_CODE] ranges of Frida's code, [OWN_N_TIDS] thread ids, then OWN_CODE_RANGES [start, end)
# pairs from OWN_CODE, then OWN_TIDS thread ids from OWN_TID.
OWN_CODE_RANGES = 16
OWN_TIDS = 256
OWN_START_OFFSET, OWN_N_CODE, OWN_N_TIDS, OWN_CODE = 0, 1, 2, 3
OWN_TID = OWN_CODE + 2 * OWN_CODE_RANGES
OWN_THREADS_WORDS = OWN_TID + OWN_TIDS

# A call site of an aliased entry (glibc's memalign is also aligned_alloc): the agent tells which name
# the caller used from the call instruction at `ra` and moves the site's counts to that kind.
SITE = Layout("MtSite", (("ra", "u64"), ("calls", "u64"), ("bytes", "u64"), ("kind", "u64")))

# The live table (cmodule/core.c, "the live-pointer table"): bucket b is LIVE_WAYS entries of 12 bytes
# (96: two cache lines at most), at mt_live_table + b * LIVE_WAYS * LIVE_ENTRY.size.  An entry's `key` is
# not the block's address but what the bucket does not already say of it: the number of the address
# window, plus one (0 = an empty way), above the address's low bits (core.c, mt_live_key) -- so that a
# bucket spans 256 bytes of heap: the table a heap touches is 0.375 bytes per byte of heap, and every page
# of it is a fresh page the target faults in (24-byte entries, 128-byte spans: 1.5; 16-byte: 0.5).
# `size` is the requested size (LIVE_SIZE_BIG: 4 GiB or more, the size in the core's side list);
# `stack_k` the block's stack id in its low LIVE_STACK_BITS bits (the pseudo stacks' ids as their low
# bits: they are the top of the 32-bit range, real ids stay far below 2^LIVE_STACK_BITS - 16) and the
# sampling multiplier k above them (0: an exact block; k >= 1: a sampled one standing for k *
# sample_interval bytes).  MtLiveMeta is an entry as the core's functions hand it over: its size whole,
# its stack id whole, its k (the birth tick the 16-byte entry held is gone: LIVE records say 0).
LIVE_ENTRY = Layout("MtLiveEntry", (("key", "u32"), ("size", "u32"), ("stack_k", "u32")))
LIVE_META = Layout("MtLiveMeta", (("size", "u64"), ("stack_id", "u32"), ("k", "u32")))
LIVE_STACK_BITS = 24
LIVE_STACK_IDS_MAX = 1 << 23    # the stack table's ids at most (runtime/core.js clamps stackTable to it)
LIVE_SIZE_BIG = 0xFFFFFFFF
LIVE_BIG_BLOCKS = 64            # blocks of 4 GiB or more the side list holds at once (more: untracked, counted)
# A key holds 32 bits: which of its alternates an entry is in (3 bits), the address bits above the
# bucket's own and the span's low bits -- so the table has at least 2^LIVE_MIN_BUCKET_BITS buckets,
# whatever is asked, for a 48-bit address space (Linux: 128 MiB reserved, resident only where a heap
# touches it); Darwin's (iOS addresses stay below 2^40, and its budget is small)
# 2^LIVE_MIN_BUCKET_BITS_DARWIN: its keys name addresses below 2^42.  A block past what a key names is
# not tracked, and counted (live_table_full).
LIVE_MIN_BUCKET_BITS = 20
LIVE_MIN_BUCKET_BITS_DARWIN = 13
# A key names addresses below about 2^(LIVE_KEY_ADDRESS_BITS + log2 buckets) (its window field is 29
# bits less the span's): the agent raises the bucket count past these minimums when the process
# already maps higher (runtime/core.js, liveBucketBitsFor -- a macOS heap near 2^47).
LIVE_KEY_ADDRESS_BITS = 29

# ---- aggregates: per-stack running totals kept by the core, one row per stack and lane ---------

# Each interned stack (and each pseudo stack) has AGG_LANES rows of AGG_STRIDE u64 counters; a thread
# adds to the row of its lane (slot index % lanes), so threads running at once rarely share a cache line.
# The drain sums the lanes.  "tracked" blocks are those in the live table: every block with a stack, and
# unstacked blocks of at least the live threshold.
AGG_FIELDS: dict[str, int] = {
    "allocs": 0,            # tracked allocations
    "bytes": 1,             # their sizes
    "frees": 2,             # tracked frees (live = allocs - frees)
    "freed_bytes": 3,       # their sizes (live bytes = bytes - freed_bytes)
    "temp": 4,              # temporary allocations among the tracked frees
    "temp_bytes": 5,
    "snap_epoch": 6,        # peak bookkeeping (not shipped in AGG records)
    "snap_bytes": 7,
    "snap_count": 8,
    "untracked": 9,         # allocations on this stack the live table had no room for (gross only)
    "untracked_bytes": 10,
    "sampled": 11,          # Poisson-sampled allocations (a subset of allocs + untracked)
    "sampled_bytes": 12,
    "sampled_weight": 13,   # the bytes they stand for
    "sampled_count_fp": 14,  # the allocations they stand for, x 256
    "extra_weight": 15,     # weight - size of tracked sampled blocks, at allocation
    "extra_weight_freed": 16,
    "failed": 17,           # allocation calls on this stack that returned NULL (never in the others)
}
AGG_STRIDE = 18             # = len(AGG_FIELDS): the fields of a row (as AGG records and the host count them)
# In the core a row is two: the fields every tracked allocation and free adds to (AGG_HOT: allocs ...
# snap_count) in mt_agg, and the rest (untracked, sampling, failed: a full table, --sample-bytes, a NULL
# return) in mt_agg_cold, read only for rows that ever had one (mt_agg_cold_rows).  Every stack's rows
# are pages the target faults in (cc1plus: ~60,000 stacks): 24 fields a row were 9.3 MB, and as many
# again for the drain's shipped copies; hot rows are 72 bytes, and the shipped copy of a hot row only
# its AGG_SHIPPED_HOT shipped fields.
AGG_HOT = 9
AGG_COLD = AGG_STRIDE - AGG_HOT
MAX_LANES = 64                 # lanes per row at most (runtime/core.js clamps the aggLanes option to it)
AGG_SNAP_FIELDS = frozenset({"snap_epoch", "snap_bytes", "snap_count"})
# The hot fields an AGG record carries (allocs ... temp_bytes, not the snapshot's): the first ones of a
# row, as the drain's shipped copy keeps them (cmodule/drain.c).
AGG_SHIPPED_HOT = sum(1 for k, i in AGG_FIELDS.items() if i < AGG_HOT and k not in AGG_SNAP_FIELDS)
assert all(i < AGG_SHIPPED_HOT for k, i in AGG_FIELDS.items() if i < AGG_HOT and k not in AGG_SNAP_FIELDS)
# An AGG record carries the fields of its mask (bit = field index), each the stack's running total.
AGG_SHIPPED_MASK = sum(1 << i for k, i in AGG_FIELDS.items() if k not in AGG_SNAP_FIELDS)
AGG_FP_SHIFT = 8            # sampled_count_fp's fixed point

# Followed by u64 values[nvalues], in field order.
AGG_RECORD = Layout("MtAggRecord", (("type", "u8"), ("nvalues", "u8"), ("reserved", "u16"), ("stack_id", "u32"),
                                    ("mask", "u32"), ("reserved2", "u32")))
# The composition at the peak: a head, then `nstacks` PEAK records (stacks with tracked bytes at the peak).
PEAK_HEAD_RECORD = Layout("MtPeakHeadRecord", (("type", "u8"), ("reserved", "u8"), ("reserved2", "u16"),
                                               ("nstacks", "u32"), ("epoch", "u64"), ("bytes", "u64"),
                                               ("count", "u64"), ("t_us", "u64")))
PEAK_RECORD = Layout("MtPeakRecord", (("type", "u8"), ("reserved", "u8"), ("reserved2", "u16"), ("stack_id", "u32"),
                                      ("bytes", "u64"), ("count", "u64")))
# The live table at the end of the window, one record per tracked block still live (`tick`: 0 since the
# table's 12-byte entries, which keep no birth tick; the field stays for the format).
LIVE_RECORD = Layout("MtLiveRecord", (("type", "u8"), ("k", "u8"), ("reserved", "u16"), ("stack_id", "u32"),
                                      ("ptr", "u64"), ("size", "u64"), ("tick", "u32"), ("reserved2", "u32")))

# What one mt_drain call tells the agent besides its bytes (C writes, core.js reads).
DRAIN_INFO = Layout("MtDrainInfo", (
    ("more", "u64"),             # the buffer filled up: call again
    ("now_us", "u64"),           # the core's clock (g_get_monotonic_time) at the drain
    ("tracked_bytes", "u64"),    # bytes in tracked blocks now
    ("tracked_blocks", "u64"),
    ("peak_bytes", "u64"),       # their high-water mark
    ("peak_epoch", "u64"),
    ("peak_t_us", "u64"),
    ("stacks", "u64"),           # stacks interned
    ("n_top", "u64"),            # entries in mt_top: (stack_id, live bytes) pairs, largest first
    ("tick", "u64"),             # drains so far
    ("live_dumped", "u64"),      # live-table entries written as LIVE records so far (final drain)
    ("live_done", "u64"),        # 1 once the final drain has written the whole live table
))

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
    ("agg_lanes", "u64"),          # aggregate rows per stack, power of two
    ("events", "u64"),             # 1: also stream one record per tracked event (--events)
    ("defs_size", "u64"),          # bytes of the stack-definition buffer, power of two
    ("track_min", "u64"),          # min(live_threshold, stack_threshold), 0 while sampling: smaller blocks are only counted
    ("chunk_min", "u64"),          # glibc: a block whose chunk (the size word before it) is smaller is untracked; 0: unused
    ("live_bits", "u64"),          # log2 of the live buckets (live_mask + 1), >= LIVE_MIN_BUCKET_BITS
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

# ---- stopping the world (cmodule/world.c, agents/runtime/world.js) ---------------------------------

# Every thread of the target but the caller and Frida's own, held by a ptrace helper (Linux): for the
# leak scan's roots, and around every patch of a hooked function's first bytes.
# process.c's descriptor guard (fork/exec): the bitmap covers descriptors below FD_GUARD_MAX, and
# at most FD_RANGES ranges of them are guarded (runtime/process.js sizes and fills both).
FD_GUARD_MAX = 65536
FD_RANGES = 6
# mt_fd_state's word counting dup2/dup3 calls onto a guarded descriptor, refused with EBUSY ([0]
# closes kept open, [1] ranges of Frida's code, then FD_RANGES [lo, hi) pairs).
FD_DUP_REFUSED = 2 + 2 * FD_RANGES
# Darwin's VM user tag of thread stacks (VM_MEMORY_STACK): the leak scan's roots.  DEVICE-UNVERIFIED
VM_MEMORY_STACK = 30
WORLD_REGS = 34                # u64 registers kept per stopped thread (x86-64 and arm64 both fit)
# Added to a stack word's `where` (mt_world_thread_ref: WORLD_REGS + its offset from sp) when a
# signal frame lies below it: a word of an interrupted context, where a pc after no call is live.
WORLD_WHERE_ABOVE_SIGNAL = 1 << 48
WORLD_THREAD = Layout("MtWorldThread", (("tid", "u64"), ("sp", "u64")))   # its registers: MtWorld.regs
# MtWorld.state, written by the stopper and by the helper process.
WORLD_STATES: dict[str, int] = {"idle": 0, "stopping": 1, "stopped": 2, "resume": 3, "resumed": 4, "failed": 5}
# MtWorld.error: why the world, or a thread, could not be stopped (C: MT_WORLD_E_ATTACH ...), and
# what each code means.
WORLD_STOP_TIMEOUT_US = 10_000_000    # how long stopping may take when MtWorld.stop_timeout_us is 0
WORLD_ERROR_CODES: dict[str, int] = {"attach": 1, "clone": 2, "timeout": 3, "seccomp": 4, "inside": 5}
WORLD_ERRORS: dict[int, str] = {
    1: "a thread could not be attached (Linux: ptrace) or suspended (Darwin)", 2: "the ptrace helper could not be made",
    3: "the world was not stopped in time (Linux: the ptrace helper; Darwin: thread_suspend)",
    4: "a seccomp filter is installed (a non-thread clone could kill the process)",
    5: "a thread stayed inside the bytes to be patched, or could not be stopped",
}
WORLD = Layout("MtWorld", (
    ("state", "u64"),
    ("tgid", "u64"),               # the process id (the helper reads /proc/<tgid>/task)
    ("self_tid", "u64"),           # the stopping thread: never stopped
    ("skip", "u64"), ("n_skip", "u64"),                 # u64 thread ids never stopped (Frida's own)
    ("threads", "u64"), ("threads_cap", "u64"),         # MtWorldThread[]
    ("regs", "u64"),               # u64[threads_cap * WORLD_REGS]: each stopped thread's registers
    ("n_threads", "u64"),          # stopped
    ("n_failed", "u64"),           # could not be stopped
    ("tracer_stack", "u64"), ("tracer_stack_size", "u64"),
    ("tracer_pid", "u64"),
    ("error", "u64"),              # WORLD_ERRORS
    ("stop_timeout_us", "u64"),    # how long stopping may take (0: WORLD_STOP_TIMEOUT_US)
    ("abandoned", "u64"),          # the stopper gave up waiting: the helper lets go at once
    # A program at memtrace's hold point: its main thread waits in the hold library, where nothing
    # of Frida's runs; while its pc is in [hold_code_lo, hold_code_hi) its stack (ld.so's frames,
    # with whatever they kept) is not searched for Frida's code or the module's (0: no such thread).
    ("hold_tid", "u64"), ("hold_code_lo", "u64"), ("hold_code_hi", "u64"),
    # The signal-return code a handler returns into ([start, end) u64 pairs; 0 of them: none known):
    # the strict stop then counts a stack word into Frida's code only where it can be a return
    # address, below any signal frame (cmodule/world.c mt_world_thread_ref).
    ("signal_returns", "u64"), ("n_signal_returns", "u64"),
))

# ---- malloc --leaks: the conservative reachability scan (cmodule/leaks.c, agents/leaks.js) --------

# One candidate block, sorted by address for the scan: a tracked live block (its requested size and
# stack from the live table), or an in-use chunk the allocator walk found that the table does not
# hold (allocated before tracing: its usable size, no stack).
LEAK_BLOCK = Layout("MtLeakBlock", (("ptr", "u64"), ("size", "u64"), ("stack_id", "u32"), ("flags", "u32")))
LEAK_BLOCK_UNTRACKED = 1       # found by the allocator walk, not in the live table: allocated before tracing
# The by-stack key the result gives blocks allocated before tracing (no stack; beyond any stack id).
LEAK_BEFORE_TRACING_KEY = 1 << 32
LEAK_BLOCK_IN_HEAP = 2         # inside a walked heap segment: read in place (mapped while the world is stopped)
# A block's verdict (the marks array, one byte per block), valgrind's categories.
LEAK_MARKS: dict[str, int] = {"definitely_lost": 0, "possibly_lost": 1, "reachable": 2, "indirectly_lost": 3,
                               "frida_own": 4}   # reached only from Frida's threads' TLS: the agent's, not the app's
# One root range; flags say how the scan treats it.  live_from: a stack-shaped range no stopped
# thread runs on (an exited thread's cached stack) is a root only from there up (glibc's thread
# control block and static TLS, which hold the thread's DTV); 0 = not a root at all.
LEAK_RANGE = Layout("MtLeakRange", (("base", "u64"), ("size", "u64"), ("flags", "u64"), ("live_from", "u64")))
LEAK_RANGE_STACK = 1           # shaped like a thread stack: scanned from a stopped thread's sp, else skipped
LEAK_RANGE_FRIDA = 2           # a Frida thread's stack (listed last): what only it reaches is Frida's own
# One piece of the allocator's own memory (found while the world is stopped): [base, base + size)
# is never a root; its chunks, from `first` to `end`, are walked for candidates (first = 0: not walked,
# e.g. glibc's main arena state in libc's data).
LEAK_SEG = Layout("MtLeakSeg", (("base", "u64"), ("size", "u64"), ("first", "u64"), ("end", "u64")))
# glibc's malloc, as the agent finds it (agents/leaks.js glibcLayout; 0 fields: not glibc or not found).
LEAK_GLIBC = Layout("MtLeakGlibc", (
    ("main_arena", "u64"),         # &main_arena (struct malloc_state) in libc's data
    ("heap_start", "u64"), ("heap_end", "u64"),   # the [heap] mapping: the main arena's sbrk heap
    ("mstate_size", "u64"),        # sizeof (struct malloc_state)
    ("top_offset", "u64"), ("next_offset", "u64"), ("fastbins_offset", "u64"), ("n_fastbins", "u64"),
    ("heap_max", "u64"),           # HEAP_MAX_SIZE: a non-main heap starts aligned to it
    ("tcache_bins", "u64"),        # TCACHE_MAX_BINS (u16 counts then pointers: glibc >= 2.30); 0 = no tcache walk
    ("safe_linking", "u64"),       # free-list pointers are PROTECT_PTR-mangled (glibc >= 2.32)
))
LEAK_REGS = 34                 # u64 registers kept per stopped thread (x86-64 and arm64 both fit)
LEAK_THREAD = Layout("MtLeakThread", (("tid", "u64"), ("sp", "u64")))   # its registers: MtLeakJob.regs
# Scan states (MtLeakJob.state), written by the scanner and by the Linux tracer process.
LEAK_STATES: dict[str, int] = {"idle": 0, "stopping": 1, "stopped": 2, "resume": 3, "resumed": 4, "failed": 5}
# Starts with an MtWorld (WORLD, field for field): leaks.c hands the job to cmodule/world.c.
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
    ("stop_timeout_us", "u64"),    # how long stopping may take: the scan's whole budget
    ("abandoned", "u64"),          # as MtWorld's
    ("hold_tid", "u64"), ("hold_code_lo", "u64"), ("hold_code_hi", "u64"),     # as MtWorld's (0 here)
    ("signal_returns", "u64"), ("n_signal_returns", "u64"),                     # as MtWorld's (0 here)
    ("ranges", "u64"), ("n_ranges", "u64"),             # MtLeakRange[]
    ("blocks", "u64"), ("blocks_cap", "u64"), ("n_blocks", "u64"), ("blocks_total", "u64"),
    ("marks", "u64"),              # u8 per block: its LEAK_MARKS verdict
    ("worklist", "u64"), ("n_work", "u64"),             # u32 block indexes to scan (2 per block at most)
    ("scratch", "u64"), ("scratch_size", "u64"),
    ("phase", "u64"),              # 0 registers, 1 roots, 2 cliques of the unreached, 3 done
    ("range_index", "u64"), ("range_offset", "u64"),
    ("root_bytes", "u64"),         # root bytes read
    ("block_bytes", "u64"),        # bytes of reachable blocks read
    # bytes not scanned, by reason: stacks of no stopped thread (exited threads' cached stacks,
    # Frida's own), the scanning thread's stack, unreadable memory
    ("skip_stack", "u64"), ("skip_own", "u64"), ("skip_unreadable", "u64"),
    ("undecided_blocks", "u64"),   # live entries the Darwin logger path holds undecided (not candidates)
    # ---- every block a candidate, only live memory a root (issue 18) ----
    ("glibc", "u64"),              # MtLeakGlibc * (0: no allocator walk)
    ("segs", "u64"), ("segs_cap", "u64"), ("n_segs", "u64"),     # MtLeakSeg[], sorted by base
    ("freed", "u64"), ("freed_cap", "u64"), ("n_freed", "u64"),  # u64 chunk addresses on tcache/fastbin lists
    ("n_tracked", "u64"),          # candidates from the live table (the rest: found by the walk)
    ("n_untracked", "u64"),        # in-use chunks the live table does not hold: allocated before tracing
    ("n_allocator_meta", "u64"),   # in-use chunks that are the allocator's own (tcache structures)
    ("walk_errors", "u64"),        # heap walks that stopped at an inconsistent chunk header
    ("walk_bytes_unwalked", "u64"),  # bytes of heap those walks did not reach
    ("freed_over_capacity", "u64"),  # free-list entries beyond the freed array (their chunks may count as blocks)
    ("pagemap_fd", "u64"),         # Linux: /proc/self/pagemap, or ~0: only resident pages are read
    ("skip_unresident", "u64"),    # root or block bytes in pages never touched (or swapped out): not read
    ("skip_dead_frames", "u64"),   # bytes of exited threads' cached stacks below their TLS
    ("interior_guard", "u64"),     # 16: ignore words aimed at a next chunk's header (no arena found)
    ("leader", "u64"),             # the definitely lost block whose clique is being marked
    ("clique_index", "u64"),       # the next block the categorising pass looks at
    ("page_size", "u64"),          # the residency check's page (Linux pagemap: 4 KiB; Darwin arm64: 16 KiB)
    ("ptr_mask", "u64"),           # the bits of a word that address memory (arm64e: PAC signatures stripped)
    ("budget_us", "u64"),          # mt_leak_scan_all: time the scan may take once the world is stopped
    ("in_frida", "u64"),           # the roots being scanned are Frida's (LEAK_RANGE_FRIDA): the app's are done
    ("stop_us", "u64"), ("collect_us", "u64"), ("scan_us", "u64"),   # mt_leak_scan_all's times
    # ---- the scan at exit (x86-64 Linux): the exiting thread read from its call to exit ----
    ("exit_fn", "u64"), ("exit_fn2", "u64"),   # exit and _exit (0: not a scan at exit)
    ("exit_frames", "u64"),        # bytes of exiting threads' frames below their call to exit, not read
    ("exit_calls", "u64"),         # threads whose stack was read from their call to exit
    ("exit_contexts", "u64"),      # ... and whose registers at that call were found (Frida's saved context)
    # what finding them cost, the world stopped: threads searched, stack words looked at, reads
    # (process_vm_readv calls) made, and microseconds
    ("exit_threads", "u64"), ("exit_words", "u64"), ("exit_reads", "u64"), ("exit_us", "u64"),
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
# The events the C listeners stream (their transitions, creations, reusable-line madvise calls) that
# the agent's flush could not take in time: the ring below was full.  Counted, never silent.
PC_EVENTS_DROPPED = 160
PURGEABLE_N_COUNTS = 256
# The C listeners never enter JavaScript: each streamed call is one slot of a ring in the agent's
# memory (PURG_EVENT, then its frames: PURG_SLOT_BYTES a slot), claimed, written and marked ready
# by the target's thread with atomic adds only, and drained by the agent's flush on its own thread
# (cmodule/purgeable.c says how).  A slot is free at 0; its writer holds it at 1; ready at
# PURG_READY + 1.  A full ring drops the call's event (PC_EVENTS_DROPPED), never waits.
PURG_RING_SLOTS = 1024         # a power of two
PURG_FRAMES = 16               # caller frames per event, walked in C
PURG_READY = 0x10000
PURG_KIND_SET, PURG_KIND_CREATE, PURG_KIND_MADVISE = 0, 1, 2
PURG_EVENT = Layout("MtPurgEvent", (
    ("state", "s32"), ("kind", "s32"), ("fn", "s32"), ("control", "s32"), ("new_state", "s32"),
    ("old_state", "s32"), ("kr", "s32"), ("flags", "s32"), ("advice", "s32"), ("nframes", "s32"),
    ("ticket", "u64"), ("tid", "u64"), ("addr", "u64"), ("size", "u64"),
))
PURG_SLOT_BYTES = PURG_EVENT.size + 8 * PURG_FRAMES    # the event, then its frames (u64 each)
ALLOCATOR_RANGES = 4           # [start, end) code ranges of the allocator's own madvise calls

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
    ("agent_memory", "u64"),       # the agent's memory as a fork child inherits it (process.js), or 0
))
# What the agent's memory is, as a fork child inherits it (agents/runtime/process.js): a header,
# then two tables, each an AGENT_MEMORY_TABLE head and AGENT_MEMORY_RANGES (base, size) pairs,
# written by the parent's agent in turn (`current` names the one written last, whole, its head
# with it); the child's new agent reads the one current at the fork.
AGENT_MEMORY_RANGES = 4096
AGENT_MEMORY = Layout("MtAgentMemory", (
    ("current", "u32"),            # 0 or 1: the table written last, whole
    ("cap", "u32"),                # AGENT_MEMORY_RANGES
    ("refreshes", "u32"),          # tables written since the start
    ("reserved", "u32"),
))
AGENT_MEMORY_TABLE = Layout("MtAgentMemoryTable", (
    ("n", "u32"),                  # ranges in the table
    ("truncated", "u32"),          # 1: more ranges than a table holds (the rest stay roots)
    ("t_ms", "u64"),               # when it was written (wall clock, ms)
))

# ---- Darwin: task_info(TASK_VM_INFO) ----------------------------------------------------------

# struct task_vm_info (xnu osfmk/mach/task_info.h, #pragma pack(4)): the fields memtrace reads,
# at their byte offsets.  The kernel fills as many revisions as the count allows and writes back
# the count it filled; a field past it is unknown.  The Linux stand-in (demo/darwin/mtdarwin.c)
# writes the same offsets (tests/unit/test_layout.py holds it to them).
# DEVICE-UNVERIFIED: written from xnu's headers.
TASK_VM_INFO_FLAVOR = 22
TASK_VM_INFO_BUFFER = 512      # bytes: larger than any revision so far
# The count passed in: exactly TASK_VM_INFO_REV7_COUNT, the newest revision memtrace knows (rev3
# ends at limit_bytes_remaining's offset 336 = 84 words; rev4 +2, rev5 decompressions +1, rev6
# ledger_swapins +2, rev7 the two neural totals +4).  A larger count makes xnu log "possibly
# invalid task_info_count" on every call; an older kernel fills less and says so in the count.
TASK_VM_INFO_COUNT = 93
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
C_STRUCTS: tuple[Layout, ...] = (PAD_RECORD, STACK_RECORD, STACK_TAIL_RECORD, ALLOC_RECORD, FREE_RECORD, CHUNK_HEADER,
                                 CONFIG, LOGGER_EVENT, LIVE_ENTRY, LIVE_META, AGG_RECORD, PEAK_HEAD_RECORD, PEAK_RECORD,
                                 LIVE_RECORD, DRAIN_INFO, SITE, LEAK_BLOCK, LEAK_RANGE, LEAK_THREAD, LEAK_SEG,
                                 LEAK_GLIBC, WORLD_THREAD, WORLD, LEAK_JOB,
                                 UNWIND_ROW, UNWIND_MODULE, PROC, PURG_EVENT)

# ---- the generated C header's #defines ---------------------------------------------------------

# Named sets whose members C uses, and the prefix each member gets (KINDS["malloc"] -> MT_K_MALLOC;
# a tuple's members are numbered in order: PURGEABLE_ENTRIES[0] -> MT_PF_VM_PURGABLE_CONTROL).
C_ENUMS: dict[str, str] = {
    "KINDS": "K", "COUNTERS": "C", "AGG_FIELDS": "A", "LOGGER_OPS": "OP", "PURGEABLE_ENTRIES": "PF",
    "PURGABLE_CONTROLS": "PURGABLE", "LEAK_STATES": "LEAK", "LEAK_MARKS": "LEAK", "WORLD_STATES": "WORLD", "FORK_ORIGINS": "ORIGIN",
    "WORLD_ERROR_CODES": "WORLD_E",
}
# Values C needs that are not a constant of their own here.
C_DERIVED: dict[str, int] = {"N_PSEUDO_STACKS": len(PSEUDO_STACKS)}


def c_defines() -> list[tuple[str, int]]:
    """Every ``#define MT_...`` of the C header, generated: each integer constant of this module
    (MT_ + its name), each member of the C_ENUMS sets, the size tiers' bounds (MT_TIER_MAX_i) and
    C_DERIVED -- nothing written twice by hand.  Order: this module's."""
    out: list[tuple[str, int]] = []
    for name, value in globals().items():
        if not name.isupper() or name.startswith("_"):
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            out.append((f"MT_{name}", value))
        elif name in C_ENUMS:
            members = value.items() if isinstance(value, dict) else ((k, i) for i, k in enumerate(value))
            out += [(f"MT_{C_ENUMS[name]}_{k.upper()}", int(v)) for k, v in members]
        elif name == "TIER_MAX_BYTES":
            out += [(f"MT_TIER_MAX_{i}", v) for i, v in enumerate(TIER_MAX_BYTES) if v is not None]
    out += [(f"MT_{k}", v) for k, v in C_DERIVED.items()]
    return out
