"""Issue 20, "see everything a program does", on real processes: the user's stdin reaches a spawned
program, windows say what they did, the crash frame is the faulting instruction's, split functions
carry their parent's name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memtrace.capture import RecordType, read_records

from ..conftest import ROOT, build_ctor_user, memtrace_json, run_memtrace, wait_streaming  # noqa: TID252

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")


def _cli(*args: str | Path, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "memtrace.cli", *map(str, args)], input=stdin,
                          capture_output=True, timeout=timeout, env=env)


def _records(capture: Path, rtype: RecordType) -> list[dict]:
    return [r.body for r in read_records(capture) if r.type == rtype]


# -- 3. stdin -------------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="sqlite3 is not installed")
def test_a_spawned_program_reads_the_users_stdin(tmp_path: Path) -> None:
    # The issue's own example: before, sqlite3 printed nothing and waited out the window.
    r = _cli("malloc", "--device", "local", "--quiet", "--out", tmp_path / "c", "--", "sqlite3",
             stdin=b"select 40+2;\n")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().splitlines() == ["42"]
    end = _records(tmp_path / "c" / "capture.mtc", RecordType.END)[0]
    assert end["ended"] == "target-exited" and "exit status 0" in end["reason"]


def test_stdin_from_a_file_and_json_stays_clean(tmp_path: Path) -> None:
    # A file as stdin; with --json the program's stdout goes to stderr and stdout is the document.
    data = tmp_path / "in.txt"
    data.write_bytes(b"alpha\nbeta\n" * 1000)
    with data.open("rb") as f:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        r = subprocess.run([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--json",
                            "--out", str(tmp_path / "c"), "--", "wc", "-l"], stdin=f, capture_output=True,
                           timeout=120, env=env)
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)
    assert doc["ended"] == "target-exited"
    assert "2000" in r.stderr.decode().split()



def test_a_terminal_as_stdin_is_the_programs_own(tmp_path: Path) -> None:
    # memtrace run on a terminal (a pty): the program sees a terminal as its stdin (isatty) and
    # reads the line typed there.
    import pty
    import select
    import time

    argv = [sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--quiet", "--out",
            str(tmp_path / "c"), "--", "/bin/sh", "-c", "if test -t 0; then echo tty-yes; else echo tty-no; fi; "
            "read line; echo got-$line"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    pid, fd = pty.fork()
    if pid == 0:                                    # the child: memtrace on the pty
        os.execve(sys.executable, argv, env)
    out, typed, status = b"", False, None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    data = os.read(fd, 4096)
                except OSError:                     # EIO: every holder of the pty closed it
                    break
                if not data:
                    break
                out += data
                if b"tty-" in out and not typed:
                    os.write(fd, b"typed\n")
                    typed = True
    finally:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            os.kill(pid, 9)
            _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, out
    lines = out.decode().replace("\r", "").splitlines()
    assert "tty-yes" in lines and "got-typed" in lines, lines

# -- 4. windows -----------------------------------------------------------------------------------

def test_a_program_runs_to_its_end_without_a_window(tmp_path: Path) -> None:
    # No window cuts it; META and the summary say there was none.
    s = memtrace_json("malloc", "--device", "local", "--out", tmp_path / "c", "--", "sleep", "1.5")
    assert s["ended"] == "target-exited", s["reason"]
    assert s["window_s"] is None
    meta = _records(tmp_path / "c" / "capture.mtc", RecordType.META)[0]
    assert meta["options"]["window"] is None


def test_a_window_cut_says_so_in_summary_end_and_report(tmp_path: Path) -> None:
    r = run_memtrace("malloc", "--device", "local", "--window", "1", "--out", tmp_path / "c", "--", "sleep", "30")
    assert "window ended after 1 s; the target was killed" in r.stdout
    end = _records(tmp_path / "c" / "capture.mtc", RecordType.END)[0]
    assert end["reason"] == "window ended after 1 s; the target was killed"
    assert end["evidence"]["window_end"] == {"after_s": 1.0, "target": "killed"}
    rep = run_memtrace("report", tmp_path / "c")
    assert rep.returncode == 0
    text = (tmp_path / "c" / "REPORT.md").read_text()
    assert "window ended after 1 s; the target was killed" in text


def test_a_window_cut_with_keep_running_leaves_it_running(tmp_path: Path) -> None:
    s = memtrace_json("malloc", "--device", "local", "--window", "1", "--keep-running", "--out", tmp_path / "c",
                      "--", "sleep", "30")
    try:
        assert s["reason"] == "window ended after 1 s; the target was left running"
        pid = _records(tmp_path / "c" / "capture.mtc", RecordType.END)[0]["pid"]
        assert Path(f"/proc/{pid}").exists()
    finally:
        end = _records(tmp_path / "c" / "capture.mtc", RecordType.END)[0]
        if Path(f"/proc/{end['pid']}").exists():
            os.kill(end["pid"], 9)


@pytest.mark.parametrize("by", ["--pid", "--name"])
def test_an_attached_process_keeps_the_default_window(by: str, tmp_path: Path) -> None:
    # The target ends once the capture streams (not after a fixed few seconds, which a loaded machine
    # could spend before the attach): the default window would have run on for a minute.
    sleeper = tmp_path / f"sleeper-{os.getpid()}"        # a name no other process has
    shutil.copy(shutil.which("sleep") or "/bin/sleep", sleeper)
    target = subprocess.Popen([str(sleeper), "600"])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    mt = subprocess.Popen([sys.executable, "-m", "memtrace.cli", "malloc", "--json", "--device", "local",
                           by, str(target.pid) if by == "--pid" else sleeper.name, "--out", str(tmp_path / "c")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_streaming(tmp_path / "c" / "capture.mtc", timeout=120)
        target.terminate()
        out, err = mt.communicate(timeout=120)
    finally:
        for p in (target, mt):
            if p.poll() is None:
                p.kill()
            p.wait()
    assert mt.returncode == 0, err
    s = json.loads(out)
    meta = _records(tmp_path / "c" / "capture.mtc", RecordType.META)[0]
    assert meta["options"]["window"] == 60.0
    assert s["ended"] == "target-exited", s["reason"]


# -- 6. the crash frame ---------------------------------------------------------------------------

@pytest.mark.smoke
def test_the_faulting_pc_is_named_as_itself(compile_c, tmp_path: Path) -> None:
    # crash_first faults on its first byte, right after before_crash: read as a return address
    # (pc - 1) it was named before_crash.
    exe = compile_c("crash_first")
    s = memtrace_json("malloc", "--device", "local", "--out", tmp_path / "c", "--", exe)
    assert s["ended"] == "target-exited"
    assert s["reason"].startswith("the target crashed with SIGSEGV (write of 0x10) in crash_first (crash_first) "
                                  "<- main (crash_first)"), s["reason"]
    crash = _records(tmp_path / "c" / "capture.mtc", RecordType.END)[0]["evidence"]["crash"]
    top = crash["frames"][0]
    assert top["function"] == "crash_first" and top["offset"] is not None
    assert crash["pc"] == top["address"] == crash["stack"][0]
    assert crash["frames"][1]["function"] == "main"     # a return address: still read one byte back


# -- 7. split functions ---------------------------------------------------------------------------

@pytest.mark.parametrize("lang", ["c", "c++"])
def test_split_functions_are_named_by_their_parent(lang: str, compile_c, build_dir: Path, tmp_path: Path) -> None:
    # GCC moves build_index's branch that calls a cold function into build_index.cold
    # (_Z11build_indexi.cold in C++): the 5 blocks of 12,288 B made there are build_index's.
    src = ROOT / "tests" / "programs" / "split_parts.c"
    exe = build_dir / f"split_parts_{'cc' if lang == 'c++' else 'c'}"
    compiler = "g++" if lang == "c++" else "gcc"
    subprocess.run([compiler, "-O2", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-x", lang,
                    "-o", str(exe), str(src)], check=True)
    symbols = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    assert "build_index" in symbols and ".cold" in symbols        # the compiler did split it
    s = memtrace_json("malloc", "--device", "local", "--stack-threshold", "0", "--out", tmp_path / "c",
                      "--", exe, "5")
    rows = [x for x in s["top_stacks"] if x["frames"] and x["bytes"] == 5 * 12288]
    assert len(rows) == 1, s["top_stacks"]
    top = rows[0]["frames"][0]
    assert top["function"] == ("build_index(int)" if lang == "c++" else "build_index")
    assert top["part"] == "cold"
    assert rows[0]["frames"][1]["function"] == "main"
    shown = run_memtrace("show", tmp_path / "c").stdout
    assert ".cold" not in shown and "build_index" in shown



def test_cloned_and_partly_inlined_functions_are_named_by_their_parent(build_dir: Path, tmp_path: Path) -> None:
    # GCC's IPA-CP, ISRA and partial-inlining clones (make_block.constprop.0,
    # from_cfg.constprop.0.isra.0, maybe_grow.part.0): each named by its parent, the part a field.
    exe = build_dir / "split_clones"
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-o", str(exe),
                    str(ROOT / "tests" / "programs" / "split_clones.c")], check=True)
    symbols = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    clones = {"from_cfg.constprop.0.isra.0", "make_block.constprop.0", "maybe_grow.part.0"}
    if not clones <= {line.split()[-1] for line in symbols.splitlines()}:
        pytest.skip(f"this gcc made other clones: {sorted(n for n in symbols.split() if '.' in n and '_' in n)}")
    s = memtrace_json("malloc", "--device", "local", "--stack-threshold", "0", "--out", tmp_path / "c", "--", exe)
    by_bytes = {x["exact_bytes"]: x for x in s["top_stacks"] if x["frames"]}
    expected = {2 * 2345: (2, [("from_cfg", "constprop.0.isra.0"), ("main", None)]),
                3 * 4321: (3, [("make_block", "constprop.0"), ("main", None)]),
                # the part, then its parent's inlined early return in grow_a (as addr2line -i says)
                5432: (1, [("maybe_grow", "part.0"), ("maybe_grow", None), ("grow_a", None)])}
    for nbytes, (count, top) in expected.items():
        row = by_bytes[nbytes]
        assert row["count"] == count
        assert [(f["function"], f.get("part")) for f in row["frames"][:len(top)]] == top, row["frames"]
    shown = run_memtrace("show", tmp_path / "c").stdout
    assert not any(clone in shown for clone in clones) and "make_block" in shown


# -- 8. failing calls -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["aggregate", "events"])
def test_failed_calls_are_counted_by_kind_with_their_stacks_and_no_bytes(mode: str, compile_c, tmp_path: Path) -> None:
    # A 64 TiB malloc, realloc and posix_memalign, an overflowing calloc and reallocarray: each a
    # failed call of its kind on its own stack; the gross bytes are the 100 + 10 x 5,000 B that
    # succeeded (and stdout's buffer).  Before, 64 TiB went into the gross bytes.
    exe = compile_c("failing")
    extra = ["--events"] if mode == "events" else []
    s = memtrace_json("malloc", "--device", "local", *extra, "--out", tmp_path / "c", "--", exe)
    assert s["ended"] == "target-exited"
    assert s["failed"] == {"malloc": 1, "calloc": 1, "realloc": 1, "posix_memalign": 1, "memalign": 0,
                           "aligned_alloc": 0, "valloc": 0, "pvalloc": 0, "reallocarray": 1}
    for kind in ("calloc", "realloc", "posix_memalign", "reallocarray"):
        assert s["calls"][kind] == 1
    assert s["gross_bytes"] < 1 << 20
    # exactly the blocks that were granted: 100 B, stdout's buffer, 10 x 5,000 B
    assert sum(t["bytes"] for t in s["tiers"]) == s["gross_bytes"]
    assert s["tiers"][3] == {"max_bytes": 8192, "calls": 10, "bytes": 50000}
    assert s["tiers"][5]["calls"] == 0
    stacks = {x["frames"][0]["function"]: x["calls"] for x in s["failed_by_stack"]}
    assert stacks == {"fail_malloc": 1, "fail_calloc": 1, "fail_reallocarray": 1, "fail_realloc": 1,
                      "fail_posix_memalign": 1}
    assert all(x["frames"][1]["function"] == "main" for x in s["failed_by_stack"])
    assert not any(x["frames"] and x["frames"][0]["function"].startswith("fail_") for x in s["top_stacks"])
    shown = run_memtrace("show", tmp_path / "c").stdout
    assert "failed calls (returned NULL; no bytes counted): malloc 1, calloc 1, realloc 1," in shown.replace("\n", " ")



def _every_command(capture: Path, whole: Path, out: Path) -> dict[str, tuple[int, str]]:
    """Every command that reads a capture, in this process: {command line: (exit status, stderr)}."""
    import contextlib
    import io

    from memtrace import cli

    out.mkdir()
    commands = [["show", capture], ["show", "--json", capture], ["export", capture],
                ["export", "--format", "pprof", "-o", out / "p.pb", capture],
                ["flamegraph", "-o", out / "f.html", capture], ["report", capture.parent, "--out", out / "r"],
                ["diff", whole, capture], ["diff", capture, whole],
                ["symbolize", capture]]              # last: it rewrites the capture
    done = {}
    for cmd in commands:
        args = [str(a) for a in cmd]
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                cli.main(args)
                code = 0
            except SystemExit as e:
                code = int(e.code or 0)
        done[" ".join(cmd[:1] + [a for a in args[1:] if a.startswith("-")])] = (code, err.getvalue())
    return done


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_damaged_or_cut_real_capture_fails_every_command_and_only_the_bad_record_is_lost(compile_c,
                                                                                          tmp_path: Path) -> None:
    # A real capture with failed calls: one BATCH damaged, the reader skips it (naming its byte)
    # and reads every record after it, END included; cut short, it reads what is there.  Either
    # way every command that reads it exits 1 and says where.
    from memtrace.capture import CaptureInfo

    run_memtrace("malloc", "--device", "local", "--quiet", "--out", tmp_path / "c", "--", compile_c("failing"))
    whole = tmp_path / "c" / "capture.mtc"
    blob = whole.read_bytes()
    records = list(read_records(whole))
    batch = next(r for r in records if r.type == RecordType.BATCH)
    damaged = tmp_path / "damaged" / "capture.mtc"
    damaged.parent.mkdir()
    flipped = bytearray(blob)
    flipped[batch.offset + 20] ^= 0x10
    damaged.write_bytes(bytes(flipped))
    info = CaptureInfo(damaged)
    read = list(read_records(damaged, info))
    assert [r.offset for r in read] == [r.offset for r in records if r.offset != batch.offset]
    assert info.problem is not None and info.problem.startswith(f"corrupt at byte {batch.offset}: "), info.problem
    assert read[-1].type == RecordType.END and read[-1].body["ended"] == "target-exited"

    cut = tmp_path / "cut" / "capture.mtc"
    cut.parent.mkdir()
    cut.write_bytes(blob[:records[len(records) // 2].offset + 7])
    for capture, said in ((damaged, f"corrupt at byte {batch.offset}"), (cut, "truncated at byte")):
        results = _every_command(capture, whole, tmp_path / f"out-{capture.parent.name}")
        for command, (code, err) in results.items():
            assert code == 1, (capture.parent.name, command, code, err)
            assert said in err, (capture.parent.name, command, err)
            assert "Traceback" not in err


# -- 1. before the first constructor --------------------------------------------------------------

def test_library_constructors_are_traced_before_main(build_dir: Path, tmp_path: Path) -> None:
    # Before, Frida's spawn injected after every library constructor: this 12,345 B was unseen.
    exe = build_ctor_user(build_dir)
    s = memtrace_json("malloc", "--device", "local", "--stack-threshold", "0", "--out", tmp_path / "c", "--", exe)
    assert s["ended"] == "target-exited"
    rows = [x for x in s["top_stacks"] if x["exact_bytes"] == 12345]
    assert len(rows) == 1 and rows[0]["count"] == 1, s["top_stacks"]
    frames = rows[0]["frames"]
    assert frames[0]["function"] == "ctor_lib_init" and frames[0]["module"] == "libctor_lib.so"
    assert "_dl_init" in [f["function"] for f in frames]          # run by the loader, before main
    recon = _records(tmp_path / "c" / "capture.mtc", RecordType.RECON)[0]
    assert recon["hold"] == {"held": True}


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_every_cxx_programs_exception_pool_is_seen(build_dir: Path, tmp_path: Path) -> None:
    # libstdc++ allocates its 72,704 B emergency exception pool in its constructor.
    exe = build_dir / "cxx_hello"
    subprocess.run(["g++", "-g", "-o", str(exe), str(ROOT / "tests/programs/cxx_hello.cpp")], check=True)
    r = _cli("malloc", "--device", "local", "--json", "--stack-threshold", "0", "--out", tmp_path / "c", "--", exe)
    assert r.returncode == 0, r.stderr.decode()
    assert "hello" in r.stderr.decode()           # the program's stdout, on stderr under --json
    s = json.loads(r.stdout)
    rows = [x for x in s["top_stacks"] if x["exact_bytes"] == 72704]
    assert len(rows) == 1, s["top_stacks"]
    frames = rows[0]["frames"]
    assert frames[0]["module"].startswith("libstdc++.so")
    assert "_dl_init" in [f["function"] for f in frames]


def test_a_constructor_run_under_the_hold_keeps_libc_whole(compile_c, tmp_path: Path) -> None:
    # The injection at the hold point left libc's per-thread tables unset (printf("%f") crashed)
    # until the hold set them again: floats, the environment and the program name are intact.
    exe = compile_c("libc_state")
    r = _cli("malloc", "--device", "local", "--quiet", "--out", tmp_path / "c", "--", exe, "argument")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().splitlines() == ["3.250000 HOME-set libc_state argc=2 argument"]


# -- 2. modules as they load ----------------------------------------------------------------------

def test_a_dlopened_plugin_is_recorded_as_it_loads_and_walked_through(build_dir: Path, tmp_path: Path) -> None:
    # The plugin is loaded, run and unloaded within a few ms (the agent's module scan runs every
    # second), and built without frame pointers.  Before, its frames and call_plugin's were
    # dropped: the stack read main <- libc.
    plugin = build_dir / "plugin.so"
    exe = build_dir / "dlopen_user"
    subprocess.run(["gcc", "-O2", "-g", "-fomit-frame-pointer", "-shared", "-fPIC", "-o", str(plugin),
                    str(ROOT / "tests/programs/plugin.c")], check=True)
    subprocess.run(["gcc", "-O1", "-g", "-fno-omit-frame-pointer", "-o", str(exe),
                    str(ROOT / "tests/programs/dlopen_user.c"), "-ldl"], check=True)
    s = memtrace_json("malloc", "--device", "local", "--stack-threshold", "0", "--out", tmp_path / "c",
                      "--", exe, plugin)
    assert s["ended"] == "target-exited" and "exit status 0" in s["reason"]
    rows = [x for x in s["top_stacks"] if x["exact_bytes"] == 3 * 7777]
    assert len(rows) == 1 and rows[0]["count"] == 3, s["top_stacks"]
    names = [(f["function"], f["module"]) for f in rows[0]["frames"][:4]]
    assert names == [("plugin_fill", "plugin.so"), ("plugin_run", "plugin.so"), ("call_plugin", "dlopen_user"),
                     ("main", "dlopen_user")]
    modules = [m for r in _records(tmp_path / "c" / "capture.mtc", RecordType.MODULES) for m in r["modules"]]
    assert [m["path"] for m in modules if m["name"] == "plugin.so"] == [str(plugin)]
    # Recorded, the unloaded plugin can be symbolized again later from its file: every address in it.
    out = run_memtrace("symbolize", tmp_path / "c" / "capture.mtc").stdout
    (line,) = [ln.split() for ln in out.splitlines() if ln.split()[:1] == ["plugin.so"]]
    named, total = line[1].split("/")
    assert named == total and int(total) >= 2 and f"<- {plugin} (module file)" in out, out



@pytest.mark.skipif(os.uname().machine != "x86_64", reason="jit_frame's generated code is x86-64")
def test_an_address_in_no_module_is_shown_and_walked_past(compile_c, tmp_path: Path) -> None:
    # jit_callee is called from generated code in an anonymous executable mapping (as a JIT's):
    # its return address is in no module.  It is kept as "0x... (unknown)", and the walk goes on
    # past it (the generated code keeps a frame record) to through_jit and main.
    exe = compile_c("jit_frame")
    r = run_memtrace("malloc", "--device", "local", "--json", "--stack-threshold", "0", "--out", tmp_path / "c",
                     "--", exe)
    s = json.loads(r.stdout)
    assert s["ended"] == "target-exited" and "exit status 0" in s["reason"], s["reason"]
    code = int(next(ln for ln in r.stderr.splitlines() if ln.startswith("jit "))[4:], 16)
    rows = [x for x in s["top_stacks"] if x["exact_bytes"] == 3 * 8123]
    assert len(rows) == 1 and rows[0]["count"] == 3, s["top_stacks"]
    frames = rows[0]["frames"]
    assert [f["function"] for f in frames[:4]] == ["jit_callee", None, "through_jit", "main"]
    unknown = frames[1]
    assert unknown["module"] is None and int(unknown["address"], 16) == code + 12   # after its call *%rax
    shown = run_memtrace("show", tmp_path / "c").stdout
    assert f"{code + 12:#x} (unknown)" in shown


def _json_extension(python: str) -> str | None:
    r = subprocess.run([python, "-c", "import _json; print(getattr(_json, '__file__', ''))"], capture_output=True,
                       text=True, timeout=30)
    return r.stdout.strip() or None if r.returncode == 0 else None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cpython_extension_modules_frames_stay_on_the_stack(tmp_path: Path) -> None:
    # json.dumps runs in the _json extension module, loaded at run time: before, its frames and
    # every caller below them were dropped (half of a CPython flame graph was garbage).  Now the
    # stack goes from CPython's list growth through _json's (unnamed: the module is stripped)
    # frames to the interpreter loop that called it, and the module is recorded with its path.
    python = next((p for p in ("/usr/bin/python3", sys.executable) if os.path.exists(p) and _json_extension(p)), None)
    if python is None:
        pytest.skip("no CPython with _json as an extension module")
    extension = _json_extension(python)
    script = tmp_path / "dump.py"
    script.write_text("import json\nprint(len(json.dumps([{'k%d' % i: 'v' * 50} for i in range(20000)])))\n")
    s = memtrace_json("malloc", "--device", "local", "--stack-threshold", "0", "--out", tmp_path / "c", "--",
                      python, script, timeout=240)
    assert s["ended"] == "target-exited" and "exit status 0" in s["reason"], s["reason"]
    name = Path(str(extension)).name
    through = []
    for row in s["top_stacks"]:
        mods = [f["module"] for f in row["frames"]]
        if name in mods:
            first = mods.index(name)
            last = len(mods) - 1 - mods[::-1].index(name)
            through.append((row, mods[:first], mods[last + 1:]))
    assert through, [[f["module"] for f in r["frames"]] for r in s["top_stacks"]]
    for row, above, below in through:
        # what _json called (CPython's allocating functions) above, the interpreter that called it below
        assert above and above[0] is not None, row["frames"]
        assert below and all(m is not None for m in below), row["frames"]
        assert "_PyEval_EvalFrameDefault" in [f["function"] for f in row["frames"]], row["frames"]
    modules = [m for r in _records(tmp_path / "c" / "capture.mtc", RecordType.MODULES) for m in r["modules"]]
    assert [m["path"] for m in modules if m["name"] == name] == [os.path.realpath(str(extension))]


# -- 9. a peer profiler's test programs, our own equivalents -------------------------------------

@pytest.fixture(scope="module")
def peer_cases(build_dir: Path) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    exe = build_dir / "peer_cases"
    subprocess.run(["g++", "-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", str(exe),
                    str(ROOT / "tests/programs/peer_cases.cpp")], check=True)
    return exe


@pytest.mark.parametrize(("case", "size", "count", "top"), [
    ("throw", 1111, 5, ["operator new(unsigned long)", "alloc_then_throw(int)", "main"]),
    ("longjmp", 2222, 5, ["alloc_then_jump(int)", "main"]),
    ("exit", 3333, 1, ["alloc_before_exit(unsigned long)", "main"]),
    ("_exit", 3334, 1, ["alloc_before_exit(unsigned long)", "main"]),
    ("_Exit", 3335, 1, ["alloc_before_exit(unsigned long)", "main"]),
    ("tls", 4444, 4, ["Leaver::tls_destructor_alloc()", "Leaver::~Leaver()"]),
])
def test_peer_case_every_allocation_with_its_size_and_stack(case: str, size: int, count: int, top: list[str],
                                                            peer_cases: Path, tmp_path: Path) -> None:
    s = memtrace_json("malloc", "--device", "local", "--stack-threshold", "0", "--out", tmp_path / "c",
                      "--", peer_cases, case)
    assert s["ended"] == "target-exited" and "exit status 0" in s["reason"], s["reason"]
    rows = [x for x in s["top_stacks"] if x["exact_bytes"] == size * count and x["count"] == count]
    assert len(rows) == 1, s["top_stacks"]
    assert [f["function"] for f in rows[0]["frames"][:len(top)]] == top
    if case == "throw":
        # The exceptions' own allocations too: 5 exception objects (libstdc++'s 128 B header + a
        # 16 B std::runtime_error) and 5 messages (a 24 B string header + "unwind" and its NUL),
        # each on the stack of the throw.
        rows = [x for x in s["top_stacks"] if x["exact_bytes"] == 5 * 144 and x["count"] == 5]
        assert len(rows) == 1, s["top_stacks"]
        assert [f["function"] for f in rows[0]["frames"][:4]] == ["__cxa_allocate_exception", "throw_deeper(int)",
                                                                   "alloc_then_throw(int)", "main"]
        rows = [x for x in s["top_stacks"] if x["exact_bytes"] == 5 * 31 and x["count"] == 5]
        assert len(rows) == 1, s["top_stacks"]
        names = [f["function"] for f in rows[0]["frames"]]
        assert names[:1] == ["operator new(unsigned long)"] and "std::runtime_error::runtime_error(char const*)" in names
        assert names[names.index("throw_deeper(int)"):][:3] == ["throw_deeper(int)", "alloc_then_throw(int)", "main"]


def _top_rows(capture: Path) -> dict[str, tuple[int, int]]:
    from memtrace.analyze.malloc import summarize

    s = summarize(read_records(capture))
    return {r.frames[0].function or "": (round(r.count), r.exact_bytes) for r in s.stack_rows(None) if r.frames}


def test_peer_fork_with_threads_child_traced_from_its_first_line(compile_c, tmp_path: Path) -> None:
    exe = compile_c("peer_fork")
    out = tmp_path / "c"
    run_memtrace("malloc", "--device", "local", "--quiet", "--follow-children", "--stack-threshold", "0",
                 "--out", out, "--", exe, "threads")
    end = _records(out / "capture.mtc", RecordType.END)[0]
    (child,) = end["children"]
    assert child["origin"] == "fork" and (out / child["capture"]).exists()
    assert _top_rows(out / "capture.mtc")["thread_work"] == (3000, 3000 * 512)
    assert _top_rows(out / child["capture"])["child_work"] == (2, 2 * 5555)


def test_peer_fork_tree_grandchild_is_followed(compile_c, tmp_path: Path) -> None:
    exe = compile_c("peer_fork")
    out = tmp_path / "c"
    r = run_memtrace("malloc", "--device", "local", "--follow-children", "--stack-threshold", "0",
                     "--out", out, "--", exe, "tree")
    end = _records(out / "capture.mtc", RecordType.END)[0]
    (child,) = end["children"]
    child_end = _records(out / child["capture"], RecordType.END)[0]
    (grandchild,) = child_end["children"]
    assert grandchild["origin"] == "fork" and grandchild["ppid"] == child["pid"]
    assert _top_rows(out / grandchild["capture"])["grandchild_work"] == (1, 7070)
    # Messages name a capture file only once it exists.
    assert f"child pid {grandchild['pid']}: traced in {grandchild['capture']}" in r.stderr.replace("\n", " ")
    warnings = [w["message"] for w in _records(out / "capture.mtc", RecordType.WARNING)]
    assert all(".mtc" not in m for m in warnings), warnings


def test_peer_fork_then_exec_child_is_seen_before_its_exec(compile_c, tmp_path: Path) -> None:
    exe = compile_c("peer_fork")
    out = tmp_path / "c"
    run_memtrace("malloc", "--device", "local", "--quiet", "--follow-children", "--stack-threshold", "0",
                 "--out", out, "--", exe, "exec")
    end = _records(out / "capture.mtc", RecordType.END)[0]
    (child,) = end["children"]
    assert _top_rows(out / child["capture"])["before_exec"] == (1, 6000)
    child_end = _records(out / child["capture"], RecordType.END)[0]
    assert child_end["evidence"]["exec"]["path"] == "/proc/self/exe"


# -- 5. every child noticed -----------------------------------------------------------------------

def test_every_posix_spawn_is_noticed_and_listed(compile_c, tmp_path: Path) -> None:
    # Before, only the first posix_spawn was ever noticed (the later ones ran untold).
    exe = compile_c("peer_fork")
    out = tmp_path / "c"
    r = run_memtrace("malloc", "--device", "local", "--quiet", "--out", out, "--", exe, "spawns")
    assert "spawns 0" in r.stdout
    end = _records(out / "capture.mtc", RecordType.END)[0]
    assert [(c["origin"], c["path"]) for c in end["children"]] == [("spawn", "/proc/self/exe")] * 3
    assert len({c["pid"] for c in end["children"]}) == 3


@pytest.mark.slow
def test_short_lived_spawned_children_are_traced_from_before_their_constructors(compile_c, tmp_path: Path) -> None:
    # Three posix_spawn children that live a few ms each: before, none could be attached to in
    # time ("could not follow").  Each now waits at the hold point until its hooks are in.
    exe = compile_c("peer_fork")
    out = tmp_path / "c"
    run_memtrace("malloc", "--device", "local", "--quiet", "--follow-children", "--stack-threshold", "0",
                 "--out", out, "--", exe, "spawns")
    end = _records(out / "capture.mtc", RecordType.END)[0]
    assert len(end["children"]) == 3
    for child in end["children"]:
        assert child["origin"] == "spawn" and child["ended"] == "target-exited", child
        assert _top_rows(out / child["capture"])["leaf_work"] == (2, 2 * 6666)



def _ends(out: Path) -> dict[str, dict]:
    return {p.name: _records(p, RecordType.END)[0] for p in sorted(out.glob("*.mtc"))}


def test_children_of_children_by_posix_spawn_are_each_traced_from_their_first_line(compile_c, tmp_path: Path) -> None:
    # peer_fork chain: a posix_spawn child that makes 1 x 7,272 B and posix_spawns a grandchild
    # making 2 x 6,666 B; each lives about a millisecond.  Each waits at the hold until traced.
    exe = compile_c("peer_fork")
    out = tmp_path / "c"
    r = run_memtrace("malloc", "--device", "local", "--follow-children", "--stack-threshold", "0",
                     "--out", out, "--", exe, "chain")
    assert "chain 0" in r.stdout
    ends = _ends(out)
    (child,) = ends["capture.mtc"]["children"]
    assert (child["origin"], child["ended"]) == ("spawn", "target-exited"), child
    (grandchild,) = ends[child["capture"]]["children"]
    assert (grandchild["origin"], grandchild["ppid"], grandchild["ended"]) == ("spawn", child["pid"], "target-exited")
    assert _top_rows(out / child["capture"])["mid_work"] == (1, 7272)
    assert _top_rows(out / grandchild["capture"])["leaf_work"] == (2, 2 * 6666)
    assert sorted(ends) == sorted(["capture.mtc", child["capture"], grandchild["capture"]])
    shown = run_memtrace("show", out).stdout
    assert f"\n  pid {child['pid']} spawn /proc/self/exe: target-exited -> {child['capture']}\n" in shown
    assert f"\n    pid {grandchild['pid']} spawn /proc/self/exe: target-exited -> {grandchild['capture']}\n" in shown
    doc = memtrace_json("show", out)
    (c,) = doc["processes"]
    assert (c["pid"], c["capture"], c["children"][0]["pid"], c["children"][0]["capture"]) == (
        child["pid"], child["capture"], grandchild["pid"], grandchild["capture"])
    # report too: the program, its child under it, the grandchild under that, each with its capture.
    run_memtrace("report", out)
    (tree,) = json.loads((out / "report.json").read_text())["processes"]
    (c,) = tree["children"]
    (g,) = c["children"]
    assert (tree["path"], c["capture"], g["capture"]) == ("capture.mtc", child["capture"], grandchild["capture"])
    assert (c["figures"], g["figures"]) == ("malloc: 7.1 KB in 1 calls", "malloc: 13.0 KB in 2 calls")
    text = (out / "REPORT.md").read_text()
    assert (f"\n  - pid {child['pid']} spawn `/proc/self/exe`: target-exited → `{child['capture']}` "
            f"(malloc: 7.1 KB in 1 calls)\n    - pid {grandchild['pid']} spawn `/proc/self/exe`: target-exited → "
            f"`{grandchild['capture']}` (malloc: 13.0 KB in 2 calls)\n") in text


def test_an_end_names_a_capture_file_only_if_it_exists(compile_c, tmp_path: Path) -> None:
    # The grandchild is a static executable (no dynamic loader, so no hold) living a millisecond:
    # it is gone before it can be attached to, and its capture is discarded.  Before, the
    # child's END (written while the grandchild's follow was still trying) named that file.
    exe = compile_c("peer_fork")
    static = compile_c("peer_fork", "-static")
    out = tmp_path / "c"
    r = run_memtrace("malloc", "--device", "local", "--follow-children", "--stack-threshold", "0",
                     "--out", out, "--", exe, "chain", static)
    assert "chain 0" in r.stdout
    ends = _ends(out)
    (child,) = ends["capture.mtc"]["children"]
    (grandchild,) = ends[child["capture"]]["children"]
    assert grandchild["path"] == str(static)
    named = [c["capture"] for e in ends.values() for c in e.get("children") or [] if c.get("capture")]
    assert all((out / n).is_file() for n in named), (named, sorted(ends))
    if "capture" not in grandchild:          # (attached in time on a fast machine: then it exists)
        assert grandchild["ended"] == "not-followed" and grandchild["reason"].startswith("could not follow")
        shown = run_memtrace("show", out).stdout.replace("\n", "")        # (the console wraps long lines)
        assert f"pid {grandchild['pid']} spawn {static}: not-followed (no capture)" in shown
    for line in r.stderr.splitlines():       # a message names a file only once it exists
        for word in line.split():
            if word.endswith(".mtc"):
                assert (out / word).is_file(), line


def test_the_image_a_forked_child_execs_is_traced(compile_c, tmp_path: Path) -> None:
    # Before, it was announced as "exec-PID.mtc", a file that never existed.
    exe = compile_c("peer_fork")
    out = tmp_path / "c"
    run_memtrace("malloc", "--device", "local", "--quiet", "--follow-children", "--stack-threshold", "0",
                 "--out", out, "--", exe, "exec")
    end = _records(out / "capture.mtc", RecordType.END)[0]
    (child,) = end["children"]
    child_end = _records(out / child["capture"], RecordType.END)[0]
    followed = child_end["evidence"]["exec"]["followed"]
    assert (out / followed).exists()
    assert _top_rows(out / followed)["leaf_work"] == (2, 2 * 6666)
    # show presents the process with its children, and theirs.
    shown = run_memtrace("show", out).stdout
    assert f"pid {child['pid']} fork: target-exited -> {child['capture']}" in shown
    assert f"pid {child['pid']} exec /proc/self/exe: replaced it -> {followed}" in shown


def test_the_hold_leaves_the_programs_environment_as_it_was(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MEMTRACE_TEST_MARK": "kept"}
    r = subprocess.run([sys.executable, "-m", "memtrace.cli", "malloc", "--device", "local", "--quiet",
                        "--out", str(tmp_path / "c"), "--", "env"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr
    names = {line.split("=", 1)[0] for line in r.stdout.splitlines() if "=" in line}
    assert "MEMTRACE_TEST_MARK" in names
    assert not names & {"LD_AUDIT", "MEMTRACE_HOLD", "MEMTRACE_HOLD_CHILDREN"}
    assert _records(tmp_path / "c" / "capture.mtc", RecordType.RECON)[0]["hold"] == {"held": True}


def _gcc_compiles_small_c(tmp_path: Path, *flags: str) -> tuple[Path, dict]:
    """gcc -c on a one-line file under memtrace: the capture directory and its END record."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    src = tmp_path / "small.c"
    src.write_text("int twice(int x) { return 2 * x; }\n")
    out = tmp_path / "c"
    run_memtrace("malloc", "--device", "local", "--quiet", *flags, "--out", out, "--", gcc, "-c", src,
                 "-o", tmp_path / "small.o")
    assert (tmp_path / "small.o").exists()
    return out, _records(out / "capture.mtc", RecordType.END)[0]


@pytest.mark.slow
def test_a_compiler_drivers_children_are_each_traced(tmp_path: Path) -> None:
    # gcc runs cc1 and as (vfork + exec: only the first of them was ever noticed, and neither
    # lived long enough to be attached to): each is now a capture of its own, listed under gcc.
    out, end = _gcc_compiles_small_c(tmp_path, "--follow-children")
    by_tool = {Path(c["path"]).name: c for c in end["children"] if c.get("path")}
    for tool in ("cc1", "x86_64-linux-gnu-as") if "x86_64-linux-gnu-as" in by_tool else ("cc1", "as"):
        child = by_tool[tool]
        assert child["ended"] == "target-exited" and (out / child["capture"]).exists(), child
        s = memtrace_json("show", out / child["capture"])
        assert s["alloc_calls"] > 0 and s["gross_bytes"] > 0
    shown = run_memtrace("show", out).stdout
    assert "cc1: target-exited -> child-" in shown.replace("\n", "")



@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_compiler_drivers_grandchild_the_linker_is_traced(tmp_path: Path) -> None:
    # gcc compiling and linking: cc1, as and collect2 under gcc, ld under collect2 (a child of a
    # child, by vfork + exec): each a capture of its own, shown and reported as that tree.
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    src = tmp_path / "main.c"
    src.write_text("int main(void) { return 0; }\n")
    out = tmp_path / "c"
    run_memtrace("malloc", "--device", "local", "--quiet", "--follow-children", "--out", out, "--", gcc, src,
                 "-o", tmp_path / "main", timeout=360)
    assert subprocess.run([str(tmp_path / "main")], timeout=30).returncode == 0
    tree = memtrace_json("show", out)["processes"]
    by_tool = {Path(c["path"]).name: c for c in tree}
    assert {"cc1", "collect2"} <= set(by_tool) and any(t.endswith("as") for t in by_tool), tree
    (ld,) = by_tool["collect2"]["children"]
    assert Path(ld["path"]).name.startswith("ld") and ld["ended"] == "target-exited", ld
    assert ld["ppid"] == by_tool["collect2"]["pid"]
    linked = memtrace_json("show", out / ld["capture"])
    assert linked["alloc_calls"] > 0 and linked["gross_bytes"] > 0
    run_memtrace("report", out)
    (root,) = json.loads((out / "report.json").read_text())["processes"]
    collect2 = next(c for c in root["children"] if Path(c["path"]).name == "collect2")
    assert [c["capture"] for c in collect2["children"]] == [ld["capture"]]


def test_every_vfork_exec_is_noticed_once_and_only_when_it_happened(tmp_path: Path) -> None:
    # gcc (libiberty's pex: vfork, then execvp over PATH): before, only cc1 was noticed; a
    # failed execvp attempt must not be a child.
    out, end = _gcc_compiles_small_c(tmp_path)
    tools = sorted(Path(c["path"]).name for c in end["children"])
    assert len(tools) == 2 and tools[0].endswith("as") and tools[1] == "cc1", end["children"]
    assert all(c["origin"] == "spawn" for c in end["children"])
    assert all(os.path.exists(c["path"]) for c in end["children"])
