"""memtrace malloc --leaks: side by side with valgrind memcheck, and at scale.

    python bench/leak_bench.py parity          # the table: memtrace vs valgrind, stack by stack
    python bench/leak_bench.py scale [N] [MiB] # one scan of N live blocks / MiB of heap (1,000,000 / 2048)
    python bench/leak_bench.py exit [N] [--rounds R] [--base SRC]   # the scan at exit, N threads alive

parity: runs each program under valgrind (--leak-check=full) and under memtrace (--leaks), and
prints, per allocating stack (its innermost pat_* function, or its first frame outside the
allocator), valgrind's definitely + indirectly lost blocks and bytes next to memtrace's leaked
ones: the parity program (tests/programs/leak_parity.cpp) at its checkpoint and at exit, the
before-tracing program (tests/programs/leak_before.c, --attach-delay) and real Debian programs
(perl -e 1, sort /etc/passwd).  Blocks memtrace found allocated before tracing have no stack: they
are compared with the sum of valgrind's rows for the program's pat_before_* functions.

exit: tests/programs/exit_threads.c (N threads blocked at exit, 500 by default, no decoys) scanned at
its exit, R rounds (3); prints, per round, what finding the exiting thread cost (exit_search: threads,
reads, ms, where the memtrace run reports it) and the scan's time with the world stopped.  --base SRC:
another checkout's src/ (e.g. `git archive` of main) run in the same rounds, interleaved.

scale: bench/leak_heap.c fills N blocks (every 100th leaked) and memtrace scans them at the window's
end; prints the blocks examined, the time the world was stopped and the time scanning, against the
default --leaks-budget, and valgrind's time on the same program when --valgrind is given (slow).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import valgrind_oracle as oracle  # noqa: E402
from tests.conftest import CFLAGS  # noqa: E402

ALL_ROWS = "1000000"
BEFORE = "(allocated before tracing)"


def memtrace(out: Path, *args: str, timeout: float = 600, src: Path = ROOT / "src") -> dict:
    cmd = [sys.executable, "-m", "memtrace.cli", "malloc", "--json", "--device", "local", "--leaks", "--quiet",
           "--top", ALL_ROWS, "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(src)})
    if proc.returncode != 0:
        raise SystemExit(f"memtrace failed: {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout)


def build(tmp: Path) -> dict[str, Path]:
    out = {}
    for name, compiler in (("leak_parity.cpp", "g++"), ("leak_before.c", "gcc")):
        exe = tmp / name.split(".")[0]
        subprocess.run([compiler, *CFLAGS, "-o", str(exe), str(ROOT / "tests" / "programs" / name)], check=True)
        out[exe.name] = exe
    return out


def compare(label: str, vg: oracle.Check, doc: dict, key: Callable[[list[str]], str],
            before_prefix: str | None = None) -> list[tuple[str, str, str, str, str]]:
    want = vg.by_key(key)
    got = oracle.memtrace_by_key(doc["leaks"], key)
    if before_prefix is not None:
        pre = [v for k, v in want.items() if k.startswith(before_prefix)]
        want = {k: v for k, v in want.items() if not k.startswith(before_prefix)}
        if pre:
            want[BEFORE] = (sum(b for b, _ in pre), sum(n for _, n in pre))
    rows = []
    for k in sorted(set(want) | set(got)):
        w, g = want.get(k, (0, 0)), got.get(k, (0, 0))
        rows.append((label, k, f"{w[0]:,} / {w[1]:,}", f"{g[0]:,} / {g[1]:,}", "yes" if w == g else "NO"))
    tw = [sum(v[i] for v in want.values()) for i in (0, 1)]
    tg = [sum(v[i] for v in got.values()) for i in (0, 1)]
    rows.append((label, "TOTAL", f"{tw[0]:,} / {tw[1]:,}", f"{tg[0]:,} / {tg[1]:,}", "yes" if tw == tg else "NO"))
    return rows


def parity() -> int:
    if oracle.valgrind() is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    rows: list[tuple[str, str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exes = build(tmp)
        pat = oracle.key_by_prefix("pat_")
        vg = oracle.run(exes["leak_parity"], "0", xml=tmp / "p.xml")
        assert vg.checkpoint is not None
        doc = memtrace(tmp / "c1", "--window", "3", "--", str(exes["leak_parity"]), "60")
        rows += compare("leak_parity, window end", vg.checkpoint, doc, pat)
        doc = memtrace(tmp / "c2", "--window", "60", "--", str(exes["leak_parity"]), "0")
        rows += compare("leak_parity, exit", vg.exit, doc, pat)
        vg = oracle.run(exes["leak_before"], "0", "0", xml=tmp / "b.xml")
        doc = memtrace(tmp / "c3", "--attach-delay", "1", "--window", "14", "--", str(exes["leak_before"]), "10", "60")
        rows += compare("leak_before, --attach-delay", vg.exit, doc, pat, before_prefix="pat_before")
        for i, argv in enumerate((["perl", "-e", "1"], ["sort", "/etc/passwd"])):
            exe = shutil.which(argv[0])
            if exe is None:
                print(f"({argv[0]} is not installed: skipped)")
                continue
            vg = oracle.run(exe, *argv[1:], xml=tmp / f"r{i}.xml")
            doc = memtrace(tmp / f"r{i}", "--window", "60", "--", exe, *argv[1:])
            rows += compare(" ".join(argv) + ", exit", vg.exit, doc, oracle.first_caller)
    head = ("program, when", "stack", "valgrind lost blocks / bytes", "memtrace leaked blocks / bytes", "same")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(5)]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    bad = [r for r in rows if r[4] != "yes"]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} rows agree")
    return 1 if bad else 0


def scale(n: int, mib: int, with_valgrind: bool) -> int:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = tmp / "leak_heap"
        subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", str(exe),
                        str(ROOT / "bench" / "leak_heap.c")], check=True)
        t0 = time.monotonic()
        doc = memtrace(tmp / "cap", "--window", str(max(20, n // 25000)), "--", str(exe), str(n), str(mib << 20), "600",
                       timeout=1800)
        wall = time.monotonic() - t0
        leaks, scan = doc["leaks"], doc["leaks"]["scan"]
        print(f"heap: {n:,} blocks, {mib:,} MiB (every 100th leaked)")
        print(f"examined: {scan['examined']:,} blocks ({scan['tracked_blocks']:,} traced); "
              f"every block: {scan['every_block_examined']}")
        print(f"leaked: {leaks['leaked']['blocks']:,} blocks, {leaks['leaked']['bytes']:,} B "
              f"(expected {n // 100:,} blocks)")
        print(f"read: {scan['root_bytes']:,} B of roots, {scan['block_bytes']:,} B of blocks")
        print(f"world stopped: {scan['world_stopped_ms']:,} ms (stopping {scan['stop_ms']:,} ms, collecting "
              f"{scan['collect_ms']:,} ms, scanning {scan['scan_ms']:,} ms); budget {scan['budget_ms']:,} ms "
              f"= {scan['world_stopped_ms'] / scan['budget_ms']:.1%} of it")
        print(f"memtrace run, wall: {wall:.1f} s (the program's own filling included)")
        if with_valgrind:
            t0 = time.monotonic()
            subprocess.run([oracle.valgrind() or "valgrind", "--leak-check=full", "-q", str(exe), str(n),
                            str(mib << 20), "0"], capture_output=True, check=False)
            print(f"valgrind --leak-check=full, wall: {time.monotonic() - t0:.1f} s (filling + one check at exit)")
    return 0


def exit_scan(n: int, rounds: int, base: Path | None) -> int:
    srcs = {"this": ROOT / "src", **({"base": base} if base is not None else {})}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = tmp / "exit_threads"
        subprocess.run(["gcc", *CFLAGS, "-o", str(exe), str(ROOT / "tests" / "programs" / "exit_threads.c")],
                       check=True)
        print(f"exit_threads: {n} threads blocked at exit, no decoys; {os.getloadavg()[0]:.1f} load (1 min)")
        print("round | tree | threads stopped | exit calls | searched: threads, words, reads, ms | scan ms | "
              "world stopped ms | leaked blocks")
        for r in range(rounds):
            for name, src in srcs.items():
                doc = memtrace(tmp / f"{name}{r}", "--window", "120", "--", str(exe), str(n), "no-decoy",
                               src=src)
                scan = doc["leaks"]["scan"]
                es = scan.get("exit_search")
                searched = "-" if es is None else f"{es['threads']}, {es['words']:,}, {es['reads']}, {es['ms']:.2f}"
                print(f"{r} | {name} | {scan['threads_stopped']} | {scan['exit_call_threads']} | {searched} | "
                      f"{scan['scan_ms']} | {scan['world_stopped_ms']} | {doc['leaks']['leaked']['blocks']}")
    return 0


def main() -> int:
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return
    if not args or args[0] == "parity":
        return parity()
    if args[0] == "scale":
        rest = [a for a in args[1:] if not a.startswith("--")]
        n = int(rest[0]) if rest else 1_000_000
        mib = int(rest[1]) if len(rest) > 1 else 2048
        return scale(n, mib, "--valgrind" in args)
    if args[0] == "exit":
        rest: list[str] = []
        opts: dict[str, str] = {}
        it = iter(args[1:])
        for a in it:
            if a in ("--rounds", "--base"):
                opts[a] = next(it)
            else:
                rest.append(a)
        base = Path(opts["--base"]) if "--base" in opts else None
        return exit_scan(int(rest[0]) if rest else 500, int(opts.get("--rounds", 3)), base)
    raise SystemExit(__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
