"""Output files a crash cannot leave half-written: temp file in the same folder, then os.replace.

A file is created with the permissions the user's umask gives (``0666 & ~umask``), as ``open``
would, not mkstemp's private 0600: a report is meant to be read by others.  ``save_text`` and
``save_json`` are what commands use for a file the user named: a folder that cannot be written
is one line naming the option and the path, not a traceback.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from memtrace.errors import InputError


@contextmanager
def _replacing(path: Path, mode: str) -> Iterator[IO[Any]]:
    """A file opened on a temporary beside ``path`` and renamed over it when the block ends without
    an exception; on any exception the temporary is removed (raises OSError)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """A reader sees the old file or the new one, never half of one (raises OSError)."""
    with _replacing(path, "wb") as f:
        f.write(data)


@contextmanager
def open_text_atomic(path: Path, option: str) -> Iterator[IO[str]]:
    """A text file streamed to a temporary beside ``path`` and renamed over it when the block ends
    without an exception (for output too large to hold in memory, such as every record of a
    capture as JSON lines). A folder that cannot be written is one InputError line naming ``option``."""
    try:
        with _replacing(path, "w") as f:
            yield f
    except OSError as e:
        raise InputError(f"{option} {path}: cannot write: {_why(path, e)}") from None


def _why(path: Path, e: OSError) -> str:
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    return f"{blocker} is a file, not a folder" if blocker is not None else e.strerror or str(e)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, doc: Any) -> None:
    write_text_atomic(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def save_text(path: Path, text: str, option: str) -> None:
    """``write_text_atomic`` for a file named by ``option``: failures are one InputError line."""
    save_bytes(path, text.encode("utf-8"), option)


def save_bytes(path: Path, data: bytes, option: str) -> None:
    """``write_bytes_atomic`` for a file named by ``option``: failures are one InputError line."""
    try:
        write_bytes_atomic(path, data)
    except OSError as e:
        raise InputError(f"{option} {path}: cannot write: {_why(path, e)}") from None


def save_json(path: Path, doc: Any, option: str) -> None:
    save_text(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n", option)


def current_umask() -> int:
    """The process's umask, read without changing it where the kernel tells (Linux 4.7+)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    # Elsewhere the only way is to set it and put it back (a brief window other threads share).
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
