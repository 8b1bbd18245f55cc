"""Unwind tables (memtrace.symbols.cfi): Breakpad CFI rules folded into rows, the index, the disk
cache, which modules need a table, and cmodule/unwind.c's lookup compiled by gcc against the same
rows (every answer checked against a plain binary search in Python)."""

from __future__ import annotations

import bisect
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from memtrace import agentbuild, layout
from memtrace.symbols.cfi import (
    ROW,
    TableCache,
    UnwindFeed,
    build_table,
    make_table,
    row_index,
    rows_from_breakpad,
)

ROOT = Path(__file__).resolve().parents[2]
SP, FP, NONE = layout.UNWIND_CFA_SP, layout.UNWIND_CFA_FP, layout.UNWIND_NONE

# __strdup in glibc 2.36 (push rbp; push rbx; sub 8; ... epilogue), then a frame-pointer
# function, then __longjmp's register-based CFA, then a function after a gap.
BREAKPAD = """\
STACK CFI INIT 9e990 39 .cfa: $rsp 8 + .ra: .cfa -8 + ^
STACK CFI 9e991 .cfa: $rsp 16 + $rbp: .cfa -16 + ^
STACK CFI 9e992 .cfa: $rsp 24 + $rbx: .cfa -24 + ^
STACK CFI 9e999 .cfa: $rsp 32 +
STACK CFI 9e9b3 .cfa: $rsp 24 +
STACK CFI INIT 9e9d0 20 .cfa: $rsp 8 + .ra: .cfa -8 + ^
STACK CFI 9e9d1 .cfa: $rsp 16 + $rbp: .cfa -16 + ^
STACK CFI 9e9d4 .cfa: $rbp 16 +
STACK CFI 9e9ef .cfa: $rsp 8 +
STACK CFI INIT 9e9f0 10 .cfa: $rsp 8 + .ra: .cfa -8 + ^
STACK CFI 9e9f4 .cfa: $rdi 48 + .ra: $rdx
STACK CFI INIT 9ea40 8 .cfa: $rsp 8 + .ra: .cfa -8 + ^
"""


def test_rules_fold_into_rows_with_gaps_and_stops() -> None:
    rows, functions, share = rows_from_breakpad(BREAKPAD)
    assert rows == [
        (0x9E990, SP, 8, 0), (0x9E991, SP, 16, 2), (0x9E992, SP, 24, 2), (0x9E999, SP, 32, 2),
        (0x9E9B3, SP, 24, 2),
        (0x9E9C9, NONE, 0, 0),                   # __strdup ends at +0x39; the next starts at 9e9d0
        (0x9E9D0, SP, 8, 0), (0x9E9D1, SP, 16, 2), (0x9E9D4, FP, 16, 2), (0x9E9EF, SP, 8, 2),
        (0x9E9F0, SP, 8, 0), (0x9E9F4, NONE, 0, 0),   # a CFA from %rdi: the walk stops there
        (0x9EA40, SP, 8, 0), (0x9EA48, NONE, 0, 0),
    ]
    assert functions == 4
    # Two functions move their CFA from the stack pointer's (__longjmp's is another register's):
    # one of them defines it from the frame pointer.
    assert share == pytest.approx(1 / 2)


def test_index_names_the_row_in_force_at_each_block() -> None:
    starts = [0x10, 0x20, 0x130, 0x135, 0x400]
    assert row_index(starts) == [0, 1, 3, 3, 4]   # blocks of 256: 0x000, 0x100, 0x200, 0x300, 0x400
    assert row_index([]) == []


def test_table_cache_reads_back_what_it_wrote(tmp_path: Path) -> None:
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not libc.exists():
        pytest.skip("needs an x86-64 glibc")
    built = TableCache(tmp_path).get(str(libc))
    assert built is not None and built.build_s > 0
    again = TableCache(tmp_path).get(str(libc))         # a new run: from the disk cache
    assert again is not None and again.build_s == 0.0
    assert (again.rows, again.index, again.functions) == (built.rows, built.index, built.functions)
    (cached,) = tmp_path.glob("unwind-*.bin")
    cached.write_bytes(cached.read_bytes()[:-3])        # torn: rebuilt, not trusted
    assert TableCache(tmp_path).get(str(libc)).build_s > 0   # type: ignore[union-attr]


def test_which_modules_need_a_table(tmp_path: Path) -> None:
    src = ROOT / "tests" / "programs" / "libc_callers.c"
    with_fp, without_fp = tmp_path / "fp", tmp_path / "nofp"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(with_fp), str(src)], check=True)
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(without_fp), str(src)], check=True)
    assert build_table(with_fp).keeps_frame_pointers            # type: ignore[union-attr]
    assert not build_table(without_fp).keeps_frame_pointers     # type: ignore[union-attr]
    (tmp_path / "text").write_text("not a binary\n")
    assert build_table(tmp_path / "text") is None


def test_feed_gives_the_agent_tables_only_where_frame_pointers_are_missing(tmp_path: Path) -> None:
    src = ROOT / "tests" / "programs" / "libc_callers.c"
    with_fp, without_fp = tmp_path / "fp", tmp_path / "nofp"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(with_fp), str(src)], check=True)
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(without_fp), str(src)], check=True)
    offered = [{"name": "fp", "path": str(with_fp), "base": "0x1000", "size": 8192},
               {"name": "nofp", "path": str(without_fp), "base": "0x100000", "size": 8192},
               {"name": "gone", "path": str(tmp_path / "missing.so"), "base": "0x200000", "size": 4096}]
    calls: list[tuple[str, tuple]] = []

    def rpc(method: str, *args: object) -> object:
        calls.append((method, args))
        return offered if method == "unwindModules" else {"loaded": 1}

    feed = UnwindFeed(TableCache(None))
    assert feed.feed(rpc) == 1
    (_, (entries, data)) = calls[1]
    table = build_table(without_fp)
    assert table is not None
    assert entries == [
        {"name": "nofp", "base": "0x100000", "size": 8192, "rows": table.n_rows, "index": table.n_index},
        # Listed without rows: the walk knows these keep frame pointers (or have no rules to give).
        {"name": "fp", "base": "0x1000", "size": 8192, "rows": 0, "index": 0},
        {"name": "gone", "base": "0x200000", "size": 4096, "rows": 0, "index": 0},
    ]
    assert data == table.rows + table.index
    info = feed.info()
    assert (info["tables"], info["frame_pointers"], info["no_table"]) == (["nofp"], ["fp"], ["gone"])


HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#define TRUE 1
#define FALSE 0
#define MT_LINUX 1
volatile guint64 mt_unwind_count;
MtUnwindModule mt_unwind_modules[MT_MAX_UNWIND_MODULES];
#include "unwind.c"
/* argv: rows file, index file, then offsets; prints the row number in force (-1: none). */
int main (int argc, char ** argv)
{
  static char rows[1 << 22], index[1 << 22];
  FILE * f = fopen (argv[1], "rb"), * g = fopen (argv[2], "rb");
  size_t nr = fread (rows, 1, sizeof rows, f), ni = fread (index, 1, sizeof index, g);
  MtUnwindModule * m = &mt_unwind_modules[0];
  m->start = 0x400000; m->end = 0x400000 + 0x10000000; m->rows = (guint64) rows; m->index = (guint64) index;
  m->n_rows = nr / sizeof (MtUnwindRow); m->n_index = ni / 4;
  mt_unwind_count = 1;
  for (int i = 3; i < argc; i++) {
    guint64 pc = 0x400000 + strtoull (argv[i], NULL, 0);
    const MtUnwindModule * hit = mt_unwind_module (pc);
    const MtUnwindRow * r = hit ? mt_unwind_row (hit, pc - hit->start) : NULL;
    printf ("%ld\n", r ? (long) (r - (const MtUnwindRow *) rows) : -1L);
  }
  return 0;
}
"""


@pytest.mark.skipif(sys.platform != "linux" or shutil.which("gcc") is None, reason="needs gcc on Linux")
def test_c_lookup_agrees_with_a_binary_search(tmp_path: Path) -> None:
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not libc.exists():
        pytest.skip("needs an x86-64 glibc")
    table = build_table(libc)
    assert table is not None and table.n_rows > 10000
    glib = "typedef unsigned char guint8; typedef unsigned short guint16; typedef unsigned int guint32;\n" \
           "typedef int gint; typedef int gint32; typedef unsigned long long guint64; typedef long long gint64;\n" \
           "typedef unsigned long gsize; typedef unsigned int guint; typedef int gboolean;\n"
    (tmp_path / "glib.h").write_text(glib)
    (tmp_path / "unwind.c").write_text((ROOT / "cmodule" / "unwind.c").read_text())
    (tmp_path / "probe.c").write_text(agentbuild.c_layout_header() + HARNESS)
    subprocess.run(["gcc", "-O1", "-I", str(tmp_path), "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")],
                   check=True)
    (tmp_path / "rows").write_bytes(table.rows)
    (tmp_path / "index").write_bytes(table.index)
    rows = [ROW.unpack_from(table.rows, i * ROW.size) for i in range(table.n_rows)]
    starts = [r[0] for r in rows]
    rng = random.Random(12)
    offsets = [0, starts[0] - 1, starts[0], starts[-1], starts[-1] + 5000]
    offsets += [starts[i] for i in rng.sample(range(len(starts)), 300)]
    offsets += [starts[i] - 1 for i in rng.sample(range(1, len(starts)), 300)]
    offsets += [rng.randrange(0, starts[-1] + 1000) for _ in range(1000)]
    out = subprocess.run([str(tmp_path / "probe"), str(tmp_path / "rows"), str(tmp_path / "index"),
                          *map(hex, offsets)], capture_output=True, text=True, check=True).stdout.split()
    for off, got in zip(offsets, map(int, out), strict=True):
        i = bisect.bisect_right(starts, off) - 1
        want = -1 if i < 0 or rows[i][2] == NONE else i
        assert got == want, hex(off)
    assert struct.calcsize(layout.UNWIND_ROW.format) == ROW.size == 8
    assert make_table([], 0, 0.0, 0.0).n_rows == 0
