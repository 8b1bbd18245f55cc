"""Hold a program memtrace starts before its first constructor (local Linux programs).

Frida's spawn on Linux injects the agent at the program's own first initializer or entry point:
by then every library's constructor has run (libstdc++'s 72,704 B emergency pool, anything a
plugin allocates when it loads), unseen.  ``ldaudit_hold.c`` is an LD_AUDIT library that makes
the program wait after the dynamic loader has loaded and relocated everything, before any
constructor; the host attaches there, installs the hooks, then lets it go (:class:`Hold`).

The library is built once per source with the host's C compiler and kept in memtrace's cache;
without a compiler (or on an architecture it does not know) the program is spawned as before
and the capture says that constructors ran before the hooks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).with_name("ldaudit_hold.c")
ENV_HOLD = "MEMTRACE_HOLD"
ENV_HOLD_CHILDREN = "MEMTRACE_HOLD_CHILDREN"     # --follow-children: every later image waits here
# A program not at the hold point after REACH_TIMEOUT_S is looked at (Hold.on_its_way): one whose
# loader has gone past the audit library without loading it runs on unheld at once; one still
# loading (starved of CPU on a loaded machine: seen at 10 s in CI) is waited for, up to REACH_MAX_S.
REACH_TIMEOUT_S = 10.0
REACH_MAX_S = 120.0
# No libc at all (see ldaudit_hold.c): nor the calls a compiler makes up for loops (strlen, memset).
CFLAGS = ("-shared", "-fPIC", "-nostdlib", "-ffreestanding", "-fno-builtin", "-fno-tree-loop-distribute-patterns",
          "-fno-stack-protector", "-O2")
ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
# ARCH-UNVERIFIED: the aarch64 build (its system calls) has never run -- the tests run on x86-64.
# A program held by a wrong hold waits up to 60 s, so there it is not used unless asked for.
VERIFIED_ARCHES = {"x86_64"}
ENV_TRY_UNVERIFIED = "MEMTRACE_HOLD_ARCH_UNVERIFIED"


def library(cache_dir: Path, machine: str | None = None) -> tuple[Path | None, str | None]:
    """The hold library (built now if needed), or None and why not (one line)."""
    machine = machine or platform.machine()
    arch = ARCHES.get(machine.lower())
    if arch is None:
        return None, f"no hold library for {machine}"
    if arch not in VERIFIED_ARCHES and os.environ.get(ENV_TRY_UNVERIFIED) != "1":
        return None, (f"the hold before constructors is not verified on {arch} (ARCH-UNVERIFIED; "
                      f"{ENV_TRY_UNVERIFIED}=1 tries it)")
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(CFLAGS).encode()).hexdigest()[:16]
    out = cache_dir / f"memtrace-hold-{arch}-{digest}.so"
    if out.exists():
        return out, None
    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    if cc is None:
        return None, "no C compiler (cc) to build the hold library"
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    try:
        r = subprocess.run([cc, *CFLAGS, "-o", str(tmp), str(SOURCE)],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"building the hold library failed: {e}"
    if r.returncode != 0:
        with contextlib.suppress(OSError):
            tmp.unlink()
        first = (r.stderr.strip().splitlines() or ["no message"])[0]
        return None, f"building the hold library failed: {first}"
    os.replace(tmp, out)
    return out, None


class Hold:
    """One held launch: the environment to spawn with, then reach() and release()."""

    def __init__(self, lib: Path, children: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="memtrace-hold-"))
        self.file = self.dir / "hold"
        self.file.touch()
        self.held = self.dir / "hold.held"
        self.lib = lib
        audit = os.environ.get("LD_AUDIT")
        self.env = {"LD_AUDIT": f"{lib}:{audit}" if audit else str(lib), ENV_HOLD: str(self.file)}
        self.reached = False
        # --follow-children: each image the target's processes exec posts <pid> here and waits
        # before its constructors until the host has attached (children.Family.watch_held).
        self.children: Path | None = None
        if children:
            self.children = self.dir / "children"
            self.children.mkdir()
            self.env[ENV_HOLD_CHILDREN] = str(self.children)

    def reach(self, alive: object, timeout: float = REACH_TIMEOUT_S, pid: int | None = None,
              longest: float = REACH_MAX_S) -> bool:
        """Wait until the resumed program waits at the hold point (False: it never got there --
        exited, or ld.so ignored LD_AUDIT, e.g. a set-user-ID program).  After ``timeout``, a
        program (``pid``) still on its way there is waited for, up to ``longest``: a deadline
        alone would let a program the machine's load kept from running go on untraced."""
        start = time.monotonic()
        look_at = start + timeout
        while True:
            if self.held.exists():
                self.reached = True
                return True
            if callable(alive) and not alive():
                break
            now = time.monotonic()
            if now >= start + longest:
                break
            if now >= look_at:
                if pid is None or not self.on_its_way(pid):
                    break
                look_at = now + 0.5
            time.sleep(0.002)
        # Gone past it, or never coming: the program may still reach the hold point later; the
        # file removed, it goes straight on there.
        self.close()
        return False

    def on_its_way(self, pid: int) -> bool:
        """Whether process ``pid`` can still reach the hold point: the hold library is loaded, or
        the loader has not loaded any library yet (audit libraries come before the program's own).
        False when a library other than the loader is mapped without ours (LD_AUDIT was ignored),
        or when there is no loader at all (a static program: the kernel maps the loader with a
        dynamic one, before its first instruction)."""
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            return False
        ours = os.path.realpath(self.lib)
        other = loader = False
        for line in maps.splitlines():
            parts = line.split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            path = parts[5]
            if path == ours or path == str(self.lib):
                return True
            name = os.path.basename(path)
            if name.startswith("ld-"):
                loader = True
            elif ".so" in name:
                other = True
        return loader and not other

    def release(self) -> None:
        self.close()

    def close(self) -> None:
        """Let it go (or make sure no process is held later); removes the folder (once the
        children's folder is gone: close_children)."""
        for f in (self.held, self.file):
            with contextlib.suppress(OSError):
                f.unlink()
        with contextlib.suppress(OSError):
            self.dir.rmdir()

    def close_children(self) -> None:
        """The run is over: every image still waiting goes on, and no later one waits."""
        if self.children is not None:
            with contextlib.suppress(OSError):
                for f in self.children.iterdir():
                    f.unlink()
                self.children.rmdir()
        self.close()


class HeldImage:
    """A followed process's image waiting at the hold point: released once its hooks are in."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.file.unlink()
