"""SymCaches kept on disk between runs, keyed by the object's build-id (issue 21: symbolization
of binaries seen before costs no DWARF walk).

Building a SymCache reads an object's whole symbol table and DWARF (cc1plus's: ~3 MB of cache;
a program built with -g: its line tables and inlined-call trees) -- every run, for the same
files.  A SymCache is symbolic's own serialized form, so the first run writes it here and later
runs open it (``SymCache.open`` maps the file).

The key is what makes an object's symbols what they are: its build-id (ELF) or UUID (Mach-O),
its architecture, what it holds (a separate debug file with the same build-id as its stripped
binary has lines, the binary does not: two entries), and symbolic's SymCache format version.  A
binary rebuilt from other sources has another build-id, so it never meets an old entry; an object
without one is not cached (nothing identifies it but its bytes).

Entries are written atomically (a reader sees a whole file or none); an entry that does not open,
or names another object than the one asked for, is ignored and written again.  The folder is
bounded: past MAX_BYTES the entries used least recently go (a hit touches its entry).

Folder: $MEMTRACE_CACHE_DIR/symbols, else $XDG_CACHE_HOME/memtrace/symbols (~/.cache/...).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
from pathlib import Path

from symbolic.debuginfo import Object
from symbolic.exceptions import SymbolicError
from symbolic.symcache import SYMCACHE_LATEST_VERSION, SymCache

from memtrace.files import write_bytes_atomic

MAX_BYTES = 512 << 20          # the whole folder; older entries are removed past it
SUFFIX = ".symcache"
_SAFE = re.compile(r"[^0-9A-Za-z_.-]")


def default_folder() -> Path:
    root = os.environ.get("MEMTRACE_CACHE_DIR")
    if root:
        return Path(root) / "symbols"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memtrace" / "symbols"


class SymCacheStore:
    """get(obj) / put(obj, cache) over one folder, counting what it served."""

    def __init__(self, folder: Path | None = None, max_bytes: int = MAX_BYTES) -> None:
        self.folder = folder if folder is not None else default_folder()
        self.max_bytes = max_bytes
        self.hits = 0          # SymCaches opened from the folder
        self.built = 0         # SymCaches built (and written) because the folder had none
        self.rejected = 0      # entries that did not open or did not match: rewritten

    def key(self, obj: Object) -> str | None:
        """The entry's file name for ``obj``, or None when it has no build-id/UUID."""
        ident = (obj.code_id or "").lower()
        if not ident or set(ident) == {"0"}:
            return None
        holds = hashlib.sha256(" ".join(sorted(obj.features)).encode()).hexdigest()[:8]
        name = f"{ident}-{obj.arch}-{obj.file_format}-{holds}-v{SYMCACHE_LATEST_VERSION}"
        return _SAFE.sub("_", name) + SUFFIX

    def get(self, obj: Object) -> SymCache | None:
        name = self.key(obj)
        if name is None:
            return None
        path = self.folder / name
        if not path.is_file():
            return None
        try:
            cache = SymCache.open(str(path))
        except (SymbolicError, OSError, ValueError):
            self.rejected += 1          # torn or foreign bytes: built again and rewritten
            return None
        try:
            same = str(cache.debug_id).lower() == str(obj.debug_id).lower() and cache.arch == obj.arch
        except (SymbolicError, ValueError):
            same = False
        if not same:
            self.rejected += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(path)              # used now: the last to go when the folder is trimmed
        self.hits += 1
        return cache

    def put(self, obj: Object, cache: SymCache) -> None:
        """Keep ``cache`` for later runs (best effort: an unwritable folder only costs a rebuild)."""
        self.built += 1
        name = self.key(obj)
        if name is None:
            return
        buf = io.BytesIO()
        try:
            cache.dump_into(buf)
            self.folder.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(self.folder / name, buf.getvalue())
        except (OSError, SymbolicError):
            return
        self.trim()

    def trim(self) -> None:
        """Remove the least recently used entries until the folder is within max_bytes."""
        entries = []
        with contextlib.suppress(OSError):
            for p in self.folder.glob(f"*{SUFFIX}"):
                with contextlib.suppress(OSError):
                    st = p.stat()
                    entries.append((st.st_mtime_ns, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        for _, size, p in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                p.unlink()
                total -= size

    def counts(self) -> dict[str, int]:
        return {"hits": self.hits, "built": self.built, "rejected": self.rejected}
