"""Builds the sanitizer harness: cmodule/'s malloc core as agentbuild hands it to Frida's CModule
(the layout header generated from memtrace/layout.py, then each file), compiled natively with
the stand-in headers in shim/ and linked with harness.c.  ``python tests/native/build.py OUT``
builds both variants by hand."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

# ASan + UBSan in one build, TSan in another (they cannot be combined).
SANITIZERS: dict[str, list[str]] = {
    "asan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
    "tsan": ["-fsanitize=thread"],
}
# TSan: the core's volatile words are its atomics (TinyCC has no others): tsan_volatile.c tells
# the runtime so (see there); the harness's own code is checked as it is.
# And the core's full fences (mt_barrier: fence-based publication of a slot's state, its ring, its
# last counts) become a read-modify-write of one shared word (MT_TSAN, core.c): TSan does not model
# a standalone fence, but it sees two threads' RMWs of one word as ordering them.
TSAN_VOLATILE = ["--param=tsan-distinguish-volatile=1", "-DMT_TSAN=1"]
# MT_INDEX_MIN: the stack index starts at 64 entries, so it grows (core.c, mt_index_grow) several
# times while the harness's threads intern and look up stacks.
CFLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-Wall", "-Wno-unused-function", "-DMT_INDEX_MIN=64ULL"]


def compiler() -> str | None:
    return shutil.which("gcc") or shutil.which("clang") or shutil.which("cc")


def sanitizer_works(cc: str, sanitizer: str, work: Path) -> str | None:
    """None when `cc` builds and runs a program with the sanitizer, else why not."""
    src = work / "probe_sanitizer.c"
    exe = work / f"probe_{sanitizer}"
    src.write_text("int main(void) { return 0; }\n")
    built = subprocess.run([cc, *SANITIZERS[sanitizer], str(src), "-o", str(exe)], capture_output=True, text=True)
    if built.returncode != 0:
        return f"{cc} cannot build with {' '.join(SANITIZERS[sanitizer])}: {built.stderr.strip()[:200]}"
    ran = subprocess.run([str(exe)], capture_output=True, text=True)
    if ran.returncode != 0:
        return f"a {sanitizer} program does not run here: {ran.stderr.strip()[:200]}"
    return None


def write_sources(work: Path) -> Path:
    """layout.h and the core's translation unit (what the agent compiles, for Linux), in `work`."""
    sys.path.insert(0, str(ROOT / "src"))
    from memtrace import agentbuild

    work.mkdir(parents=True, exist_ok=True)
    (work / "layout.h").write_text(agentbuild.c_layout_header() + "\n")
    core = work / "core_tu.c"
    core.write_text("#define MT_LINUX 1\n" + "\n".join(agentbuild.c_sources("malloc")) + "\n"
                    + '#line 1 "probe.c"\n' + (HERE / "probe.c").read_text())
    return core


def build(work: Path, sanitizer: str, cc: str) -> Path:
    core = write_sources(work)
    exe = work / f"harness-{sanitizer}"
    steps = []
    objects = [work / f"core-{sanitizer}.o", work / f"harness-{sanitizer}.o"]
    flags = [*CFLAGS, *SANITIZERS[sanitizer], f"-I{HERE / 'shim'}", f"-I{work}"]
    core_flags = [*flags, *TSAN_VOLATILE] if sanitizer == "tsan" else flags
    steps.append([cc, *core_flags, "-c", str(core), "-o", str(objects[0])])
    steps.append([cc, *flags, "-c", str(HERE / "harness.c"), "-o", str(objects[1])])
    if sanitizer == "tsan":
        objects.append(work / "tsan_volatile.o")
        steps.append([cc, "-O1", "-g", "-c", str(HERE / "tsan_volatile.c"), "-o", str(objects[2])])
    steps.append([cc, *CFLAGS, *SANITIZERS[sanitizer], *map(str, objects), "-o", str(exe)])
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building the {sanitizer} harness failed:\n{' '.join(cmd)}\n{proc.stderr}")
    return exe


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/native")
    cc = compiler()
    if cc is None:
        sys.exit("no C compiler")
    for name in SANITIZERS:
        print(build(out, name, cc))
