"""Shared fixtures: real programs built once per session, real captures on the local device."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# A test still running after this long is named on stderr (and again every period) by the process
# that reports results -- under xdist the controller, which sees every worker's tests start and end.
# pytest-timeout (600 s, thread method) fails a hung test by ending its worker; this says which test
# it was even when the whole run is cut short from outside (CI's total budget), where a plain `-q`
# log would show only dots.
SLOW_TEST_NOTICE_S = float(os.environ.get("MEMTRACE_SLOW_TEST_NOTICE_S", "300"))


class _SlowTestWatch:
    def __init__(self) -> None:
        self.running: dict[str, float] = {}
        self.lock = threading.Lock()
        self.started = time.monotonic()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        with self.lock:
            self.running[nodeid] = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        with self.lock:
            self.running.pop(nodeid, None)

    def watch(self) -> None:
        noticed: dict[str, float] = {}
        while True:
            time.sleep(min(15.0, SLOW_TEST_NOTICE_S))
            now = time.monotonic()
            with self.lock:
                long_ones = [(n, now - t) for n, t in self.running.items() if now - t >= SLOW_TEST_NOTICE_S]
            for nodeid, age in long_ones:
                if now - noticed.get(nodeid, 0.0) >= SLOW_TEST_NOTICE_S:
                    noticed[nodeid] = now
                    print(f"\n[still running after {age:.0f} s, {(now - self.started) / 60:.0f} min into the run] "
                          f"{nodeid}", file=sys.__stderr__, flush=True)


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background of a non-interactive shell (`make test &`, nohup, some CI
    # runners) inherits SIGINT ignored, and an ignored signal stays ignored across exec: every
    # memtrace a test starts would then ignore the Ctrl-C the test sends it (and Python installs no
    # KeyboardInterrupt handler).  The tests' processes take Ctrl-C as a terminal's user would.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(config, "workerinput"):
        return      # an xdist worker: its controller watches
    watch = _SlowTestWatch()
    config.pluginmanager.register(watch, "memtrace-slow-test-watch")
    threading.Thread(target=watch.watch, name="slow-test-watch", daemon=True).start()


def _programs_running_from(root: Path) -> dict[int, str]:
    """The processes on this machine whose executable lies under `root` (pid -> path).  Read from
    any thread's /proc entry: a process whose main thread exited (a zombie leader) still runs its
    other threads, and has no executable of its own to show."""
    found: dict[int, str] = {}
    prefix = f"{root}/"
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            tasks = os.listdir(f"/proc/{entry.name}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                exe = os.readlink(f"/proc/{entry.name}/task/{tid}/exe")
            except OSError:
                continue
            if exe.startswith(prefix):
                found[int(entry.name)] = exe
            break
    return found


@pytest.fixture(scope="module", autouse=True)
def no_program_left_running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test module leaves none of the programs it built running (they live under this worker's
    base temporary folder): one left spinning -- the stop-shapes test's, two busy threads, for the
    rest of every suite run in round 26 -- loads the machine every later test runs on.  Killed and
    named here, as an error of the module's last test."""
    if sys.platform != "linux":
        yield
        return
    root = tmp_path_factory.getbasetemp()
    before = set(_programs_running_from(root))
    yield
    deadline = time.monotonic() + 5.0       # a kill in a teardown may take a moment to show
    while True:
        left = {pid: exe for pid, exe in _programs_running_from(root).items() if pid not in before}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"programs this module started are still running: {left}"


ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
CFLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-pthread", "-rdynamic",
          "-fno-optimize-sibling-calls"]


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bin")


@pytest.fixture(scope="session")
def demo_bin(build_dir: Path) -> Path:
    """The bundled demo programs and the Darwin stand-in library, built with frame pointers."""
    out = build_dir / "demo"
    subprocess.run(["make", "-s", "-C", str(ROOT / "demo"), f"OUT={out}"], check=True)
    return out


@pytest.fixture(scope="session")
def compile_c(build_dir: Path) -> Callable[..., Path]:
    """Compile tests/programs/NAME.c (once per set of extra flags) and return the executable."""
    built: dict[tuple[str, ...], Path] = {}

    def compile_one(name: str, *extra: str) -> Path:
        key = (name, *extra)
        if key not in built:
            # Each variant in a folder of its own: the file keeps NAME (tests read it as the module's
            # name in frames) and one variant never overwrites another.
            folder = build_dir / f"variant{len(built)}" if extra else build_dir
            folder.mkdir(exist_ok=True)
            exe = folder / name
            subprocess.run(["gcc", *CFLAGS, "-o", str(exe), str(PROGRAMS / f"{name}.c"), *extra], check=True)
            built[key] = exe
        return built[key]

    return compile_one


def build_ctor_user(build_dir: Path) -> Path:
    """tests/programs/ctor_user linked against libctor_lib.so, whose constructor allocates 12,345 B."""
    lib = build_dir / "libctor_lib.so"
    exe = build_dir / "ctor_user"
    flags = ["-g", "-fno-omit-frame-pointer"]
    subprocess.run(["gcc", *flags, "-shared", "-fPIC", "-o", str(lib), str(ROOT / "tests/programs/ctor_lib.c")],
                   check=True)
    subprocess.run(["gcc", *flags, "-o", str(exe), str(ROOT / "tests/programs/ctor_user.c"), "-L", str(build_dir),
                    "-lctor_lib", f"-Wl,-rpath,{build_dir}"], check=True)
    return exe


def run_memtrace(*args: str | Path, timeout: float = 120, check: bool = True,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, exactly as a user runs it."""
    cmd = [sys.executable, "-m", "memtrace.cli", *[str(a) for a in args]]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"memtrace {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def wait_streaming(capture: Path, timeout: float = 60.0) -> None:
    """Wait until a running capture holds the agent's first batch (so its hooks are in)."""
    import time

    from memtrace.capture import CaptureError, CaptureInfo, RecordType, read_records

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if any(r.type == RecordType.BATCH for r in read_records(capture, CaptureInfo(capture))):
                return
        except (OSError, CaptureError):
            pass          # not created, or its header not written yet
        time.sleep(0.05)
    raise AssertionError(f"no batch in {capture} after {timeout} s")


def memtrace_json(*args: str | Path, timeout: float = 120) -> dict:
    proc = run_memtrace(args[0], "--json", *args[1:], timeout=timeout)
    return json.loads(proc.stdout)


@pytest.fixture
def memtrace() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_memtrace


@pytest.fixture
def memtrace_json_fixture() -> Callable[..., dict]:
    return memtrace_json


def frame_names(frames: list[dict]) -> list[str]:
    """``function (module)`` of each JSON frame object (the console's frame text without file:line)."""
    from memtrace.frames import Frame

    return [Frame.from_json(f).name() for f in frames]

