"""``memtrace doctor``: can memtrace work here?  Host, device, and inside a target.

Every check is a :class:`Check` row: a section (host, device, target), what was checked, a
status and a one-line detail.  ``fail`` means a tracer cannot work and makes the command exit
1; ``warn`` is a limitation worth knowing; ``skip`` is a check that does not apply.

Inside the target (a harmless local program, ``sleep``, unless --app/--pid/--name/-- PROGRAM
names one), every registered tracer's agent is loaded in turn: its ``init`` recon says which
hook points are found or MISSING, a short install (start, then stop) says which fail to
attach, the malloc agent's self-test checks the counts and one stack of a known pattern, and
the purgeable routing probe runs where its entry points exist.

DEVICE-UNVERIFIED: on an iPhone the self-test's calls reach memtrace through malloc_logger, and
the jailbreak / lockdown / developer-mode rows read Frida's system parameters and pymobiledevice3;
all of it is tested on the local device and, for lockdown, with a fake at that boundary.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import queue
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memtrace import devices, tracers
from memtrace.errors import MemtraceError
from memtrace.errors import first_line as _first_line
from memtrace.exact import exact_int
from memtrace.target import TargetSpec

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
SECTIONS = ("host", "device", "stock iPhone", "target")
# Tracers whose entry points exist only on Darwin: missing elsewhere is expected, not a failure.
SELF_TEST_CALLS = 1000
SELF_TEST_SIZE = 65536 + 1000       # stacked and live at the default thresholds, unlike anything else
CAP_SYS_PTRACE = 19


@dataclass
class Check:
    section: str
    name: str
    status: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def add(self, section: str, check: str, status: str, detail: str, /, **data: Any) -> Check:
        c = Check(section, check, status, detail, data)
        self.checks.append(c)
        # Shown by section (the frida-server row is learnt inside the target, shown with the device).
        self.checks.sort(key=lambda x: SECTIONS.index(x.section))
        return c

    @property
    def ok(self) -> bool:
        return not any(c.status == FAIL for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "doctor", "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


# ---- host ---------------------------------------------------------------------------------------


def host_checks(report: Report, local: bool) -> None:
    import frida

    report.add("host", "frida", OK, f"frida {frida.__version__} (Python {sys.version.split()[0]})",
               version=frida.__version__)
    status, detail, tools = frida_tools_check()
    report.add("host", "frida-tools", status, detail, version=tools)
    if local and sys.platform.startswith("linux"):
        status, detail = ptrace_verdict(_read("/proc/sys/kernel/yama/ptrace_scope"), os.geteuid(),
                                        _cap_eff(_read("/proc/self/status")))
        report.add("host", "ptrace", status, detail)
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler:
        report.add("host", "CModule compiler", OK, f"{compiler} (Frida's external toolchain, used first for "
                                                   f"a local Linux target; TinyCC otherwise)", path=compiler)
    else:
        report.add("host", "CModule compiler", OK, "TinyCC only (Frida's built-in compiler; no gcc/cc on PATH)")


def frida_tools_check() -> tuple[str, str, str | None]:
    """frida-tools is a dependency, not a convenience: every Frida call of a capture runs on its
    ``frida_tools.application.Reactor`` (memtrace.frida_host).  Status, detail, installed version."""
    try:
        version: str | None = importlib.metadata.version("frida-tools")
    except importlib.metadata.PackageNotFoundError:
        version = None
    import_error = None
    if version is not None:
        try:
            from frida_tools.application import Reactor  # noqa: F401 -- what FridaHost runs on
        except ImportError as e:
            import_error = _first_line(e)
    status, detail = frida_tools_verdict(version, import_error, _required_minimum("frida-tools"))
    return status, detail, version


def frida_tools_verdict(version: str | None, import_error: str | None, minimum: str | None) -> tuple[str, str]:
    """Whether frida-tools can serve FridaHost: installed, at least memtrace's minimum, and its
    Reactor importable."""
    need = f"frida-tools>={minimum}" if minimum else "frida-tools"
    if version is None:
        return FAIL, (f"not installed: memtrace runs every Frida call on frida-tools' Reactor "
                      f"(pip install '{need}')")
    if minimum is not None and _version_key(version) < _version_key(minimum):
        return FAIL, f"frida-tools {version} is older than memtrace needs ({need}): pip install '{need}'"
    if import_error is not None:
        return FAIL, f"frida-tools {version}: frida_tools.application.Reactor cannot be imported ({import_error})"
    return OK, f"frida-tools {version} (its Reactor runs memtrace's Frida calls)"


def _required_minimum(dist: str) -> str | None:
    """The lowest version of ``dist`` memtrace's own metadata asks for (``dist>=X``), if any."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for req in importlib.metadata.requires("memtrace") or []:
            name = re.match(rf"{re.escape(dist)}\s*(?:\[[^]]*\])?\s*([^;]*)", req)
            if name is None or re.match(r"[A-Za-z0-9_.-]", name.group(1)[:1]):
                continue            # another distribution whose name starts with dist's
            low = re.search(r">=\s*([0-9][0-9.]*)", name.group(1))
            return low.group(1).rstrip(".") if low else None
    return None


def _version_key(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string (``14.13.0`` -> (14, 13, 0); ``15.0rc1`` -> (15, 0))."""
    parts = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() != len(piece):
            break
    return tuple(parts)


def ptrace_verdict(scope_text: str | None, euid: int, cap_eff: int) -> tuple[str, str]:
    """Whether Frida may attach, from Yama's ptrace_scope, the user and CAP_SYS_PTRACE."""
    privileged = euid == 0 or bool(cap_eff >> CAP_SYS_PTRACE & 1)
    who = "root" if euid == 0 else "CAP_SYS_PTRACE" if privileged else "an unprivileged user"
    if scope_text is None:
        return OK, "no Yama ptrace restriction"
    scope = scope_text.strip()
    if scope == "0":
        return OK, "ptrace_scope 0: any process of the same user can be attached"
    if scope == "1":
        if privileged:
            return OK, f"ptrace_scope 1, running as {who}: attach is allowed"
        return WARN, ("ptrace_scope 1: memtrace can trace programs it starts (-- PROGRAM), but --pid/--name "
                      "need root or CAP_SYS_PTRACE")
    if scope == "2":
        if privileged:
            return OK, f"ptrace_scope 2 (admin only), running as {who}: attach is allowed"
        return FAIL, "ptrace_scope 2: only root or CAP_SYS_PTRACE may attach; run memtrace as root"
    if scope == "3":
        return FAIL, "ptrace_scope 3: ptrace is disabled until reboot; no tracer can attach"
    return WARN, f"ptrace_scope {scope}: unknown value"


def _cap_eff(status_text: str | None) -> int:
    for line in (status_text or "").splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


# ---- device -------------------------------------------------------------------------------------


def lockdown_api() -> Callable[[str], Any]:
    """pymobiledevice3's lockdown client factory (the boundary the tests replace)."""
    from pymobiledevice3.lockdown import create_using_usbmux

    from memtrace.launchers import NO_AUTOPAIR

    return lambda udid: create_using_usbmux(serial=udid, **NO_AUTOPAIR)


def device_checks(report: Report, device: Any, lockdown: Callable[[str], Any] | None = None,
                  dvt: Callable[[str], Any] | None = None, symbols: Callable[[str], Any] | None = None
                  ) -> str | None:
    """Who the device is and what it allows; returns its platform (darwin, linux, ...)."""
    report.add("device", "device", OK, f"{device.name} ({device.type}, id {device.id})",
               id=device.id, type=device.type, name=device.name)
    try:
        params = device.query_system_parameters()
    except Exception as e:  # noqa: BLE001 -- any Frida error here is the finding itself
        if device.type == "usb":
            # A stock iPhone has no frida-server: the jailbroken path is out, the stock one is checked next.
            report.add("device", "frida-server", WARN, f"no frida-server answers ({_first_line(e)}): not jailbroken? "
                                                       "the stock-iPhone commands are checked below")
        else:
            report.add("device", "system", FAIL, f"cannot query the device: {_first_line(e)}")
        return None
    os_info = params.get("os") or {}
    hardware = params.get("hardware") or {}
    model = hardware.get("product") or hardware.get("model") or params.get("name") or "?"
    platform = params.get("platform")
    report.add("device", "OS and model", OK, f"{os_info.get('name', '?')} {os_info.get('version', '')} "
                                             f"({platform}, {params.get('arch')}), {model}".replace("  ", " "),
               os=os_info, platform=platform, arch=params.get("arch"), model=model)
    access = params.get("access")
    if platform == "darwin" and not devices.is_local(device):
        if access == "full":
            report.add("device", "jailbreak", OK, "full access (jailbroken): system processes and any app")
        else:
            report.add("device", "jailbreak", WARN, f"access {access or 'unknown'} (not jailbroken): only "
                                                    f"debuggable apps, with developer mode on")
    if device.type == "usb":
        _lockdown_checks(report, device.id, lockdown or lockdown_api())
        from memtrace import ios

        launch = (dvt or ios.check_pmd3)(device.id)
        report.add("device", launch.name, OK if launch.ok else WARN, launch.detail)
        shared = (symbols or ios.check_device_symbols)(device.id)
        report.add("device", shared.name, OK if shared.ok else WARN, shared.detail)
    return platform if isinstance(platform, str) else None


def _lockdown_checks(report: Report, udid: str, factory: Callable[[str], Any]) -> None:
    """Lockdown through pymobiledevice3: reachable, what it says the device is, developer mode.
    DEVICE-UNVERIFIED: written against pymobiledevice3's lockdown API, tested with a fake."""
    import asyncio

    from memtrace.launchers import PMD3_TIMEOUTS, _close, bounded

    wait = PMD3_TIMEOUTS["lockdown"]

    async def ask() -> dict[str, Any]:
        client = await bounded(factory(udid), f"lockdown on {udid}", wait)
        try:
            return await values(client)
        finally:
            await _close(client)

    async def values(client: Any) -> dict[str, Any]:
        paired = getattr(client, "paired", None)
        product = await bounded(client.get_value(key="ProductType"), "lockdown", wait)
        version = await bounded(client.get_value(key="ProductVersion"), "lockdown", wait)
        try:
            dev_mode = await bounded(client.get_value(domain="com.apple.security.mac.amfi",
                                                      key="DeveloperModeStatus"), "lockdown", wait)
        except Exception:  # noqa: BLE001 -- older iOS has no developer mode
            dev_mode = None
        return {"product": product, "version": version, "developer_mode": dev_mode, "paired": paired}

    try:
        got = asyncio.run(ask())
    except Exception as e:  # noqa: BLE001 -- unreachable lockdown is the finding
        report.add("device", "lockdown", WARN, f"not reachable through pymobiledevice3: {_first_line(e)} "
                                               f"(--launch pmd3, jetsam --pull and the locked-device check need it)")
        return
    report.add("device", "lockdown", OK, f"reachable: {got['product']}, iOS {got['version']}", **got)
    if got["paired"] is False:
        from memtrace.launchers import NOT_PAIRED_MESSAGE

        report.add("device", "pairing", WARN, NOT_PAIRED_MESSAGE)
    if got["developer_mode"] is None:
        report.add("device", "developer mode", SKIP, "not reported (iOS before 16 has none)")
    else:
        report.add("device", "developer mode", OK if got["developer_mode"] else WARN,
                   "on" if got["developer_mode"] else "off: a jailed device launches no debuggable app without it")


def version_verdict(client: str, server: str) -> tuple[str, str]:
    """frida-server (the agent runtime in the target) against this frida: the major must match."""
    def parts(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

    if server == client:
        return OK, f"{server}, the same as this frida"
    if parts(server)[:1] != parts(client)[:1]:
        return FAIL, f"{server} in the target, {client} here: major versions differ; install frida-server {client}"
    return WARN, f"{server} in the target, {client} here: same major, but matching versions are safer"


# ---- inside the target --------------------------------------------------------------------------


def default_target(device: Any) -> TargetSpec | None:
    """A harmless program to look inside, where there is one: ``sleep`` on this machine."""
    if not devices.is_local(device):
        return None
    sleep = shutil.which("sleep")
    return TargetSpec(device="local", argv=[sleep, "600"]) if sleep else None


def darwin_target_checks(report: Report, device: Any, pid: int, checks: tuple[Callable[..., Any], ...] | None = None
                         ) -> None:
    """What only an iPhone can confirm, asked of the app itself (memtrace.ios): Core Animation's
    hooks, the memory-pressure source, IOSurface's client layer, the runtime facts (UUID, fence,
    task_info count).  A failed one is a warning: the
    tracer still runs, with that part MISSING.  DEVICE-UNVERIFIED: tested with fakes here."""
    from memtrace import ios

    for check in checks or (ios.check_ca_hooks, ios.check_pressure_source, ios.check_iosurface_hooks,
                            ios.check_runtime_facts):
        try:
            c = check(device, pid)
        except Exception as e:  # noqa: BLE001 -- a check that cannot run is its own finding
            report.add("target", getattr(check, "__name__", "device check"), WARN, _first_line(e))
            continue
        report.add("target", c.name, OK if c.ok else WARN, c.detail)


def target_checks(report: Report, target: TargetSpec, rpc_timeout: float = 20.0, platform: str | None = None
                  ) -> None:
    import frida

    try:
        from memtrace.frida_host import FridaHost
    except ImportError as e:        # Frida's bindings broken: the host section says how to fix it (frida-tools
        # is imported at the host's first call, and a failure there is a MemtraceError below)
        report.add("target", "attach", FAIL, f"cannot load an agent: {_first_line(e)}")
        return
    host = FridaHost(target, rpc_timeout)
    try:
        host.open()
        host.launch()
        host.attach()
    except MemtraceError as e:
        report.add("target", "attach", FAIL, f"{target.describe()}: {e}")
        if host.spawned:        # launched, then not attached: not left behind
            host.kill()
        host.close()
        return
    how = host.launched.how if host.launched is not None else "attached"
    report.add("target", "attach", OK, f"{target.describe()} (pid {host.pid}, {how})",
               pid=host.pid)
    resumed = False
    try:
        for tracer in tracers.all_tracers().values():
            resumed = _tracer_checks(report, host, tracer, resumed)
            if not host.alive():
                # What was checked stands; the rest cannot be, and a crash is the finding.
                report.checks = [c for c in report.checks if not c.name.startswith(f"{tracer.name}: ")]
                report.add("target", "target", FAIL, f"the target exited during the {tracer.name} checks; give "
                                                     f"one that keeps running (the rest were not checked)")
                break
        if platform == "darwin" and not host.is_local and host.pid is not None and host.alive():
            darwin_target_checks(report, host.device, host.pid)
    except frida.InvalidOperationError as e:
        report.add("target", "session", FAIL, f"lost the target: {_first_line(e)}")
    finally:
        host.detach()
        if host.spawned:
            host.kill()
        host.close()


def _tracer_checks(report: Report, host: Any, tracer: tracers.Tracer, resumed: bool) -> bool:
    """One tracer's agent: load, recon, install, the checks it declares (malloc's runtime and
    self-test, the probe's result); returns resumed."""
    from memtrace.capture import StackTails

    name, agent = tracer.name, tracer.agent_name
    host.doctor_tails = (StackTails(), [])      # this agent's batches, whole (_whole_stacks): one per agent
    try:
        host.load(agent)
        hello = host.rpc("hello", "hello")
        init = host.rpc("init", "init", {**tracer.agent_config(None, {}), **tracer.doctor_config},
                        host.c_sources(agent))
    except MemtraceError as e:
        report.add("target", f"{name}: agent", FAIL, f"cannot load or initialise: {e}")
        _unload(host)
        return resumed
    if "runtime" in tracer.doctor_checks:
        status, detail = version_verdict(_frida_version(), str(hello.get("fridaVersion")))
        report.add("device", "frida-server", status, f"agent runtime {detail}", version=hello.get("fridaVersion"))
        info = init.get("info") or {}
        fallback = f" (external toolchain failed: {info['toolchainError']})" if info.get("toolchainError") else ""
        report.add("target", "CModule build", OK, f"{name} core compiled with the {info.get('toolchain')} "
                                                  f"toolchain{fallback}", toolchain=info.get("toolchain"))
    warnings = _drain(host)
    try:
        host.rpc("start", "start")
        if not resumed:
            host.resume()
            resumed = True
        time.sleep(0.2)
        messages = _drain(host)
        if "self-test" in tracer.doctor_checks:
            _self_test(report, host)
        if "probe-result" in tracer.doctor_checks:
            _probe_result(report, messages + _drain(host), tracer.name)
        host.rpc("stop", "stop", timeout=10)
        warnings += messages + _drain(host)
    except MemtraceError as e:
        report.add("target", f"{name}: install", FAIL, f"start/stop failed: {e}")
        _unload(host)
        return resumed
    recon = init.get("recon") or []
    failed = sorted({m.group(1) for w in _warnings(warnings) if (m := re.match(r"cannot hook (\S+) at ", w))})
    v = hook_verdict(name, recon, failed, str(hello.get("platform")))
    report.add(v.section, v.name, v.status, v.detail, **v.data)
    _unload(host)
    return resumed


def hook_verdict(tracer: str, recon: list[dict[str, Any]], failed: list[str], platform: str) -> Check:
    """Every hook point of one tracer: found, MISSING, failed to attach; and what that means."""
    points = [{"name": r.get("name"), "module": r.get("module"), "role": r.get("role"),
               "status": "fails to attach" if r.get("name") in failed else
               ("found" if r.get("status") == "found" else "missing")} for r in recon]
    found = [str(p["name"]) for p in points if p["status"] == "found"]
    missing = [str(p["name"]) for p in points if p["status"] == "missing"]
    registered = tracers.get(tracer)
    hooks = registered.hooks_platform if registered is not None else None
    native = hooks is None or platform == hooks
    counts = f"{len(found)} found, {len(missing)} missing, {len(failed)} fail to attach"
    if failed:
        status, detail = FAIL, f"{counts}: cannot hook {', '.join(failed)}"
    elif not found and points:
        status = FAIL if native else SKIP
        detail = f"no hook point found ({', '.join(missing)})" if native else \
            f"Darwin entry points, absent on {platform} (expected)"
    elif missing:
        status = WARN if native else SKIP
        detail = f"{counts}; missing: {', '.join(missing)}" if native else \
            f"{counts}; Darwin entry points absent on {platform}: {', '.join(missing)}"
    else:
        status, detail = OK, counts
    return Check("target", f"{tracer}: hook points", status, detail, {"points": points})


def _self_test(report: Report, host: Any) -> None:
    """N malloc calls of a known size from a named C function: exact count, one stack, found in it."""
    from memtrace import layout
    from memtrace.agentbuild import cmodule_dir
    from memtrace.capture import AggRecord, AllocRecord, StackRecord, decode_agent_records

    host.rpc("flush", "flush")
    before = _counters(_drain(host))
    source = (cmodule_dir() / "selftest.c").read_text(encoding="utf-8")
    try:
        res = host.rpc("self-test", "selfTest", SELF_TEST_CALLS, SELF_TEST_SIZE, source)
        host.rpc("flush", "flush")
    except MemtraceError as e:
        report.add("target", "self-test", FAIL, f"could not run: {e}")
        return
    messages = _drain(host)
    after = _counters(messages)
    malloc_calls = layout.calls_at("malloc")
    calls = (after[malloc_calls] - before[malloc_calls]) if after and before else None
    allocs: list[AllocRecord] = []
    totals: dict[int, dict[str, int]] = {}
    stacks: dict[int, tuple[int, ...]] = {}
    for data in _batches(messages):
        for r in decode_agent_records(data):
            if isinstance(r, AllocRecord) and r.size == SELF_TEST_SIZE:
                allocs.append(r)        # --events: one record per allocation
            elif isinstance(r, AggRecord):
                totals.setdefault(r.stack_id, {}).update(r.values)
            elif isinstance(r, StackRecord):
                stacks[r.stack_id] = r.frames
    # The aggregate core: each stack's running totals; the self-test's stack holds nothing but its blocks.
    sized = {sid: v["allocs"] for sid, v in totals.items()
             if v.get("allocs") and v.get("bytes") == v["allocs"] * SELF_TEST_SIZE}
    recorded = len(allocs) if allocs else sum(sized.values())
    fn = int(str(res.get("function")), 16)
    ids = {a.stack_id for a in allocs} if allocs else set(sized)
    in_fn = [sid for sid in ids if any(0 <= f - fn < 4096 for f in stacks.get(sid, ())[:4])]
    summary: dict[str, Any] = {"expected_calls": SELF_TEST_CALLS, "counted_calls": calls, "recorded": recorded, "stacks": len(ids),
            "stack_in_function": bool(in_fn), "rc": res.get("rc")}
    problems = []
    if res.get("rc") != 0:
        problems.append(f"the test thread failed (rc {res.get('rc')})")
    if calls != SELF_TEST_CALLS:
        problems.append(f"counted {calls} malloc calls, expected {SELF_TEST_CALLS}")
    if recorded != SELF_TEST_CALLS:
        problems.append(f"recorded {recorded} allocations of {SELF_TEST_SIZE} B, expected {SELF_TEST_CALLS}")
    if len(ids) != 1 or not in_fn:
        problems.append(f"{len(ids)} stack(s), {'none' if not in_fn else 'one'} through memtrace_doctor_selftest")
    if problems:
        report.add("target", "self-test", FAIL, "; ".join(problems), **summary)
    else:
        report.add("target", "self-test", OK, f"{SELF_TEST_CALLS} × malloc({SELF_TEST_SIZE}) from "
                                              f"memtrace_doctor_selftest: {calls} counted, {recorded} recorded, "
                                              f"one stack through it", **summary)


def _probe_result(report: Report, messages: list[tuple[str, Any, Any]], tracer: str) -> None:
    results = [p for p in _payloads(messages) if p.get("type") == "result" and p.get("tracer") == tracer]
    if not results:
        report.add("target", "purgeable routing probe", FAIL, "the probe agent sent no result")
        return
    r = results[-1]
    errors = r.get("errors") or []
    if errors and not r.get("rows"):
        report.add("target", "purgeable routing probe", SKIP,
                   f"entry points absent: {str(errors[0]).removeprefix('cannot run: ')}")
        return
    driving = [row.get("entry") for row in r.get("rows") or [] if row.get("drives_state_machine")]
    status = FAIL if errors else OK
    detail = (f"{len(r.get('rows') or [])} entries probed; drive the state machine: {', '.join(driving) or 'none'}"
              + (f"; errors: {'; '.join(map(str, errors))}" if errors else ""))
    report.add("target", "purgeable routing probe", status, detail, rows=r.get("rows"))


# ---- plumbing -----------------------------------------------------------------------------------


def _drain(host: Any, wait: float = 0.2) -> list[tuple[str, Any, Any]]:
    out = []
    while True:
        try:
            out.append(host.events.get(timeout=wait))
        except queue.Empty:
            return _whole_stacks(host, out)
        wait = 0.05


def _whole_stacks(host: Any, messages: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
    """The messages with each batch's STACK_TAIL records made STACK records, as the capture loop does:
    every batch of an agent goes through its one StackTails (_tracer_checks), in order (a tail names
    the stack defined before it, which may have come in a drain the checks threw away).  A batch sent in
    pieces (events:part) becomes whole in its events:batch message; the pieces' data is emptied."""
    from memtrace.capture import StackTails

    state: tuple[StackTails, list[bytes]] | None = getattr(host, "doctor_tails", None)
    if state is None:
        state = host.doctor_tails = (StackTails(), [])
    tails, parts = state
    out = []
    for kind, message, data in messages:
        ptype = (message.get("payload") or {}).get("type") if kind == "message" else None
        if ptype == "events:part":
            parts.append(data or b"")
            data = b""
        elif ptype == "events:batch":
            whole = b"".join([*parts, data or b""])
            parts.clear()
            data = tails.expand(whole) if whole else data
        out.append((kind, message, data))
    return out


def _payloads(messages: list[tuple[str, Any, Any]]) -> Iterator[dict[str, Any]]:
    for kind, message, _ in messages:
        if kind == "message" and isinstance(message, dict) and isinstance(message.get("payload"), dict):
            yield message["payload"]


def _warnings(messages: list[tuple[str, Any, Any]]) -> list[str]:
    return [str(p.get("message")) for p in _payloads(messages) if p.get("type") == "agent:warning"]


def _batches(messages: list[tuple[str, Any, Any]]) -> Iterator[bytes]:
    """Each drain's bytes: _drain joined its pieces and made its stacks whole."""
    for kind, message, data in messages:
        if kind == "message" and (message.get("payload") or {}).get("type") == "events:batch" and data:
            yield data


def _counters(messages: list[tuple[str, Any, Any]]) -> list[int] | None:
    found = None
    for p in _payloads(messages):
        if p.get("type") == "events:batch" and p.get("counters"):
            found = [exact_int(c) for c in p["counters"]]
    return found


def _unload(host: Any) -> None:
    script, host.script = host.script, None
    if script is not None:
        with contextlib.suppress(MemtraceError):
            host.call("unload", script.unload, timeout=5)
    _drain(host, wait=0.05)


def _frida_version() -> str:
    import frida

    return str(frida.__version__)


def run(target: TargetSpec | None, device_spec: str, lockdown: Callable[[str], Any] | None = None) -> Report:
    """Every check, in order: host, device, inside the target."""
    report = Report()
    spec = devices.parse_device_spec(device_spec)
    try:
        device = devices.resolve(spec)
    except MemtraceError as e:
        host_checks(report, local=spec.kind == "local")
        report.add("device", "device", FAIL, str(e))
        return report
    host_checks(report, local=devices.is_local(device))
    platform = device_checks(report, device, lockdown)
    if device.type == "usb":
        from memtrace.dvt.doctor import stock_checks

        stock_checks(report, device.id, target.app if target is not None else None)
        if platform is None:
            return report       # no frida-server: nothing to check inside a target through Frida
    chosen = target or default_target(device)
    if chosen is None:
        report.add("target", "inside a target", SKIP, "name one (--app BUNDLE_ID, --pid N or --name NAME) to check "
                                                      "hook points, the CModule build and the self-test on it")
        return report
    target_checks(report, chosen, platform=platform)
    return report
