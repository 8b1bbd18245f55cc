"""Where a traced program's time goes, by function of memtrace's C core (`perf record -e cpu-clock`).

    python bench/cmodule_profile.py [--freq HZ] [--all-threads] [--annotate FUNCTION] [--memtrace-option OPT]... -- PROGRAM [ARGS...]

Runs PROGRAM under `memtrace malloc` (its default: every allocation stacked, every block tracked)
inside `perf record` and prints, for the target's main thread, the share of its samples in the
CModule by function, in each library, and the hottest symbols elsewhere; and the share of each of
the target's threads (memtrace's drain runs on Frida's JavaScript thread); --all-threads: all of
the target's threads together instead of its main thread (a program whose work is in threads);
--annotate: also the hottest instructions of one of the core's functions, as objdump shows them;
--memtrace-option: one more argument for `memtrace malloc` (repeat it: `--memtrace-option
--stack-threshold --memtrace-option 1099511627776` profiles tracking without stacks).  The CModule's code is
anonymous memory to perf: its samples are matched against every host-built module in the cache
and the gcc stand-in's cached module.so files (memtrace.frida_host.gcc_cache_shim), trying each at every page-aligned load address and keeping the
one that puts the most samples inside the hook and tracking functions.  Shares of one run are what
to compare (the core's samples against the program's own): on a shared machine the load moves
absolute times far more than it moves them.  perf must be allowed to sample (perf_event_paranoid
<= 2 for one's own processes).
"""

from __future__ import annotations

import bisect
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def symbols(so: Path) -> list[tuple[int, str]]:
    out = subprocess.run(["nm", "-n", "--defined-only", str(so)], capture_output=True, text=True).stdout
    return [(int(a, 16), n) for a, t, n in (line.split() for line in out.splitlines() if len(line.split()) == 3)
            if t in "tT"]


def instruction_starts(so: Path) -> set[int]:
    """Every instruction's offset in the module's code, from objdump."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True).stdout
    out = set()
    for line in text.splitlines():
        head, _, rest = line.partition(":")
        if rest and head.strip() and all(c in "0123456789abcdef" for c in head.strip()):
            out.add(int(head.strip(), 16))
    return out


def best_fit(ips: list[int], candidates: list[Path]) -> tuple[Path, int, collections.Counter[str]] | None:
    """The module file and load address under which the most samples fall on an instruction's first
    byte (x86's instructions have every length: at a wrong address a sample mostly falls inside one,
    where scoring by the samples that land in hot functions let a wrong address win whenever the
    hot code moved into a function inlined elsewhere)."""
    best: tuple[int, Path, int] | None = None
    lo = min(ips) & ~0xFFF
    for so in candidates:
        starts = instruction_starts(so)
        if not starts:
            continue
        for base in range(lo - 0x40000, lo + 0x1000, 0x1000):
            score = sum(1 for ip in ips if ip - base in starts)
            if best is None or score > best[0]:
                best = (score, so, base)
    if best is None:
        return None
    _, so, base = best
    syms = symbols(so)
    addrs = [a for a, _ in syms]
    by: collections.Counter[str] = collections.Counter()
    for ip in ips:
        i = bisect.bisect_right(addrs, ip - base) - 1
        if i >= 0 and ip - base < addrs[-1] + 0x1000:
            by[syms[i][1].split(".")[0]] += 1
    return so, base, by


def print_annotation(so: Path, base: int, ips: list[int], function: str, n: int) -> None:
    """The hottest instructions of `function` in the module `so` loaded at `base`, with objdump's text."""
    syms = symbols(so)
    addrs = [a for a, _ in syms]
    hits: collections.Counter[int] = collections.Counter()
    for ip in ips:
        i = bisect.bisect_right(addrs, ip - base) - 1
        if i >= 0 and syms[i][1].split(".")[0] == function:
            hits[ip - base] += 1
    if not hits:
        print(f"  {function}: no samples")
        return
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True).stdout
    lines = {}
    for line in text.splitlines():
        head, _, rest = line.partition(":")
        if rest and head.strip() and all(c in "0123456789abcdef" for c in head.strip()):
            lines[int(head.strip(), 16)] = rest.strip()
    print(f"  {function}: {sum(hits.values())} samples; the hottest instructions (a sample lands on the one after "
          f"the instruction that waited):")
    for off, k in hits.most_common(20):
        print(f"    {off:#8x} {100 * k / n:5.1f} %  {lines.get(off, '?')}")


def main() -> None:
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return
    freq = "2000"
    all_threads = False
    annotate = None
    options: list[str] = []
    while args[:1] in (["--freq"], ["--all-threads"], ["--annotate"], ["--memtrace-option"]):
        if args[0] == "--freq":
            freq, args = args[1], args[2:]
        elif args[0] == "--memtrace-option":
            options, args = [*options, args[1]], args[2:]
        elif args[0] == "--annotate":
            annotate, args = args[1], args[2:]
        else:
            all_threads, args = True, args[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.exit(__doc__)
    if shutil.which("perf") is None:
        sys.exit("cmodule_profile: perf is not installed (apt-get install -y linux-perf)")
    program = Path(args[0]).resolve() if os.path.exists(args[0]) else Path(shutil.which(args[0]) or args[0])
    comm = program.name[:15]
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "perf.data"
        cmd = ["perf", "record", "-q", "-e", "cpu-clock", "-F", freq, "-o", str(data), "--", sys.executable, "-m",
               "memtrace.cli", "malloc", "--device", "local", "--window", "600", *options, "--out", str(Path(d) / "cap"),
               "--", str(program), *args[1:]]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        text = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,pid,tid,ip,sym,dso"],
                              capture_output=True, text=True).stdout
    rows = []
    for line in text.splitlines():
        parts = line.split()
        at = next((i for i, p in enumerate(parts) if "/" in p and p.split("/")[0].isdigit()), None)
        if at is None or at + 1 >= len(parts):
            continue
        pid, tid = (int(x) for x in parts[at].split("/"))
        rows.append((" ".join(parts[:at]), pid, tid, int(parts[at + 1], 16), " ".join(parts[at + 2:])))
    mains = collections.Counter(pid for c, pid, tid, _, _ in rows if c == comm and pid == tid)
    if not mains:
        sys.exit(f"cmodule_profile: no samples of {comm}")
    target = mains.most_common(1)[0][0]
    mine = [r for r in rows if r[1] == target]
    threads = collections.Counter(tid for _, _, tid, _, _ in mine)
    print(f"target {comm} (pid {target}): {len(mine)} samples")
    for tid, n in threads.most_common(6):
        print(f"  thread {tid}{' (main)' if tid == target else ''}: {100 * n / len(mine):.1f} %")
    main_rows = mine if all_threads else [r for r in mine if r[2] == target]

    def anonymous(rest: str) -> bool:
        """Code perf has no file for (the CModule, Frida's trampolines)."""
        dso = rest.rsplit("(", 1)[-1].rstrip(")")
        return "JIT" in rest or dso == "[unknown]" or dso.startswith("/tmp/perf-")

    anon = [ip for _, _, _, ip, rest in main_rows if anonymous(rest) and ip < 1 << 63]
    libs: collections.Counter[str] = collections.Counter()
    syms: collections.Counter[str] = collections.Counter()
    for _, _, _, _ip, rest in main_rows:
        if anonymous(rest):
            continue
        lib = rest.rsplit("(", 1)[-1].rstrip(")").split("/")[-1]
        libs[lib] += 1
        syms[f"{rest.split('(')[0].split('+')[0].strip()} ({lib})"] += 1
    n = len(main_rows)
    if anon:
        mid = statistics.median(anon)
        anon = [ip for ip in anon if abs(ip - mid) < 0x20000]
    # The core the host built (agentbuild.precompiled_module: cmodule-KEY.so, loaded as it is), and
    # the modules the gcc stand-in kept (a core the agent compiled from the host's assembly).
    cache = Path(os.environ.get("MEMTRACE_CACHE_DIR") or Path.home() / ".cache" / "memtrace" / "agents")
    # Every one, not the newest few: a cache hit leaves its file untouched (agentbuild), so the
    # module in use may be the oldest there, and the newest a build tried once and left.
    shims = sorted(cache.glob("cmodule-*.so")) + sorted(cache.glob("cmodule-gcc-*/*.so"))
    fit = best_fit(anon, shims) if anon and shims else None
    who = "all threads" if all_threads else "main thread"
    kernel = sum(1 for _, _, _, ip, _ in main_rows if ip >= 1 << 63)
    user = n - kernel - len(anon)
    print(f"{who}: {n} samples; in the CModule {100 * len(anon) / n:.1f} %; the CModule against the rest of "
          f"user space: {len(anon) / max(user, 1):.2f}")
    if fit is not None:
        so, base, by = fit
        print(f"  (module {so.name} at {base:#x})")
        for name, k in by.most_common(14):
            print(f"  {name:34} {100 * k / n:5.1f} %")
        if annotate is not None:
            print_annotation(so, base, anon, annotate, n)
    print(f"{who}, by library (outside the CModule):")
    for lib, k in libs.most_common(8):
        print(f"  {lib:34} {100 * k / n:5.1f} %")
    print(f"{who}, hottest symbols outside the CModule:")
    for s, k in syms.most_common(12):
        print(f"  {s[:70]:70} {100 * k / n:5.1f} %")


if __name__ == "__main__":
    main()
