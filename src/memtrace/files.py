"""Output files a crash cannot leave half-written: temp file in the same folder, then os.replace.

A file is created with the permissions the user's umask gives (``0666 & ~umask``), as ``open``
would, not mkstemp's private 0600: a report is meant to be read by others.  ``save_text`` and
``save_json`` are what commands use for a file the user named: a folder that cannot be written
is one line naming the option and the path, not a traceback.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from memtrace.errors import InputError


@contextmanager
def _replacing(path: Path, mode: str) -> Iterator[IO[Any]]:
    """A file opened on a temporary beside ``path`` and renamed over it when the block ends without
    an exception; on any exception the temporary is removed (raises OSError).

    Only a regular file is ever replaced: a FIFO, device node or socket at ``path`` (``-o
    /dev/null`` as root) is refused before anything is written, never swapped for a file.  A
    symbolic link is written through, never replaced (``-o /dev/stdout`` with standard output a
    file replaced the machine's /dev/stdout link), and a path that is this process's standard
    output (``/dev/stdout``, ``/proc/self/fd/1``) is written to it, as without ``-o``."""
    if _is_standard_output(path):
        sys.stdout.flush()
        with os.fdopen(os.dup(1), mode, encoding=None if "b" in mode else "utf-8") as out:
            yield out
        return
    refuse_special(path)
    path = Path(os.path.realpath(path))
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


_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def special_kind(mode: int) -> str | None:
    """What a file of this ``st_mode`` is when it is not a regular file ("a FIFO", ...), else None."""
    return next((what for test, what in _SPECIAL if test(mode)), None)


def _is_standard_output(path: Path) -> bool:
    """Whether ``path`` names standard output itself (/dev/stdout, /dev/fd/1, /proc/self/fd/1, or a
    link to one): not merely the same file (``-o /dev/null`` stays refused with stdout /dev/null)."""
    names = {"/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", f"/proc/{os.getpid()}/fd/1"}
    p = os.path.normpath(os.path.abspath(path))
    for _ in range(40):                 # the kernel's own limit on a chain of links
        if p in names:
            return True
        try:
            p = os.path.normpath(os.path.join(os.path.dirname(p), os.readlink(p)))
        except OSError:
            return False
    return False


def refuse_special(path: Path) -> None:
    """Raise OSError when ``path`` exists and is not a regular file (symbolic links followed)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return                      # nothing there (or nothing reachable): a new file is made
    what = special_kind(mode)
    if what is not None:
        raise OSError(errno.EINVAL, f"it is {what}, not a regular file (output goes only to regular "
                                    f"files, or to standard output without -o)")


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


# ---- files a user hands memtrace to read ----------------------------------------------------------

MAX_TEXT_INPUT = 4 << 20        # a plan or a rules file is a few KB; anything this large is not one
MAX_YAML_NODES = 200_000        # values a YAML document may expand to, aliases followed


def read_user_text(path: Path, what: str, max_bytes: int = MAX_TEXT_INPUT) -> str:
    """A small UTF-8 text file the user named, refused in one InputError line when it is not a
    regular file (a FIFO would block forever), too large, or not UTF-8 (raises FileNotFoundError
    when it does not exist, for the caller to word)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise InputError(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file (a {what} is a file, not a FIFO, device or socket)")
        if st.st_size > max_bytes:
            raise InputError(f"{path}: {st.st_size} bytes is too large for a {what} (at most {max_bytes})")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError(f"{path}: too large for a {what} (at most {max_bytes} bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: the {what} is not UTF-8 text") from None


def load_yaml(text: str, source: str, max_nodes: int = MAX_YAML_NODES) -> Any:
    """``yaml.safe_load`` that refuses, in one InputError line, a document whose aliases expand to
    more than ``max_nodes`` values (a "billion laughs": a few lines that would expand to 10^9) or
    that refer to themselves; raises yaml.YAMLError for the caller to word."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise InputError(f"{source}: YAML nested too deeply") from None
        if node is None:
            return None
        size = _expanded_size(node, max_nodes)
        if size is None:
            raise InputError(f"{source}: YAML aliases refer to themselves (a document that never ends)")
        if size > max_nodes:
            raise InputError(f"{source}: YAML aliases expand to more than {max_nodes} values "
                             f"(a \"billion laughs\" document), refused")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(root: Any, limit: int) -> int | None:
    """How many values ``root`` stands for with every alias expanded (counted once per use, as
    a consumer walking the data would see them), stopping past ``limit``; None for a cycle."""
    import yaml

    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(node: Any, depth: int = 0) -> int | None:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in busy:
            return None
        if depth > 1000:
            raise InputError("YAML nested more than 1000 deep")
        busy.add(id(node))
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [x for pair in node.value for x in pair]
        else:
            children = []
        for child in children:
            n = size(child, depth + 1)
            if n is None:
                return None
            total += n
            if total > limit:
                break
        busy.discard(id(node))
        sizes[id(node)] = total
        return total

    return size(root)
