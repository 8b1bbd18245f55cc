"""Files that are not what they seem (issue 27, items 2 and 5): outputs that are FIFOs or device
nodes, a full standard output, billion-laughs and FIFO plans, a debug section claiming 1 TiB.

Each is refused or survived with one line and the right exit status; nothing blocks, nothing is
replaced, nothing aborts.  Device nodes are made with mknod in a temporary folder, never /dev's own.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import ROOT, run_memtrace
from tests.hostile_captures import MODULES, aggregate_base, base, js, write_records

NOT_REGULAR = "not a regular file (output goes only to regular files, or to standard output without -o)"


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    return write_records(tmp_path / "cap" / "capture.mtc", aggregate_base())


def special_outputs(tmp_path: Path) -> list[tuple[Path, str, int]]:
    """(path, what it is, its st_mode kind): a FIFO always, a character device when mknod works."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    made = [(fifo, "a FIFO", stat.S_IFIFO)]
    node = tmp_path / "null-node"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))      # the same device as /dev/null
        made.append((node, "a character device", stat.S_IFCHR))
    except (PermissionError, OSError):
        pass                        # not root: the FIFO still proves the check
    return made


OUTPUT_COMMANDS = [
    ["export", "-o", "{out}", "{cap}"],
    ["export", "--format", "collapsed", "-o", "{out}", "{cap}"],
    ["export", "--format", "pprof", "-o", "{out}", "{cap}"],
    ["flamegraph", "-o", "{out}", "{cap}"],
]


@pytest.mark.parametrize("cmd", OUTPUT_COMMANDS, ids=lambda c: "-".join(c[:3]))
def test_an_output_that_is_a_fifo_or_device_is_refused_and_left_alone(tmp_path: Path, capture: Path,
                                                                      cmd: list[str]) -> None:
    for path, what, kind in special_outputs(tmp_path):
        r = run_memtrace(*[a.format(out=path, cap=capture) for a in cmd], check=False, timeout=60)
        assert r.returncode == 2, r.stderr
        assert r.stderr == f"memtrace: error: -o {path}: cannot write: it is {what}, {NOT_REGULAR}\n"
        assert stat.S_IFMT(os.stat(path).st_mode) == kind          # still what it was, not a file
        assert not [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")]  # no temporary


@pytest.mark.parametrize("cmd", OUTPUT_COMMANDS[::3], ids=lambda c: "-".join(c[:3]))
def test_a_link_to_a_device_or_a_folder_is_refused_and_left_as_it_was(tmp_path: Path, capture: Path,
                                                                     cmd: list[str]) -> None:
    """A symbolic link to a device node (as to /dev/null) is the node; a folder is not a file."""
    folder = tmp_path / "a-folder"
    folder.mkdir()
    cases = [(folder, "a folder")]
    for target, what, _ in special_outputs(tmp_path):
        link = tmp_path / f"link-to-{target.name}"
        link.symlink_to(target)
        cases.append((link, what))
    for path, what in cases:
        r = run_memtrace(*[a.format(out=path, cap=capture) for a in cmd], check=False, timeout=60)
        assert (r.returncode, r.stderr) == (2, f"memtrace: error: -o {path}: cannot write: it is {what}, "
                                               f"{NOT_REGULAR}\n")
        assert path.is_dir() or path.is_symlink()
    assert list(folder.iterdir()) == []


def test_a_link_is_written_through_and_kept(tmp_path: Path, capture: Path) -> None:
    """Before: the link was replaced by a file (a link to a file elsewhere lost its meaning)."""
    real = tmp_path / "elsewhere" / "out.jsonl"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "out-link"
    link.symlink_to(real)
    run_memtrace("export", "-o", link, capture, timeout=60)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text().startswith('{"record":"meta"')


def test_dev_stdout_as_the_output_is_standard_output_and_never_replaced(tmp_path: Path, capture: Path) -> None:
    """`-o /dev/stdout` with standard output a file: /dev/stdout is a link (to /proc/self/fd/1), and
    as root the old code renamed a file over it -- the machine's /dev/stdout gone.  The test's own
    link to /proc/self/fd/1 stands for it (never /dev's own).  The output goes to standard output."""
    link = tmp_path / "stdout-link"
    link.symlink_to("/proc/self/fd/1")
    for cmd in (["export", "-o", link, capture], ["flamegraph", "-o", link, capture]):
        into = tmp_path / "redirected"
        with open(into, "w") as stdout:
            r = subprocess.run([sys.executable, "-m", "memtrace.cli", *map(str, cmd)], stdout=stdout,
                               stderr=subprocess.PIPE, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert r.returncode == 0, r.stderr
        assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
        text = into.read_text()
        assert text.startswith('{"record":"meta"') if cmd[0] == "export" else "<html" in text[:400].lower()
    # Standard output a pipe: /dev/stdout is that pipe, written as without -o.
    piped = run_memtrace("export", "-o", link, capture, timeout=60)
    assert piped.stdout == run_memtrace("export", capture, timeout=60).stdout


def test_a_link_to_dev_null_is_refused_even_with_stdout_dev_null(tmp_path: Path, capture: Path) -> None:
    """Only a name of standard output (/dev/stdout, /proc/self/fd/1) is written as standard output:
    another path to the same file is still refused by what it is."""
    link = tmp_path / "null-link"
    link.symlink_to(os.devnull)
    r = subprocess.run([sys.executable, "-m", "memtrace.cli", "export", "-o", str(link), str(capture)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert (r.returncode, r.stderr) == (2, f"memtrace: error: -o {link}: cannot write: it is a character device, "
                                           f"{NOT_REGULAR}\n")
    assert link.is_symlink() and stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_dev_stdout_full_is_one_line_and_non_zero(tmp_path: Path, capture: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this machine")
    link = tmp_path / "stdout-link"
    link.symlink_to("/proc/self/fd/1")
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "memtrace.cli", "export", "-o", str(link), str(capture)],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert (r.returncode, r.stderr) == (2, f"memtrace: error: -o {link}: cannot write: No space left on device\n")


def test_a_report_folder_holding_a_fifo_or_device_says_each_skipped(tmp_path: Path, capture: Path) -> None:
    """A FIFO named like a capture would block the report for ever; before, it was dropped unsaid."""
    folder = tmp_path / "captures"
    (folder / "good").mkdir(parents=True)
    shutil.copy(capture, folder / "good" / "capture.mtc")
    (folder / "piped").mkdir()
    os.mkfifo(folder / "piped" / "capture.mtc")
    os.mkfifo(folder / "census-1.json")
    (folder / "zero.mtc").symlink_to("/dev/zero")
    r = run_memtrace("report", folder, "--out", tmp_path / "out", check=False, timeout=60)
    assert r.returncode == 1, r.stderr          # something skipped: the report is incomplete
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("memtrace: skipped")] == [
        "memtrace: skipped: census-1.json: not a regular file (a FIFO); not read",
        "memtrace: skipped: piped/capture.mtc: not a regular file (a FIFO); not read",
        "memtrace: skipped: zero.mtc: not a regular file (a character device); not read"]
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["path"] for r in doc["panorama"][0]["malloc_runs"]] == ["good/capture.mtc"]
    only = tmp_path / "only-fifo"
    only.mkdir()
    os.mkfifo(only / "x.mtc")
    r = run_memtrace("report", only, "--out", tmp_path / "out2", check=False, timeout=60)
    assert r.returncode == 1 and "x.mtc: not a regular file (a FIFO); not read" in r.stderr


def test_diff_of_a_folder_holding_a_fifo_capture_names_it(tmp_path: Path, capture: Path) -> None:
    """Before: the FIFO was dropped unsaid from a folder of captures (or, alone, "no capture")."""
    folder = tmp_path / "new"
    (folder / "piped").mkdir(parents=True)
    shutil.copy(capture, folder / "kept.mtc")
    os.mkfifo(folder / "piped" / "capture.mtc")
    for side in (folder, folder / "piped", folder / "piped" / "capture.mtc"):
        r = run_memtrace("diff", capture, side, check=False, timeout=30)
        assert (r.returncode, r.stderr) == (2, f"memtrace: error: {folder / 'piped' / 'capture.mtc'}: not a regular "
                                               f"file (a capture is a file, not a FIFO, device or socket)\n")


def test_a_jetsam_folder_holding_a_fifo_says_it_skipped(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "JetsamEvent-1.ips")
    r = run_memtrace("jetsam", tmp_path, check=False, timeout=30)
    assert r.returncode == 1
    assert (f"memtrace: skipped {tmp_path}/JetsamEvent-1.ips: not a regular file (a FIFO, device or socket); "
            f"not read") in r.stderr


def test_a_plan_with_a_100_mb_line_is_refused_without_reading_it(tmp_path: Path) -> None:
    p = tmp_path / "plan.yaml"
    with open(p, "w") as f:
        f.write("runs: [{label: x, tracer: malloc, argv: [/bin/true], note: ")
        f.truncate(100 << 20)               # sparse: 100 MB of one line without writing them
    r = run_memtrace("batch", p, check=False, timeout=30)
    assert (r.returncode, r.stderr) == (2, f"memtrace: error: {p}: {100 << 20} bytes is too large for a plan "
                                           f"(at most {4 << 20})\n")


def test_a_report_file_that_is_a_fifo_is_refused(tmp_path: Path, capture: Path) -> None:
    out = tmp_path / "report"
    out.mkdir()
    os.mkfifo(out / "REPORT.md")
    r = run_memtrace("report", capture.parent, "--out", out, check=False, timeout=60)
    assert r.returncode == 2 and "REPORT.md: cannot write: it is a FIFO" in r.stderr
    assert r.stderr.count("\n") == 1 and stat.S_ISFIFO(os.stat(out / "REPORT.md").st_mode)


@pytest.mark.parametrize("args", [["show"], ["show", "--json"], ["export"], ["export", "--format", "collapsed"],
                                  ["diff", "{cap}"]], ids=lambda a: "-".join(a))
def test_a_full_standard_output_is_one_line_and_exit_1(capture: Path, args: list[str]) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this machine")
    cmd = [sys.executable, "-m", "memtrace.cli", *[a.format(cap=capture) for a in args], str(capture)]
    with open("/dev/full", "w") as full:
        r = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 1
    assert r.stderr == "memtrace: error: standard output: cannot write: No space left on device\n"


LAUGHS = "\n".join([
    'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
    *[f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)],
    "runs: [{label: x, tracer: malloc, argv: [/bin/true], window: *i}]",
]) + "\n"


@pytest.mark.parametrize(("name", "text", "said"), [
    ("laughs.yaml", LAUGHS, "YAML aliases expand to more than 200000 values (a \"billion laughs\" document), refused"),
    ("loop.yaml", "runs: &r [*r]\n", "YAML aliases refer to themselves (a document that never ends)"),
    ("deep.yaml", "[" * 50000 + "]" * 50000 + "\n", "YAML nested too deeply"),
])
def test_hostile_plans_and_rules_are_refused_in_one_line(tmp_path: Path, capture: Path, name: str, text: str,
                                                         said: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    r = run_memtrace("batch", p, check=False, timeout=60)
    assert (r.returncode, r.stderr) == (2, f"memtrace: error: {p}: {said}\n")
    r = run_memtrace("report", capture.parent, "--families", p, "--out", tmp_path / "out", check=False, timeout=60)
    assert (r.returncode, r.stderr) == (2, f"memtrace: error: {p}: {said}\n")


def test_a_fifo_plan_or_rules_file_is_refused_at_once(tmp_path: Path, capture: Path) -> None:
    fifo = tmp_path / "plan.yaml"
    os.mkfifo(fifo)                 # nobody writes it: a blocking open would time out
    r = run_memtrace("batch", fifo, check=False, timeout=30)
    assert (r.returncode, r.stderr) == (2, f"memtrace: error: {fifo}: not a regular file (a plan is a file, "
                                           f"not a FIFO, device or socket)\n")
    r = run_memtrace("report", capture.parent, "--families", fifo, "--out", tmp_path / "out", check=False, timeout=30)
    assert r.returncode == 2 and "not a regular file (a family rules file is a file" in r.stderr


def _debug_bomb(folder: Path) -> Path:
    """A real ELF whose zlib-compressed .debug_info says it inflates to 1 TiB."""
    from elftools.elf.elffile import ELFFile

    if shutil.which("gcc") is None or shutil.which("objcopy") is None:
        pytest.skip("needs gcc and objcopy to build the test binary")
    src = folder / "m.c"
    src.write_text("int f(int x) { return x * 3; }\nint main(void) { return f(2); }\n")
    subprocess.run(["gcc", "-g", "-O0", "-o", folder / "m", src], check=True)
    packed = folder / "bomb"
    subprocess.run(["objcopy", "--compress-debug-sections=zlib", folder / "m", packed], check=True)
    data = bytearray(packed.read_bytes())
    with open(packed, "rb") as f:
        info = next(s for s in ELFFile(f).iter_sections() if s.name == ".debug_info")
        assert info.compressed
        offset = info["sh_offset"]
    struct.pack_into("<Q", data, offset + 8, 1 << 40)      # Elf64_Chdr.ch_size
    packed.write_bytes(data)
    return packed


def test_a_debug_section_claiming_a_tebibyte_is_not_opened(tmp_path: Path) -> None:
    bomb = _debug_bomb(tmp_path)
    recs = base()
    recs[2] = (MODULES, js({"modules": [{"name": "bomb", "path": str(bomb), "base": "0x1000", "size": 16384}]}))
    cap = write_records(tmp_path / "cap" / "capture.mtc", recs)
    r = run_memtrace("symbolize", cap, check=False, timeout=120)
    # Before: symbolic tried to allocate 1 TiB and aborted the process (SIGABRT, exit 134).
    assert r.returncode == 0, r.stderr
    assert "compressed section .debug_info claims 1099511627776 bytes from" in r.stdout
    assert "memory allocation" not in r.stderr


def test_a_fifo_jetsam_report_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "JetsamEvent-1.ips"
    os.mkfifo(fifo)
    r = run_memtrace("jetsam", fifo, check=False, timeout=30)
    assert (r.returncode, r.stderr) == (2, f"memtrace: error: {fifo}: not a regular file (a report is a file, "
                                           f"not a FIFO, device or socket)\n")
