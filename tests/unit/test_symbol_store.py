"""The persistent SymCache store (symbols/store.py), on real binaries compiled here: a second
symbolization of the same binary comes from the store, a rebuilt binary (another build-id) never
gets the old one's names, a damaged entry is ignored and rewritten, the folder stays bounded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memtrace.symbols.objects import SymbolFiles
from memtrace.symbols.store import SymCacheStore, default_folder

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

SOURCE = """
#include <stdlib.h>
__attribute__((noinline)) void *{name}(size_t n) {{ return malloc(n); }}
int main(void) {{ free({name}(64)); return 0; }}
"""


def build(tmp: Path, name: str, out: str = "prog") -> Path:
    src = tmp / f"{name}.c"
    src.write_text(SOURCE.format(name=name))
    exe = tmp / out
    subprocess.run(["gcc", "-g", "-O1", "-Wl,--build-id", "-o", str(exe), str(src)], check=True)
    return exe


def symbol_offset(exe: Path, name: str) -> int:
    out = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    (addr,) = [int(line.split()[0], 16) for line in out.splitlines() if line.endswith(f" {name}")]
    return addr


def name_at(files: SymbolFiles, exe: Path, rel: int) -> tuple[str | None, bool]:
    obj = files.select(str(exe))
    assert obj is not None
    f = files.load(str(exe), obj)
    assert f is not None
    locs = f.lookup(rel)
    return (locs[-1].name if locs else None), f.stored


def test_second_run_symbolizes_from_the_store(tmp_path: Path) -> None:
    exe = build(tmp_path, "first_name")
    rel = symbol_offset(exe, "first_name") + 1
    store = SymCacheStore(tmp_path / "cache")
    assert name_at(SymbolFiles(store), exe, rel) == ("first_name", False)
    assert store.counts() == {"hits": 0, "built": 1, "rejected": 0}
    (entry,) = (tmp_path / "cache").iterdir()
    assert entry.name.endswith(".symcache") and entry.stat().st_size > 0

    again = SymCacheStore(tmp_path / "cache")      # another run: a fresh process's store
    assert name_at(SymbolFiles(again), exe, rel) == ("first_name", True)
    assert again.counts() == {"hits": 1, "built": 0, "rejected": 0}


def test_a_rebuilt_binary_is_not_served_the_old_symbols(tmp_path: Path) -> None:
    store_dir = tmp_path / "cache"
    exe = build(tmp_path, "old_name")
    rel = symbol_offset(exe, "old_name") + 1
    assert name_at(SymbolFiles(SymCacheStore(store_dir)), exe, rel)[0] == "old_name"

    exe = build(tmp_path, "new_function_name")        # same path, other code: other build-id
    rel = symbol_offset(exe, "new_function_name") + 1
    store = SymCacheStore(store_dir)
    assert name_at(SymbolFiles(store), exe, rel) == ("new_function_name", False)
    assert store.counts()["hits"] == 0
    assert len(list(store_dir.iterdir())) == 2


def test_a_damaged_entry_is_ignored_and_rewritten(tmp_path: Path) -> None:
    exe = build(tmp_path, "kept_name")
    rel = symbol_offset(exe, "kept_name") + 1
    store_dir = tmp_path / "cache"
    name_at(SymbolFiles(SymCacheStore(store_dir)), exe, rel)
    (entry,) = store_dir.iterdir()
    entry.write_bytes(b"not a symcache at all" * 10)

    store = SymCacheStore(store_dir)
    assert name_at(SymbolFiles(store), exe, rel) == ("kept_name", False)
    assert store.counts() == {"hits": 0, "built": 1, "rejected": 1}
    third = SymCacheStore(store_dir)
    assert name_at(SymbolFiles(third), exe, rel) == ("kept_name", True)    # rewritten whole
    assert third.counts()["hits"] == 1


def test_an_entry_of_another_object_is_not_trusted(tmp_path: Path) -> None:
    a, b = build(tmp_path, "name_a", "a"), build(tmp_path, "name_b", "b")
    store_dir = tmp_path / "cache"
    files = SymbolFiles(SymCacheStore(store_dir))
    for exe in (a, b):
        name_at(files, exe, 1)
    obj_a, obj_b = (SymbolFiles(None).select(str(x)) for x in (a, b))
    assert obj_a is not None and obj_b is not None
    store = SymCacheStore(store_dir)
    key_a, key_b = store.key(obj_a), store.key(obj_b)
    assert key_a and key_b and key_a != key_b
    shutil.copy(store_dir / key_b, store_dir / key_a)      # a's entry now holds b's cache
    assert store.get(obj_a) is None and store.counts()["rejected"] == 1


def test_the_folder_is_bounded(tmp_path: Path) -> None:
    store_dir = tmp_path / "cache"
    exes = [build(tmp_path, f"fn_{i}", f"p{i}") for i in range(3)]
    name_at(SymbolFiles(SymCacheStore(store_dir)), exes[0], 1)
    one = next(store_dir.iterdir()).stat().st_size
    store = SymCacheStore(store_dir, max_bytes=2 * one + one // 2)
    files = SymbolFiles(store)
    for exe in exes[1:]:
        os.utime(next(iter(sorted(store_dir.iterdir(), key=lambda p: p.stat().st_mtime))), (1, 1))
        name_at(files, exe, 1)
    assert sum(p.stat().st_size for p in store_dir.iterdir()) <= store.max_bytes
    assert len(list(store_dir.iterdir())) == 2


def test_folder_follows_memtrace_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMTRACE_CACHE_DIR", str(tmp_path))
    assert default_folder() == tmp_path / "symbols"
    monkeypatch.delenv("MEMTRACE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_folder() == tmp_path / "xdg" / "memtrace" / "symbols"


def test_memtrace_symbolize_reports_store_hits(tmp_path: Path) -> None:
    """`memtrace symbolize --json` twice on one capture: the second names the binary from the store."""
    from memtrace.capture import RecordType, encode_record, header_bytes

    exe = build(tmp_path, "cli_name")
    addr = 0x400000 + symbol_offset(exe, "cli_name") + 1
    cap = tmp_path / "cap.mtc"
    mods = {"modules": [{"name": "prog", "path": str(exe), "base": "0x400000", "size": 0x100000}]}
    cap.write_bytes(header_bytes() + encode_record(RecordType.META, {"tracer": "malloc"})
                    + encode_record(RecordType.MODULES, mods)
                    + encode_record(RecordType.SYMBOLS, {"rows": [[hex(addr), "prog", addr - 0x400000, None,
                                                                    None, None]], "by": "agent"})
                    + encode_record(RecordType.END, {"ended": "target-exited", "reason": "test"}))
    env = {**os.environ, "MEMTRACE_CACHE_DIR": str(tmp_path / "c")}
    runs = [json.loads(subprocess.run([sys.executable, "-m", "memtrace.cli", "symbolize", "--json", str(cap)],
                                      capture_output=True, text=True, check=True, env=env).stdout)
            for _ in range(2)]
    first, second = runs
    assert first["named"] == second["named"] == 1
    assert first["symbol_cache"]["built"] >= 1 and first["symbol_cache"]["hits"] == 0
    assert second["symbol_cache"]["hits"] >= 1 and second["symbol_cache"]["built"] == 0
    (image,) = [im for im in second["images"] if im["module"] == "prog"]
    assert image["symcache"] == "stored"
