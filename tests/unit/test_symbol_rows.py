"""SYMBOLS rows as readers see them (old six-column rows, new rows with inlined calls), names
demangled on read, and the capture rewrite that ``memtrace symbolize`` uses."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from tests.hostile_captures import frame

from memtrace.analyze.symbols import SymbolTable
from memtrace.capture import (
    HEADER,
    RECORD_HEADER,
    CaptureError,
    CaptureWriter,
    RecordType,
    StackRecord,
    encode_agent_records,
    read_records,
    replace_records,
)
from memtrace.frames import Frame
from memtrace.symbols import demangle

MODULES = [{"name": "app", "path": "/app", "base": "0x1000", "size": 0x4000}]


def table(rows: list[list[object]]) -> SymbolTable:
    t = SymbolTable()
    t.add_modules(MODULES)
    t.add_rows(rows)
    return t


def test_old_six_column_rows_with_mangled_names_read_demangled() -> None:
    t = table([["0x1010", "app", 0x10, "_ZN4PoolIdE4fillEid", None, None],
               ["0x1020", "app", 0x20, "__ZN2CA6Render5Shmem12set_volatileEbPi", "shmem.cpp", 88]])
    assert t.frames_of(0x1010) == [Frame(0x1010, "app", 0x10, "Pool<double>::fill(int, double)")]
    assert t.frames_of(0x1020) == [Frame(0x1020, "app", 0x20, "CA::Render::Shmem::set_volatile(bool, int*)",
                                         "shmem.cpp", 88)]
    # Every reader sees the demangled name, the families' labels included.
    assert t.frame(0x1010).function == "Pool<double>::fill(int, double)"
    assert t.labels([0x1010]) == ["Pool<double>::fill(int, double) (app)"]


def test_rows_with_inlined_calls_expand_innermost_first() -> None:
    t = table([["0x1010", "app", 0x10, "outer(int)", "/src/a.cpp", 28,
                [["twice", "/src/a.cpp", 23], ["_Z4oncei", "/src/b.h", 4]]],
               ["0x1200", "app", 0x200, "main", "/src/a.cpp", 40]])
    assert t.frames_of(0x1010) == [
        Frame(0x1010, "app", 0x10, "twice", "/src/a.cpp", 23, inlined=True),
        Frame(0x1010, "app", 0x10, "once(int)", "/src/b.h", 4, inlined=True),
        Frame(0x1010, "app", 0x10, "outer(int)", "/src/a.cpp", 28),
    ]
    assert [f.label() for f in t.stack_frames([0x1010, 0x1200])] == [
        "twice (app) a.cpp:23 [inlined]", "once(int) (app) b.h:4 [inlined]", "outer(int) (app) a.cpp:28",
        "main (app) a.cpp:40"]


def test_addresses_without_rows_fall_back_to_module_and_offset() -> None:
    t = table([])
    assert t.frames_of(0x1234) == [Frame(0x1234, "app", 0x234)]
    assert t.frames_of(0x9000) == [Frame(0x9000)]
    assert t.frames_of(0x9000)[0].label() == "0x9000 (unknown)"     # in no module: said so, never dropped


def test_a_later_row_for_an_address_replaces_the_earlier_one() -> None:
    t = table([["0x1010", "app", 0x10, None, None, None]])
    assert t.frames_of(0x1010)[0].function is None
    t.add_rows([["0x1010", "app", 0x10, "f", "/a.c", 3, [["g", "/a.c", 1]]]])
    assert [f.function for f in t.frames_of(0x1010)] == ["g", "f"]


@pytest.mark.parametrize(("mangled", "readable"), [
    ("_ZN4PoolIdE4fillEid", "Pool<double>::fill(int, double)"),
    ("__ZN2CA6Render5Shmem9new_shmemEm", "CA::Render::Shmem::new_shmem(unsigned long)"),   # Mach-O's extra _
    ("_Z3foov.cold", "foo() (.cold)"),
    ("$sSS5countSivg", "Swift.String.count.getter : Swift.Int"),
    ("_$s4main3FooV3baryyF", "main.Foo.bar() -> ()"),
    ("malloc", "malloc"),
    ("_Zfoo", "_Zfoo"),                          # looks mangled, is not: unchanged
    ("-[NSObject init]", "-[NSObject init]"),
])
def test_demangle(mangled: str, readable: str) -> None:
    assert demangle(mangled) == readable


# ---- replace_records -------------------------------------------------------------------------


def raw_records(path: Path) -> list[tuple[int, bytes]]:
    data = path.read_bytes()
    pos, out = HEADER.size, []
    while pos + RECORD_HEADER.size <= len(data):
        kind, _, _, length, _crc = RECORD_HEADER.unpack_from(data, pos)
        if pos + RECORD_HEADER.size + length > len(data):
            break
        out.append((kind, data[pos + RECORD_HEADER.size:pos + RECORD_HEADER.size + length]))
        pos += RECORD_HEADER.size + length
    return out


def sample(path: Path, with_symbols: bool = True) -> Path:
    with CaptureWriter(path) as w:
        w.write(RecordType.META, {"tracer": "malloc"})
        w.write(RecordType.MODULES, {"modules": MODULES})
        w.write(RecordType.BATCH, {"t": 1}, encode_agent_records(1, [StackRecord(1, 0, (0x1010, 0x1200))]))
        if with_symbols:
            w.write(RecordType.SYMBOLS, {"rows": [["0x1010", "app", 0x10, "old", None, None]]})
        w.write(RecordType.WARNING, {"text": "between"})
        if with_symbols:
            w.write(RecordType.SYMBOLS, {"rows": [["0x1200", "app", 0x200, "old2", None, None]]})
        w.write(RecordType.END, {"ended": "target-exited"})
    with open(path, "ab") as f:            # a record type from a newer memtrace, then a torn tail
        f.write(frame(200, b"new"))
        f.write(frame(int(RecordType.SNAPSHOT), b'{"t":' + b" " * 95)[:RECORD_HEADER.size + 5])
    return path


def test_replace_records_keeps_every_other_byte(tmp_path: Path) -> None:
    p = sample(tmp_path / "c.mtc")
    before = raw_records(p)
    tail = p.read_bytes()[-(RECORD_HEADER.size + 5):]
    new = [{"rows": [["0x1010", "app", 0x10, "f", "/a.c", 3]], "by": "memtrace symbolize"}]
    replace_records(p, RecordType.SYMBOLS, new)
    after = raw_records(p)
    keep = [r for r in before if r[0] != RecordType.SYMBOLS]
    first = [r[0] for r in before].index(RecordType.SYMBOLS)
    # The new table sits where the first old one was; nothing else moved or changed.
    assert after == keep[:first] + [(int(RecordType.SYMBOLS), b'{"rows":[["0x1010","app",16,"f","/a.c",3]],'
                                                              b'"by":"memtrace symbolize"}')] + keep[first:]
    assert p.read_bytes().endswith(tail)
    assert [r.type for r in read_records(p)] == [RecordType.META, RecordType.MODULES, RecordType.BATCH,
                                                 RecordType.SYMBOLS, RecordType.WARNING, RecordType.END]
    assert not list(tmp_path.glob(".*tmp"))


def test_replace_records_appends_when_there_was_no_table(tmp_path: Path) -> None:
    p = sample(tmp_path / "c.mtc", with_symbols=False)
    replace_records(p, RecordType.SYMBOLS, [{"rows": []}, {"rows": [["0x1", None, None, None, None, None]]}])
    kinds = [k for k, _ in raw_records(p)]
    # (META and MODULES: the run's opening group, format 8)
    assert kinds == [RecordType.GROUP, RecordType.BATCH, RecordType.WARNING, RecordType.END,
                     200, RecordType.SYMBOLS, RecordType.SYMBOLS]


def test_replace_records_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="no such capture"):
        replace_records(tmp_path / "none.mtc", RecordType.SYMBOLS, [])
    bad = tmp_path / "bad.mtc"
    bad.write_bytes(b"NOTMEMTR" + struct.pack("<HHI", 1, 0, 0))
    with pytest.raises(CaptureError, match="bad magic"):
        replace_records(bad, RecordType.SYMBOLS, [])
    assert bad.read_bytes().startswith(b"NOTMEMTR")
    with pytest.raises(ValueError, match="BATCH"):
        replace_records(sample(tmp_path / "c.mtc"), RecordType.BATCH, [])


@pytest.mark.parametrize(("raw", "function", "part"), [
    ("main.cold", "main", "cold"),
    ("build_index.part.0", "build_index", "part.0"),
    ("_Z11build_indexi.cold", "build_index(int)", "cold"),
    ("_Z3fooi.constprop.0.isra.0", "foo(int)", "constprop.0.isra.0"),
    ("parse.lto_priv.0", "parse", "lto_priv.0"),
    ("f(int) [clone .cold]", "f(int)", "cold"),
    ("plain_function", "plain_function", None),
    (".cold", ".cold", None),
])
def test_split_functions_are_named_by_their_parent(raw: str, function: str, part: str | None) -> None:
    t = table([["0x1010", "app", 0x10, raw, None, None]])
    (f,) = t.frames_of(0x1010)
    assert (f.function, f.part) == (function, part)
    assert f.name() == f"{function} (app)"
    if part:
        assert f.to_json()["part"] == part and Frame.from_json(f.to_json()) == f
