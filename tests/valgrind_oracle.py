"""valgrind memcheck as the test oracle of memtrace --leaks (tests/integration/test_leak_parity.py,
bench/leak_parity.py).

``valgrind --leak-check=full --show-leak-kinds=all --xml=yes`` gives one <error> per loss record:
its kind (Leak_DefinitelyLost, Leak_IndirectlyLost, Leak_PossiblyLost, Leak_StillReachable), its
blocks and bytes, and the allocating stack.  A program may ask for a check mid-run
(VALGRIND_DO_LEAK_CHECK, the parity programs' checkpoint); the records before the run's FINISHED
status are that check's, the ones after are the check at exit.  A definitely lost record's bytes
count its clique's indirectly lost bytes too ("48 (16 direct, 32 indirect) bytes"): only the direct
part is the record's own (the indirect blocks have records of their own).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

KINDS = {"Leak_DefinitelyLost": "definitely_lost", "Leak_IndirectlyLost": "indirectly_lost",
         "Leak_PossiblyLost": "possibly_lost", "Leak_StillReachable": "reachable"}
LOST = ("definitely_lost", "indirectly_lost")
# The allocator's own entry points: a stack's key is the first frame below them.
ALLOCATOR_FRAMES = re.compile(r"^(malloc|calloc|realloc|reallocarray|memalign|aligned_alloc|posix_memalign|valloc|"
                              r"pvalloc|strdup|strndup|operator new(\[\])?(\(.*\))?|__libc_\w+|xmalloc|xcalloc|"
                              r"xrealloc)$")
_DIRECT = re.compile(r"^([\d,]+) \(([\d,]+) direct, ([\d,]+) indirect\) bytes")


def valgrind() -> str | None:
    """valgrind's path, or None when it is not installed."""
    return shutil.which("valgrind")


@dataclass
class LossRecord:
    kind: str
    blocks: int
    bytes: int
    functions: list[str]     # innermost first, valgrind's names ("pat_cycle()", "main")


@dataclass
class Check:
    """One leak check: its loss records."""
    records: list[LossRecord] = field(default_factory=list)

    def by_key(self, key: Callable[[list[str]], str], kinds: Iterable[str] = LOST) -> dict[str, tuple[int, int]]:
        """(blocks, bytes) per stack key over the given kinds."""
        blocks: Counter[str] = Counter()
        nbytes: Counter[str] = Counter()
        wanted = set(kinds)
        for r in self.records:
            if r.kind in wanted:
                k = key(r.functions)
                blocks[k] += r.blocks
                nbytes[k] += r.bytes
        return {k: (blocks[k], nbytes[k]) for k in blocks}

    def total(self, kind: str) -> tuple[int, int]:
        rs = [r for r in self.records if r.kind == kind]
        return sum(r.blocks for r in rs), sum(r.bytes for r in rs)


@dataclass
class ValgrindRun:
    checkpoint: Check | None      # the program's VALGRIND_DO_LEAK_CHECK, if it made one
    exit: Check
    returncode: int


def parse_xml(text: str) -> tuple[Check | None, Check]:
    """The mid-run check (None when there was none) and the check at exit."""
    root = ET.fromstring(text)
    mid, end = Check(), Check()
    current = mid
    saw_mid = False
    for el in root:
        if el.tag == "status" and el.findtext("state") == "FINISHED":
            current = end
        if el.tag != "error":
            continue
        kind = KINDS.get(el.findtext("kind") or "")
        if kind is None:
            continue
        if current is mid:
            saw_mid = True
        xwhat = el.find("xwhat")
        text = (xwhat.findtext("text") if xwhat is not None else "") or ""
        blocks = int((xwhat.findtext("leakedblocks") if xwhat is not None else "0") or 0)
        nbytes = int((xwhat.findtext("leakedbytes") if xwhat is not None else "0") or 0)
        m = _DIRECT.match(text)
        if m:
            nbytes = int(m.group(2).replace(",", ""))
        functions = [f.findtext("fn") or "???" for f in el.iter("frame")]
        current.records.append(LossRecord(kind, blocks, nbytes, functions))
    return (mid if saw_mid else None), end


def run(exe: str | Path, *args: str, xml: Path, timeout: float = 600, options: tuple[str, ...] = ()) -> ValgrindRun:
    """The program under memcheck, its loss records at the checkpoint and at exit; `options`: more
    of valgrind's own (e.g. --max-threads, 500 by default)."""
    vg = valgrind()
    if vg is None:
        raise RuntimeError("valgrind is not installed")
    proc = subprocess.run([vg, "--leak-check=full", "--show-leak-kinds=all", "--xml=yes", f"--xml-file={xml}",
                           "--error-limit=no", *options, str(exe), *args],
                          capture_output=True, text=True, timeout=timeout)
    mid, end = parse_xml(xml.read_text(encoding="utf-8", errors="replace"))
    return ValgrindRun(mid, end, proc.returncode)


@dataclass
class TracedProcess:
    pid: int
    ppid: int
    run: ValgrindRun


def run_family(exe: str | Path, *args: str, xml_dir: Path, timeout: float = 600) -> list[TracedProcess]:
    """The program and every process it makes (--trace-children=yes: a fork child is checked at its
    own exit), each with its loss records, the program first."""
    vg = valgrind()
    if vg is None:
        raise RuntimeError("valgrind is not installed")
    xml_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([vg, "--trace-children=yes", "--leak-check=full", "--show-leak-kinds=all", "--xml=yes",
                           f"--xml-file={xml_dir}/vg.%p.xml", "--error-limit=no", str(exe), *args],
                          capture_output=True, text=True, timeout=timeout)
    out = []
    for xml in sorted(xml_dir.glob("vg.*.xml")):
        text = xml.read_text(encoding="utf-8", errors="replace")
        root = ET.fromstring(text)
        mid, end = parse_xml(text)
        out.append(TracedProcess(int(root.findtext("pid") or 0), int(root.findtext("ppid") or 0),
                                 ValgrindRun(mid, end, proc.returncode)))
    pids = {p.pid for p in out}
    return sorted(out, key=lambda p: (p.ppid in pids, p.pid))


def plain_name(function: str) -> str:
    """A function's name without its C++ parameter list: "pat_cycle()" -> "pat_cycle"."""
    depth, cut = 0, len(function)
    for i in range(len(function) - 1, -1, -1):
        c = function[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                cut = i
                break
    return function[:cut] if function.endswith(")") else function


def key_by_prefix(prefix: str) -> Callable[[list[str]], str]:
    """A stack's key: its innermost function named prefix*, else its first frame outside the allocator."""
    def key(functions: list[str]) -> str:
        names = [plain_name(f) for f in functions]
        for n in names:
            if n.startswith(prefix):
                return n
        return first_caller(names)
    return key


def first_caller(functions: list[str]) -> str:
    """The innermost frame that is not the allocator's (valgrind's replacement or glibc's)."""
    for f in functions:
        n = plain_name(f)
        if not ALLOCATOR_FRAMES.match(n) and not n.startswith("std::") and not n.startswith("__gnu_cxx::"):
            return n
    return "(allocator)"


def memtrace_by_key(leaks: dict, key: Callable[[list[str]], str], kinds: Iterable[str] = LOST,
                    ) -> dict[str, tuple[int, int]]:
    """memtrace's --leaks JSON (every by-stack row: run with a --top above the stack count) as (blocks, bytes)
    per stack key."""
    blocks: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    for kind in kinds:
        for r in leaks[kind]["by_stack"]:
            k = "(allocated before tracing)" if r.get("allocated_before_tracing") else \
                key([f.get("function") or "???" for f in r["frames"]])
            blocks[k] += r["blocks"]
            nbytes[k] += r["bytes"]
    return {k: (blocks[k], nbytes[k]) for k in blocks}
