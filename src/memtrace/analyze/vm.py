"""Darwin's VM line in a malloc capture (``__syscall_logger`` events), kept apart from the malloc family.

The agent records the task's own VM regions (``mach_vm_allocate``, ``mach_vm_map``, ``mmap``) as
ALLOC records of the VM kinds with the VM user tag in flags bits 8..15, and their deallocations as
FREE records; it leaves out libmalloc's own regions (tags 1..13: their bytes are the malloc calls
they serve), failed calls and other tasks' VM, counting each.  None of it is in the malloc
family's gross bytes, tiers, stacks or live set: this module folds those records by tag.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

from memtrace import layout

VM_KINDS = layout.VM_KINDS
FREE_KIND = layout.KINDS["vm_deallocate"]
# xnu osfmk/mach/vm_statistics.h VM_MEMORY_* (the tags an app's own VM commonly carries).
TAG_NAMES = {
    0: "untagged", 20: "Mach message", 21: "IOKit", 30: "stack", 33: "dylib", 40: "AppKit", 41: "Foundation",
    42: "CoreGraphics", 51: "CoreAnimation", 52: "CG image", 53: "WebKit malloc", 54: "CG raster data",
    60: "dyld", 62: "SQLite page cache", 63: "WebAssembly", 64: "JS JIT code", 67: "CoreImage",
    70: "ImageIO", 75: "libdispatch", 86: "SceneKit", 88: "IOSurface", 89: "libnetwork", 90: "audio",
    91: "video bitstream", 94: "CoreMedia memory pool", 99: "IOAccelerator",
}
LEFT_OUT = ("vm_allocator_own", "vm_failed", "vm_other_task", "vm_untracked_frees")


def tag_of(flags: int) -> int:
    return (flags >> layout.FLAG_TAG_SHIFT) & 0xFF


def is_vm(kind: int) -> bool:
    return kind in VM_KINDS


class TagStats(Struct):
    calls: int = 0
    bytes: int = 0
    live_count: int = 0
    live_bytes: int = 0
    kinds: set[str] = msgspec.field(default_factory=set)


class VmFold(Struct):
    """ALLOC/FREE records of the VM kinds, one at a time (the malloc fold hands them over)."""

    by_tag: dict[int, TagStats] = msgspec.field(default_factory=dict)
    live: dict[int, tuple[int, int]] = msgspec.field(default_factory=dict)     # ptr -> (tag, size)
    early: dict[int, int] = msgspec.field(default_factory=dict)               # frees seen before their alloc
    frees: int = 0
    freed_bytes: int = 0

    def alloc(self, kind: int, flags: int, ptr: int, size: int) -> None:
        tag = tag_of(flags)
        st = self.by_tag.setdefault(tag, TagStats())
        st.calls += 1
        st.bytes += size
        st.kinds.add(layout_kind_name(kind))
        if not flags & layout.FLAG_LIVE:
            return
        if self.early.get(ptr):
            self.early[ptr] -= 1
            return
        self.live[ptr] = (tag, size)

    def free(self, ptr: int, size: int) -> None:
        self.frees += 1
        self.freed_bytes += size
        if self.live.pop(ptr, None) is None:
            self.early[ptr] = self.early.get(ptr, 0) + 1

    def to_json(self, counters: list[int]) -> dict[str, Any]:
        for tag, size in self.live.values():
            st = self.by_tag.setdefault(tag, TagStats())
            st.live_count += 1
            st.live_bytes += size
        rows: list[dict[str, Any]] = [{"tag": tag, "name": TAG_NAMES.get(tag, f"VM_MEMORY_{tag}"), "calls": st.calls, "bytes": st.bytes,
                 "kinds": sorted(st.kinds), "live_count": st.live_count, "live_bytes": st.live_bytes}
                for tag, st in self.by_tag.items()]
        rows.sort(key=lambda r: (-r["bytes"], r["tag"]))
        kinds = [name for name, k in layout.KINDS.items() if k in VM_KINDS]    # by number, as KINDS is
        return {
            "calls": {name: counters[layout.calls_at(name)] for name in kinds},
            "bytes": {name: counters[layout.bytes_at(name)] for name in kinds},
            "by_tag": rows,
            "live": {"count": len(self.live), "bytes": sum(size for _, size in self.live.values())},
            "left_out": {name.removeprefix("vm_"): counters[layout.COUNTERS[name]] for name in LEFT_OUT},
        }


def layout_kind_name(kind: int) -> str:
    for name, number in layout.KINDS.items():
        if number == kind:
            return name
    return str(kind)
